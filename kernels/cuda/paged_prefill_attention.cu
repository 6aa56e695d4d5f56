#include "kernels/cuda/paged_prefill_attention.cuh"

#include <cuda_fp16.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/bf16_device.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/launch_overlap.cuh"
#include "kernels/cuda/paged_kv_device.cuh"

namespace tokenfab::kernels {

namespace {

constexpr int kWarp = 32;
constexpr int kWarps = 4;
constexpr int kRowsPerWarp = kPrefillQueryTile / kWarps;
constexpr unsigned kFull = 0xffffffffu;

static_assert(kPrefillQueryTile % kWarps == 0, "the query tile splits evenly over the warps");
static_assert(kPrefillKeyTile == kWarp, "a lane per key of a tile");

__device__ float warp_sum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFull, v, offset);
  return v;
}

__device__ float warp_max(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(kFull, v, offset));
  return v;
}

// Where position pos of a sequence (block table `blocks`) keeps its K (and V) row of kv_head in
// the pool, in elements.
__device__ int64_t pool_row(const CudaPagedKv& kv, const int32_t* blocks, int kv_head,
                            int32_t pos) {
  return cuda_detail::pool_row(blocks[pos / kv.block_size], pos % kv.block_size, kv_head,
                               kv.n_kv_head, kv.block_size, kv.head_dim);
}

// Shared memory of one block, for head_dim d (dynamic: a head of 64 needs a quarter of one of 256):
//   K tile: kPrefillKeyTile rows of k_stride(d) halves — an odd number of 4-byte words per row
//           when d is a multiple of 4, so that the lanes' half2 reads of 32 different rows at the
//           same column fall in 32 different banks;
//   V tile: kPrefillKeyTile rows of d halves;
//   Q tile: kPrefillQueryTile rows of q_stride(d) floats (even, for float2 reads).
__host__ __device__ constexpr int k_stride(int d) {
  return (d + 2) & ~1;
}
__host__ __device__ constexpr int q_stride_of(int d) {
  return (d + 1) & ~1;
}
__host__ __device__ constexpr int64_t align16(int64_t bytes) {
  return (bytes + 15) / 16 * 16;
}
__host__ __device__ constexpr int64_t k_tile_bytes(int d) {
  return align16(int64_t{kPrefillKeyTile} * k_stride(d) * 2);
}
__host__ __device__ constexpr int64_t v_tile_bytes(int d) {
  return align16(int64_t{kPrefillKeyTile} * d * 2);
}
constexpr int64_t shared_bytes(int d) {
  return k_tile_bytes(d) + v_tile_bytes(d) + int64_t{kPrefillQueryTile} * q_stride_of(d) * 4;
}

