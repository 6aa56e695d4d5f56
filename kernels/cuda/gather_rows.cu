#include "kernels/cuda/gather_rows.cuh"

#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.cuh"

namespace tokenfab::kernels {

namespace {

constexpr int kThreads = 256;

// One block per output row.
__global__ void gather_rows_u16_kernel(const uint16_t* table, int64_t cols, const int32_t* ids,
                                       uint16_t* out) {
  const uint16_t* src = table + static_cast<int64_t>(ids[blockIdx.x]) * cols;
  uint16_t* dst = out + static_cast<int64_t>(blockIdx.x) * cols;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) dst[c] = src[c];
}

__global__ void gather_i32_kernel(const int32_t* table, const int32_t* index, int64_t n,
                                  int32_t* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) out[i] = table[index[i]];
}

}  // namespace

void launch_gather_rows_u16(const uint16_t* table, int64_t cols, const int32_t* ids, int64_t n,
                            uint16_t* out, cudaStream_t stream) {
  if (n < 0 || n > 0x7fffffff || cols <= 0)
    throw std::invalid_argument("launch_gather_rows_u16: bad shape (n " + std::to_string(n) +
                                ", cols " + std::to_string(cols) + ")");
  if (n == 0) return;
  gather_rows_u16_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(table, cols, ids, out);
  TOKENFAB_CUDA_CHECK(cudaGetLastError());
}

void launch_gather_i32(const int32_t* table, const int32_t* index, int64_t n, int32_t* out,
                       cudaStream_t stream) {
  if (n < 0 || n > 0x7fffffff)
    throw std::invalid_argument("launch_gather_i32: bad n " + std::to_string(n));
  if (n == 0) return;
  gather_i32_kernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      table, index, n, out);
  TOKENFAB_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tokenfab::kernels
