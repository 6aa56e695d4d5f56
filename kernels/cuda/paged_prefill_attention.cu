#include "kernels/cuda/paged_prefill_attention.cuh"

#include <cuda_fp16.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/launch_overlap.cuh"

namespace tokenfab::kernels {

namespace {

constexpr int kWarp = 32;
constexpr int kWarps = 4;
constexpr int kRowsPerWarp = kPrefillQueryTile / kWarps;
constexpr int kPerLane = kPagedDecodeMaxHeadDim / kWarp;

static_assert(kPrefillQueryTile % kWarps == 0, "the query tile splits evenly over the warps");

__device__ float warp_sum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Grid (x: query tile of the chunk, y: query head, z: chunk); kWarps warps. Warp w owns rows
// tile·kPrefillQueryTile + w·kRowsPerWarp + i (i < kRowsPerWarp). Shared memory: one key tile of
// K and of V, (kPrefillKeyTile, head_dim) halves each.
__global__ void paged_prefill_kernel(CudaPagedKv kv, const CudaPrefillChunk* chunks, const float* q,
                                     int64_t q_stride, float* out, int64_t out_stride, int n_head,
                                     float scale) {
  __shared__ __half k_tile[kPrefillKeyTile * kPagedDecodeMaxHeadDim];
  __shared__ __half v_tile[kPrefillKeyTile * kPagedDecodeMaxHeadDim];
  overlap_release();
  overlap_wait();  // everything below reads what earlier kernels wrote
  const CudaPrefillChunk chunk = chunks[blockIdx.z];
  const int32_t t0 = static_cast<int32_t>(blockIdx.x) * kPrefillQueryTile;
  if (t0 >= chunk.n_tokens) return;  // a shorter chunk than the longest
  const int head = blockIdx.y;
  const int head_dim = kv.head_dim;
  const int kv_head = head / (n_head / kv.n_kv_head);
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;

  // This warp's rows: their q, running max, sum and weighted V.
  float qv[kRowsPerWarp][kPerLane];
  float acc[kRowsPerWarp][kPerLane];
  float m[kRowsPerWarp];
  float l[kRowsPerWarp];
  int32_t last_key[kRowsPerWarp];  // the row's own position (−1: no such row)
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int32_t t = t0 + warp * kRowsPerWarp + i;
    last_key[i] = t < chunk.n_tokens ? chunk.pos0 + t : -1;
    m[i] = -INFINITY;
    l[i] = 0.0f;
    const float* qh = q + (chunk.q_row0 + t) * q_stride + static_cast<int64_t>(head) * head_dim;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int d = lane + kWarp * j;
      qv[i][j] = last_key[i] >= 0 && d < head_dim ? qh[d] : 0.0f;
      acc[i][j] = 0.0f;
    }
  }
  // Keys up to the tile's last row's position.
  const int32_t t_end = min(chunk.n_tokens, t0 + kPrefillQueryTile);
  const int32_t n_keys = chunk.pos0 + t_end;
  for (int32_t key0 = 0; key0 < n_keys; key0 += kPrefillKeyTile) {
    const int32_t tile_keys = min(kPrefillKeyTile, n_keys - key0);
    __syncthreads();  // the previous tile has been read
    for (int e = threadIdx.x; e < tile_keys * head_dim; e += blockDim.x) {
      const int32_t pos = key0 + e / head_dim;
      const int d = e % head_dim;
      const int64_t off =
          ((static_cast<int64_t>(chunk.blocks[pos / kv.block_size]) * kv.n_kv_head + kv_head) *
               kv.block_size +
           pos % kv.block_size) *
              head_dim +
          d;
      k_tile[(pos - key0) * head_dim + d] = __ushort_as_half(kv.k[off]);
      v_tile[(pos - key0) * head_dim + d] = __ushort_as_half(kv.v[off]);
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int32_t keys = min(tile_keys, last_key[i] - key0 + 1);  // causal: up to the row itself
      for (int32_t kk = 0; kk < keys; ++kk) {
        const __half* kr = k_tile + kk * head_dim;
        const __half* vr = v_tile + kk * head_dim;
        float dot = 0.0f;
#pragma unroll
        for (int j = 0; j < kPerLane; ++j) {
          const int d = lane + kWarp * j;
          if (d < head_dim) dot = fmaf(qv[i][j], __half2float(kr[d]), dot);
        }
        const float score = warp_sum(dot) * scale;
        const float m_new = fmaxf(m[i], score);
        const float correction = expf(m[i] - m_new);  // 0 for the first key (m = −inf)
        const float p = expf(score - m_new);
        l[i] = l[i] * correction + p;
#pragma unroll
        for (int j = 0; j < kPerLane; ++j) {
          const int d = lane + kWarp * j;
          const float v = d < head_dim ? __half2float(vr[d]) : 0.0f;
          acc[i][j] = fmaf(p, v, acc[i][j] * correction);
        }
        m[i] = m_new;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    if (last_key[i] < 0) continue;
    const int32_t t = t0 + warp * kRowsPerWarp + i;
    float* oh = out + (chunk.q_row0 + t) * out_stride + static_cast<int64_t>(head) * head_dim;
    const float inv = 1.0f / l[i];  // every row attends at least itself
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int d = lane + kWarp * j;
      if (d < head_dim) oh[d] = acc[i][j] * inv;
    }
  }
}

}  // namespace

void launch_paged_prefill_attention(const CudaPagedKv& kv, const CudaPrefillChunk* chunks,
                                    int64_t n_chunks, int32_t max_tokens, const float* q,
                                    int64_t q_stride, float* out, int64_t out_stride, int n_head,
                                    float scale, cudaStream_t stream, bool overlap) {
  const std::string where = "launch_paged_prefill_attention: ";
  check_paged_attention_shape(kv, n_head, "launch_paged_prefill_attention");
  if (n_chunks < 0 || n_chunks > 65535 || max_tokens < 0)
    throw std::invalid_argument(where + std::to_string(n_chunks) + " chunks of up to " +
                                std::to_string(max_tokens) + " tokens (at most 65535 chunks)");
  if (n_chunks == 0 || max_tokens == 0) return;
  const dim3 grid(static_cast<unsigned>((max_tokens + kPrefillQueryTile - 1) / kPrefillQueryTile),
                  static_cast<unsigned>(n_head), static_cast<unsigned>(n_chunks));
  launch_kernel(paged_prefill_kernel, grid, dim3(kWarps * kWarp), stream, overlap, kv, chunks, q,
                q_stride, out, out_stride, n_head, scale);
}

}  // namespace tokenfab::kernels
