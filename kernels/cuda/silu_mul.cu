#include "kernels/cuda/silu_mul.cuh"

#include <algorithm>

#include "kernels/cuda/bf16_device.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/launch_overlap.cuh"

namespace tokenfab::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65536;  // the grid-stride loop covers any n beyond this

__global__ void silu_mul_kernel(float* gate, const float* up, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float g = gate[i];
    gate[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

// gu: (rows, 2·n) f32, each row [gate | up]; out: (rows, n) bf16 bits of silu(gate)·up, computed
// as in silu_mul_kernel.
__global__ void silu_mul_rows_bf16_kernel(const float* gu, int64_t rows, int64_t n,
                                          uint16_t* out) {
  overlap_release();
  overlap_wait();  // everything below reads what earlier kernels wrote
  const int64_t total = rows * n;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += stride) {
    const int64_t r = e / n, i = e % n;
    const float g = gu[r * 2 * n + i];
    const float u = gu[r * 2 * n + n + i];
    out[e] = cuda_detail::to_bf16_bits(g / (1.0f + expf(-g)) * u);
  }
}

}  // namespace

void launch_silu_mul_rows_bf16(const float* gate_up, int64_t rows, int64_t n, uint16_t* out,
                               cudaStream_t stream, bool overlap) {
  if (rows <= 0 || n <= 0) return;
  const int64_t blocks = std::min((rows * n + kThreads - 1) / kThreads, kMaxBlocks);
  launch_kernel(silu_mul_rows_bf16_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads),
                stream, overlap, gate_up, rows, n, out);
}

void launch_silu_mul(float* gate, const float* up, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  const int64_t blocks = std::min((n + kThreads - 1) / kThreads, kMaxBlocks);
  silu_mul_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(gate, up, n);
  TOKENFAB_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tokenfab::kernels