// Grid (x: query tile of the chunk, y: query head, z: chunk); kWarps warps; shared_bytes(head_dim)
// of dynamic shared memory. Warp w owns rows tile·kPrefillQueryTile + w·kRowsPerWarp + i
// (i < kRowsPerWarp). For each tile of kPrefillKeyTile keys, gathered from the pool into shared
// memory once for the block's rows:
//   1. scores: lane j takes key j of the tile against each of its warp's rows (q from shared
//      memory), so the tile's 32 dot products of a row are computed side by side;
//   2. each row's online softmax moves on by the whole tile at once: the tile's largest score,
//      the rescaling of the row's sum and accumulator, and p_j = exp(score_j − m) per lane;
//   3. Σ p_j·v_j: lane c accumulates head elements c, c + 32, … (P of them), p_j taken from lane j.
// Keys past a row's own position (causal) get p = 0; a row whose keys end before the tile skips it.
// vec: head_dim is a multiple of 8 and both pools are 16-byte aligned (16-byte gathers).
template <int P>
__global__ void __launch_bounds__(kWarps* kWarp)
    paged_prefill_kernel(CudaPagedKv kv, const CudaPrefillChunk* chunks, const float* q,
                         int64_t q_stride, float* out, uint16_t* out16, int64_t out_stride,
                         int n_head, float scale, bool vec) {
  extern __shared__ __align__(16) unsigned char smem[];
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
  const int ks = k_stride(head_dim);
  const int qs = q_stride_of(head_dim);
  __half* k_tile = reinterpret_cast<__half*>(smem);
  __half* v_tile = reinterpret_cast<__half*>(smem + k_tile_bytes(head_dim));
  float* q_tile = reinterpret_cast<float*>(smem + k_tile_bytes(head_dim) + v_tile_bytes(head_dim));

  // The tile's q rows (rows past the chunk and the padding column: zero).
  for (int e = threadIdx.x; e < kPrefillQueryTile * qs; e += blockDim.x) {
    const int r = e / qs;
    const int d = e % qs;
    const int32_t t = t0 + r;
    q_tile[e] = t < chunk.n_tokens && d < head_dim
                    ? q[(chunk.q_row0 + t) * q_stride + static_cast<int64_t>(head) * head_dim + d]
                    : 0.0f;
  }

  // This warp's rows: running max, sum and weighted V (lane holds elements lane + 32·c).
  float acc[kRowsPerWarp][P];
  float m[kRowsPerWarp];
  float l[kRowsPerWarp];
  int32_t last_key[kRowsPerWarp];  // the row's own position (−1: no such row)
  int32_t warp_last = -1;          // the furthest of them
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int32_t t = t0 + warp * kRowsPerWarp + i;
    last_key[i] = t < chunk.n_tokens ? chunk.pos0 + t : -1;
    warp_last = max(warp_last, last_key[i]);
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < P; ++c) acc[i][c] = 0.0f;
  }
  const float* q_rows = q_tile + static_cast<int64_t>(warp) * kRowsPerWarp * qs;

  // Keys up to the tile's last row's position.
  const int32_t t_end = min(chunk.n_tokens, t0 + kPrefillQueryTile);
  const int32_t n_keys = chunk.pos0 + t_end;
  for (int32_t key0 = 0; key0 < n_keys; key0 += kPrefillKeyTile) {
    const int32_t tile_keys = min(kPrefillKeyTile, n_keys - key0);
    __syncthreads();  // the previous tile has been read (and, the first time, q is written)
    if (vec) {
      const int per_row = head_dim / 8;
      for (int e = threadIdx.x; e < tile_keys * per_row; e += blockDim.x) {
        const int r = e / per_row;
        const int c = e % per_row * 8;
        const int64_t off = pool_row(kv, chunk.blocks, kv_head, key0 + r) + c;
        const uint4 kr = *reinterpret_cast<const uint4*>(kv.k + off);
        const uint4 vr = *reinterpret_cast<const uint4*>(kv.v + off);
        uint32_t* kd = reinterpret_cast<uint32_t*>(k_tile + r * ks + c);  // 4-byte aligned
        kd[0] = kr.x;
        kd[1] = kr.y;
        kd[2] = kr.z;
        kd[3] = kr.w;
        *reinterpret_cast<uint4*>(v_tile + r * head_dim + c) = vr;  // 16-byte aligned
      }
    } else {
      for (int e = threadIdx.x; e < tile_keys * head_dim; e += blockDim.x) {
        const int r = e / head_dim;
        const int d = e % head_dim;
        const int64_t off = pool_row(kv, chunk.blocks, kv_head, key0 + r) + d;
        k_tile[r * ks + d] = __ushort_as_half(kv.k[off]);
        v_tile[r * head_dim + d] = __ushort_as_half(kv.v[off]);
      }
    }
    __syncthreads();
    if (warp_last < key0) continue;  // none of this warp's rows reaches the tile

    // 1. Lane j: key key0 + j against each row.
    const bool key_in = lane < tile_keys;
    float s[kRowsPerWarp];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) s[i] = 0.0f;
    if (key_in) {
      const __half* kr = k_tile + lane * ks;
      int d = 0;
      for (; d + 1 < head_dim; d += 2) {
        const float2 kf = __half22float2(*reinterpret_cast<const __half2*>(kr + d));
#pragma unroll
        for (int i = 0; i < kRowsPerWarp; ++i) {
          const float2 qf = *reinterpret_cast<const float2*>(q_rows + i * qs + d);  // broadcast
          s[i] = fmaf(qf.x, kf.x, s[i]);
          s[i] = fmaf(qf.y, kf.y, s[i]);
        }
      }
      if (d < head_dim) {  // an odd head_dim's last element
        const float kf = __half2float(kr[d]);
#pragma unroll
        for (int i = 0; i < kRowsPerWarp; ++i) s[i] = fmaf(q_rows[i * qs + d], kf, s[i]);
      }
    }

    // 2. Each row's softmax over the tile's keys it may see.
    float p[kRowsPerWarp];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      p[i] = 0.0f;
      if (last_key[i] < key0) continue;  // the same for every lane
      const bool valid = key_in && key0 + lane <= last_key[i];
      const float score = valid ? s[i] * scale : -INFINITY;
      const float m_new = fmaxf(m[i], warp_max(score));  // finite: key key0 is valid
      const float correction = expf(m[i] - m_new);       // 0 for the first tile (m = −inf)
      p[i] = valid ? expf(score - m_new) : 0.0f;
      l[i] = l[i] * correction + warp_sum(p[i]);
      m[i] = m_new;
