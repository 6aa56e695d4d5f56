#include "kernels/cuda/softcap.cuh"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/launch_overlap.cuh"

namespace tokenfab::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65536;  // the grid-stride loop covers any n beyond this

__global__ void softcap_kernel(float* x, int64_t n, float cap) {
  overlap_release();
  overlap_wait();  // everything below reads what earlier kernels wrote
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    x[i] = cap * tanhf(x[i] / cap);
}

}  // namespace

void launch_softcap(float* x, int64_t n, float cap, cudaStream_t stream, bool overlap) {
  if (!(cap > 0.0f))
    throw std::invalid_argument("launch_softcap: cap " + std::to_string(cap) + " is not positive");
  if (n <= 0) return;
  const int64_t blocks = std::min((n + kThreads - 1) / kThreads, kMaxBlocks);
  launch_kernel(softcap_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), stream,
                overlap, x, n, cap);
}

}  // namespace tokenfab::kernels
