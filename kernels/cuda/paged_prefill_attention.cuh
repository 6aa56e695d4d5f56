#pragma once
// Causal attention of prompt chunks over the fp16 paged KV pool on the GPU, tiled: a block takes
// kPrefillQueryTile query rows of one head of one chunk and walks the keys in tiles of
// kPrefillKeyTile, each tile of K and V gathered from the pool into shared memory once and read by
// all the block's rows (the decode kernel reads every key once per row). Two kernels walk a tile
// (PrefillAttentionKernel): the tiled one takes one key of the tile a lane, against each of its
// warp's rows, so a tile's scores come out side by side, and each row's online softmax then moves
// on by the whole tile; the key-by-key one (the kernel of the last GPU run, 2026-12-04) has its
// warp score one key at a time (a lane per head element, a warp sum per key) and moves each row's
// softmax on by that key. Either way a lane accumulates head elements lane, lane + 32, … of the
// rows' weighted V. Both mirror kernels::paged_attention (kernels/cpu/paged_attention.h) for
// causal rows, to f32 rounding. A layer with a sliding window or a score soft-cap
// (CudaPagedKv::window, softcap) always takes the key-by-key kernel, in its variant that applies
// them (each row's keys from the first its window shows; not yet run on a GPU): the tiled one
// declines them. Decode rows, verified chains and draft trees go to
// paged_decode_attention.cuh.
// `overlap`: the launch may start while the previous kernel of the stream finishes, and waits
// for it before reading anything (launch_overlap.cuh; compute capability 9.0 or later).

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/paged_decode_attention.cuh"

namespace tokenfab::kernels {

inline constexpr int kPrefillQueryTile = 16;  // query rows per block (4 warps × 4 rows)
inline constexpr int kPrefillKeyTile = 32;    // keys per shared-memory tile

// Which kernel walks a block's key tiles (CudaOptions::tiled_prompt_attention). Their outputs
// agree to f32 rounding: the same online softmax over the same keys in order, with the dot
// products and the softmax sums taken in another order.
enum class PrefillAttentionKernel {
  kKeyByKey,  // a warp scores one key at a time (last run on a GPU: 2026-12-04)
  kTiled,     // a lane per key of the tile, the softmax moving on by the whole tile
};

// One causal chunk, device memory: token t (t < n_tokens) is q row q_row0 + t, at position
// pos0 + t, and attends positions [0, pos0 + t] of the sequence whose block table is `blocks`.
struct CudaPrefillChunk {
  const int32_t* blocks;
  int64_t q_row0;
  int32_t n_tokens;
  int32_t pos0;
};

// q: (q rows, n_head, head_dim) device f32, q_stride floats between rows; out: same layout,
// out_stride. chunks: (n_chunks) device CudaPrefillChunk; max_tokens: the largest n_tokens.
// Query head h reads kv head h / (n_head / kv.n_kv_head). Asynchronous on `stream`. Throws
// std::invalid_argument for a bad shape (head_dim above kPagedDecodeMaxHeadDim, n_head not a
// multiple of n_kv_head, more than 65535 chunks or heads), std::runtime_error if the launch fails.
// With out_bf16 the output goes there instead, as bf16 bits (kernels::fp32_to_bf16's rounding of
// what out would hold), same layout and out_stride, and out is not written. `kernel` picks the
// kernel (PrefillAttentionKernel), but for a layer with a window or a soft-cap (kKeyByKey).
void launch_paged_prefill_attention(
    const CudaPagedKv& kv, const CudaPrefillChunk* chunks, int64_t n_chunks, int32_t max_tokens,
    const float* q, int64_t q_stride, float* out, int64_t out_stride, int n_head, float scale,
    cudaStream_t stream, bool overlap = false, uint16_t* out_bf16 = nullptr,
    PrefillAttentionKernel kernel = PrefillAttentionKernel::kKeyByKey);

}  // namespace tokenfab::kernels