#pragma unroll
      for (int c = 0; c < P; ++c) acc[i][c] *= correction;
    }

    // 3. The tile's V rows weighted by each row's p (p = 0 past a row's own position).
    const int32_t keys = min(tile_keys, warp_last - key0 + 1);
    for (int32_t j = 0; j < keys; ++j) {
      float v[P];
#pragma unroll
      for (int c = 0; c < P; ++c) {
        const int d = lane + kWarp * c;
        v[c] = d < head_dim ? __half2float(v_tile[j * head_dim + d]) : 0.0f;
      }
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) {
        const float pj = __shfl_sync(kFull, p[i], j);
        if (key0 + j > last_key[i]) continue;  // the same for every lane: a key the row can't see
#pragma unroll
        for (int c = 0; c < P; ++c) acc[i][c] = fmaf(pj, v[c], acc[i][c]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    if (last_key[i] < 0) continue;
    const int32_t t = t0 + warp * kRowsPerWarp + i;
    const int64_t at = (chunk.q_row0 + t) * out_stride + static_cast<int64_t>(head) * head_dim;
    const float inv = 1.0f / l[i];  // every row attends at least itself
#pragma unroll
    for (int c = 0; c < P; ++c) {
      const int d = lane + kWarp * c;
      if (d < head_dim) cuda_detail::store_f32_or_bf16(out, out16, at + d, acc[i][c] * inv);
    }
  }
}

// The key-by-key kernel (PrefillAttentionKernel::kKeyByKey), as it ran on the GPU on 2026-12-04
// but for the output's store (f32 or bf16: store_f32_or_bf16) and pool_row (the same address
// arithmetic, written once). Grid and rows as paged_prefill_kernel's; kWarps warps; static shared
// memory: one key tile of K and of V, (kPrefillKeyTile, head_dim) halves each. A lane holds q and
// the weighted V of head elements lane + 32·j (j < kPerLane) of each of its warp's rows; for each
// key of a tile the warp sums the lanes' products into the row's score and moves the row's online
// softmax on by that one key.
// kLimits: the layer's window and soft-cap (CudaPagedKv) apply: each row's keys start at the
// first its window shows (the block's tiles at its first row's), and each score is soft-capped;
// false compiles the kernel of the last GPU run, which reads neither.
constexpr int kPerLane = kPagedDecodeMaxHeadDim / kWarp;

