#include "kernels/cuda/rope.cuh"

#include <cuda_fp16.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/launch_overlap.cuh"
#include "kernels/cuda/paged_kv_device.cuh"

namespace tokenfab::kernels {

namespace {

constexpr int kThreads = 128;

// One block per row: the row's cos/sin table (rot_dim / 2 pairs) is built once in shared memory,
// then every (head, pair) of the row is rotated, and with a store (k_pool set) the row's K and V
// heads go into the pool. x: row r at x + r·row_stride, (n_heads, head_dim).
__global__ void rope_kernel(float* x, const int32_t* positions, int64_t row_stride, int n_heads,
                            int head_dim, int rot_dim, float base, RopeKvStore store) {
  __shared__ float cos_t[kRopeMaxRotDim / 2];
  __shared__ float sin_t[kRopeMaxRotDim / 2];
  overlap_release();
  const int half = rot_dim / 2;
  const double pos = static_cast<double>(positions[blockIdx.x]);
  // The CPU's formula and operation order (rope_table): theta in double, rounded to f32 at the end.
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const double theta =
        pos * pow(static_cast<double>(base), -2.0 * i / static_cast<double>(rot_dim));
    cos_t[i] = static_cast<float>(cos(theta));
    sin_t[i] = static_cast<float>(sin(theta));
  }
  // The table needs only the step's uploaded positions: built while the previous kernel finishes.
  overlap_wait();
  __syncthreads();

  float* row = x + static_cast<int64_t>(blockIdx.x) * row_stride;  // (n_heads, head_dim)
  for (int w = threadIdx.x; w < n_heads * half; w += blockDim.x) {
    const int h = w / half;
    const int i = w % half;
    float* v = row + static_cast<int64_t>(h) * head_dim;
    const float a = v[2 * i], b = v[2 * i + 1];
    // Separately rounded products, as the CPU (no fused multiply-add there).
    v[2 * i] = __fsub_rn(__fmul_rn(a, cos_t[i]), __fmul_rn(b, sin_t[i]));
    v[2 * i + 1] = __fadd_rn(__fmul_rn(a, sin_t[i]), __fmul_rn(b, cos_t[i]));
  }
  if (store.k_pool == nullptr) return;
  __syncthreads();  // the row's rotated k, written above by other threads of the block
  const int64_t slot = store.kv_slots[blockIdx.x];
  const int64_t block = slot / store.block_size, within = slot % store.block_size;
  for (int e = threadIdx.x; e < store.n_kv_head * head_dim; e += blockDim.x) {
    const int g = e / head_dim, d = e % head_dim;
    const int64_t dst =
        cuda_detail::pool_row(block, within, g, store.n_kv_head, store.block_size, head_dim) + d;
    store.k_pool[dst] = __half_as_ushort(__float2half_rn(row[store.k_offset + e]));
    store.v_pool[dst] = __half_as_ushort(__float2half_rn(row[store.v_offset + e]));
  }
}

}  // namespace

void launch_rope(float* x, const int32_t* positions, int64_t rows, int64_t row_stride, int n_heads,
                 int head_dim, int rot_dim, float base, cudaStream_t stream, bool overlap,
                 const RopeKvStore* store) {
  if (rot_dim < 0 || rot_dim % 2 != 0 || rot_dim > head_dim || rot_dim > kRopeMaxRotDim)
    throw std::invalid_argument("launch_rope: rot_dim " + std::to_string(rot_dim) +
                                " must be even, at most head_dim (" + std::to_string(head_dim) +
                                ") and at most " + std::to_string(kRopeMaxRotDim));
  if (n_heads < 0 || rows < 0 || row_stride < static_cast<int64_t>(n_heads) * head_dim)
    throw std::invalid_argument("launch_rope: bad shape: rows " + std::to_string(rows) +
                                ", n_heads " + std::to_string(n_heads) + ", head_dim " +
                                std::to_string(head_dim) + ", row_stride " +
                                std::to_string(row_stride));
  if (store != nullptr) {
    const int64_t heads = int64_t{store->n_kv_head} * head_dim;
    if (store->n_kv_head <= 0 || store->block_size <= 0 || store->kv_slots == nullptr ||
        store->k_pool == nullptr || store->v_pool == nullptr || store->k_offset < 0 ||
        store->v_offset < 0 || store->k_offset + heads > row_stride ||
        store->v_offset + heads > row_stride)
      throw std::invalid_argument("launch_rope: the KV store's heads do not fit the rows (k at " +
                                  std::to_string(store->k_offset) + ", v at " +
                                  std::to_string(store->v_offset) + ", " + std::to_string(heads) +
                                  " floats each, rows of " + std::to_string(row_stride) + ")");
  }
  if (rows == 0 || n_heads == 0 || (rot_dim == 0 && store == nullptr)) return;
  if (rows > 0x7fffffff)
    throw std::invalid_argument("launch_rope: " + std::to_string(rows) + " rows exceed one grid");
  launch_kernel(rope_kernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads), stream, overlap, x,
                positions, row_stride, n_heads, head_dim, rot_dim, base,
                store != nullptr ? *store : RopeKvStore{});
}

}  // namespace tokenfab::kernels
