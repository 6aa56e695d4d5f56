#include "kernels/cuda/f32_to_bf16.cuh"

#include <algorithm>

#include "kernels/cuda/bf16_device.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/launch_overlap.cuh"

namespace tokenfab::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65536;  // the grid-stride loop covers any n beyond this

using cuda_detail::to_bf16_bits;

__global__ void f32_to_bf16_kernel(const float* x, uint16_t* y, int64_t n) {
  overlap_release();
  overlap_wait();  // everything below reads what earlier kernels wrote
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = to_bf16_bits(x[i]);
}

}  // namespace

void launch_f32_to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream, bool overlap) {
  if (n <= 0) return;
  const int64_t blocks = std::min((n + kThreads - 1) / kThreads, kMaxBlocks);
  launch_kernel(f32_to_bf16_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), stream,
                overlap, x, y, n);
}

}  // namespace tokenfab::kernels