template <bool kLimits>
__global__ void paged_prefill_key_by_key_kernel(CudaPagedKv kv, const CudaPrefillChunk* chunks,
                                                const float* q, int64_t q_stride, float* out,
                                                uint16_t* out16, int64_t out_stride, int n_head,
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
  // A window: the first key a row at position p sees, p − window + 1 (0 for the first ones);
  // the block's first row (the lowest position) sees the earliest.
  const auto first_key = [&](int32_t pos) {
    return kLimits && kv.window > 0 ? max(0, pos - kv.window + 1) : 0;
  };
  const int32_t block_first = first_key(chunk.pos0 + t0);
  for (int32_t key0 = block_first; key0 < n_keys; key0 += kPrefillKeyTile) {
    const int32_t tile_keys = min(kPrefillKeyTile, n_keys - key0);
    __syncthreads();  // the previous tile has been read
    for (int e = threadIdx.x; e < tile_keys * head_dim; e += blockDim.x) {
      const int32_t pos = key0 + e / head_dim;
      const int d = e % head_dim;
      const int64_t off = pool_row(kv, chunk.blocks, kv_head, pos) + d;
      k_tile[(pos - key0) * head_dim + d] = __ushort_as_half(kv.k[off]);
      v_tile[(pos - key0) * head_dim + d] = __ushort_as_half(kv.v[off]);
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int32_t keys = min(tile_keys, last_key[i] - key0 + 1);  // causal: up to the row itself
      // The row's window: keys before its first are skipped (the same for every lane).
      const int32_t skip = kLimits && last_key[i] >= 0 ? max(0, first_key(last_key[i]) - key0) : 0;
      for (int32_t kk = skip; kk < keys; ++kk) {
        const __half* kr = k_tile + kk * head_dim;
        const __half* vr = v_tile + kk * head_dim;
        float dot = 0.0f;
#pragma unroll
        for (int j = 0; j < kPerLane; ++j) {
          const int d = lane + kWarp * j;
          if (d < head_dim) dot = fmaf(qv[i][j], __half2float(kr[d]), dot);
        }
        float score = warp_sum(dot) * scale;
        if constexpr (kLimits) {
          if (kv.softcap > 0.0f) score = kv.softcap * tanhf(score / kv.softcap);
        }
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
    const int64_t at = (chunk.q_row0 + t) * out_stride + static_cast<int64_t>(head) * head_dim;
    const float inv = 1.0f / l[i];  // every row attends at least itself
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int d = lane + kWarp * j;
      if (d < head_dim) cuda_detail::store_f32_or_bf16(out, out16, at + d, acc[i][j] * inv);
    }
  }
}

// Launches paged_prefill_kernel<P> with the dynamic shared memory its head size needs.
template <int P>
void launch_prefill(const CudaPagedKv& kv, const CudaPrefillChunk* chunks, dim3 grid,
                    const float* q, int64_t q_stride, float* out, uint16_t* out16,
                    int64_t out_stride, int n_head, float scale, bool vec, cudaStream_t stream,
                    bool overlap) {
  const int64_t bytes = shared_bytes(kv.head_dim);
  if (bytes > 48 * 1024)  // past the default limit (a head of 256): ask for it
    TOKENFAB_CUDA_CHECK(cudaFuncSetAttribute(paged_prefill_kernel<P>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(bytes)));
  launch_kernel_shared(paged_prefill_kernel<P>, grid, dim3(kWarps * kWarp),
                       static_cast<size_t>(bytes), stream, overlap, kv, chunks, q, q_stride, out,
                       out16, out_stride, n_head, scale, vec);
}

}  // namespace

void launch_paged_prefill_attention(const CudaPagedKv& kv, const CudaPrefillChunk* chunks,
                                    int64_t n_chunks, int32_t max_tokens, const float* q,
                                    int64_t q_stride, float* out, int64_t out_stride, int n_head,
                                    float scale, cudaStream_t stream, bool overlap,
                                    uint16_t* out_bf16, PrefillAttentionKernel kernel) {
  const std::string where = "launch_paged_prefill_attention: ";
  check_paged_attention_shape(kv, n_head, "launch_paged_prefill_attention");
  if (n_chunks < 0 || n_chunks > 65535 || max_tokens < 0)
    throw std::invalid_argument(where + std::to_string(n_chunks) + " chunks of up to " +
                                std::to_string(max_tokens) + " tokens (at most 65535 chunks)");
  if (n_chunks == 0 || max_tokens == 0) return;
  const dim3 grid(static_cast<unsigned>((max_tokens + kPrefillQueryTile - 1) / kPrefillQueryTile),
                  static_cast<unsigned>(n_head), static_cast<unsigned>(n_chunks));
  const bool limits = kv.window > 0 || kv.softcap > 0.0f;  // the tiled kernel declines them
  if (kernel == PrefillAttentionKernel::kKeyByKey || limits) {
    const auto key_by_key =
        limits ? paged_prefill_key_by_key_kernel<true> : paged_prefill_key_by_key_kernel<false>;
    launch_kernel(key_by_key, grid, dim3(kWarps * kWarp), stream, overlap, kv, chunks, q, q_stride,
                  out, out_bf16, out_stride, n_head, scale);
    return;
  }
  const bool vec = kv.head_dim % 8 == 0 && reinterpret_cast<uintptr_t>(kv.k) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(kv.v) % 16 == 0;
  // Head elements per lane: the fewest that cover head_dim (kPagedDecodeMaxHeadDim at most).
  static_assert(kPagedDecodeMaxHeadDim <= 8 * kWarp, "eight elements a lane cover every head");
  const auto launch = kv.head_dim <= kWarp       ? launch_prefill<1>
                      : kv.head_dim <= 2 * kWarp ? launch_prefill<2>
                      : kv.head_dim <= 4 * kWarp ? launch_prefill<4>
                                                 : launch_prefill<8>;
  launch(kv, chunks, grid, q, q_stride, out, out_bf16, out_stride, n_head, scale, vec, stream,
         overlap);
}

}  // namespace tokenfab::kernels
