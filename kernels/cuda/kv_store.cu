#include "kernels/cuda/kv_store.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <stdexcept>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/launch_overlap.cuh"

namespace tokenfab::kernels {

namespace {

constexpr int kThreads = 128;
constexpr int64_t kMaxGridX = 65535;

// Grid: x over rows (strided), y over kv heads; threads over head_dim.
__global__ void kv_store_kernel(const float* k, const float* v, int64_t row_stride,
                                const int32_t* slots, int64_t n_rows, int n_kv_head, int head_dim,
                                int block_size, uint16_t* k_pool, uint16_t* v_pool) {
  overlap_release();
  overlap_wait();  // everything below reads what earlier kernels wrote
  const int g = static_cast<int>(blockIdx.y);
  for (int64_t r = blockIdx.x; r < n_rows; r += gridDim.x) {
    const int64_t slot = slots[r];
    const int64_t block = slot / block_size, within = slot % block_size;
    const int64_t dst = ((block * n_kv_head + g) * block_size + within) * head_dim;
    const int64_t src = r * row_stride + static_cast<int64_t>(g) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
      k_pool[dst + d] = __half_as_ushort(__float2half_rn(k[src + d]));
      v_pool[dst + d] = __half_as_ushort(__float2half_rn(v[src + d]));
    }
  }
}

}  // namespace

void launch_kv_store_rows(const float* k, const float* v, int64_t row_stride, const int32_t* slots,
                          int64_t n_rows, int n_kv_head, int head_dim, int block_size,
                          uint16_t* k_pool, uint16_t* v_pool, cudaStream_t stream, bool overlap) {
  if (n_rows < 0 || n_kv_head <= 0 || n_kv_head > 65535 || head_dim <= 0 || block_size <= 0 ||
      row_stride < static_cast<int64_t>(n_kv_head) * head_dim)
    throw std::invalid_argument("launch_kv_store_rows: bad shape");
  if (n_rows == 0) return;
  const dim3 grid(static_cast<unsigned>(std::min(n_rows, kMaxGridX)),
                  static_cast<unsigned>(n_kv_head));
  launch_kernel(kv_store_kernel, grid, dim3(kThreads), stream, overlap, k, v, row_stride, slots,
                n_rows, n_kv_head, head_dim, block_size, k_pool, v_pool);
}

}  // namespace tokenfab::kernels
