#pragma once
// Attention for a batch of sequences whose fp16 K/V live in fixed-size blocks of one shared pool
// (a block table per sequence maps position p to blocks[p / block_size], row p % block_size).
// Decode rows (one query token) are split over kv heads and block ranges ("split-K") and merged
// afterwards, so a batch of short decodes still fills every thread; prefill chunks gather each kv
// head's rows into contiguous f32 once and then run the contiguous-attention loop over them.

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/cpu/thread_pool.h"

namespace tokenfab::kernels {

// One layer of one device's KV pool: fp16, layout (n_blocks, n_kv_head, block_size, head_dim),
// so each (block, kv head) holds block_size contiguous rows of head_dim.
struct PagedKv {
  const uint16_t* k;
  const uint16_t* v;
  int block_size;
  int n_kv_head;
  int head_dim;
};

// One sequence of the batch: its query rows are q rows [q_row, q_row + n_tokens); query token t
// sits at position pos0 + t and attends positions [0, pos0 + t] (causal), whose K/V are in
// blocks[p / block_size] at offset p % block_size. The caller has already written the K/V of
// the query tokens themselves into the pool.
struct PagedSequence {
  const int32_t* blocks;
  int64_t n_tokens;
  int64_t pos0;
  int64_t q_row;
};

// Per-thread scratch, grown as needed and reused between calls.
struct PagedAttentionScratch {
  std::vector<std::vector<float>> per_thread;
  std::vector<float> partials;
};

// q: (rows, n_head, head_dim), q_stride floats between rows; out: same layout, out_stride.
// Query head h reads kv head h / (n_head / kv.n_kv_head). Runs on all threads of `pool`.
void paged_attention(const PagedKv& kv, std::span<const PagedSequence> seqs, const float* q,
                     int64_t q_stride, float* out, int64_t out_stride, int n_head, float scale,
                     ThreadPool& pool, PagedAttentionScratch& scratch);

// The reference: gathers each sequence's K/V into contiguous rows and runs attention_scalar.
void paged_attention_reference(const PagedKv& kv, std::span<const PagedSequence> seqs,
                               const float* q, int64_t q_stride, float* out, int64_t out_stride,
                               int n_head, float scale);

// Building blocks, scalar and AVX2 (paged_attention_avx2.cpp); the AVX2 ones need head_dim 32, 64,
// 96 or 128 (paged_attention_avx2_supports).
//
// k32, v32 ← rows [0, n_rows) of kv head `kv_head`, converted to f32: (n_rows, head_dim) each.
void paged_gather_rows_scalar(const PagedKv& kv, const int32_t* blocks, int kv_head, int64_t n_rows,
                              float* k32, float* v32);
void paged_gather_rows_avx2(const PagedKv& kv, const int32_t* blocks, int kv_head, int64_t n_rows,
                            float* k32, float* v32);
// out (head_dim) = softmax(scale · q·k_p for p < n_pos) · v over contiguous f32 rows (n_pos,
// head_dim); scores holds n_pos floats.
void attend_rows_f32_scalar(const float* q, const float* k32, const float* v32, int64_t n_pos,
                            int head_dim, float scale, float* scores, float* out);
void attend_rows_f32_avx2(const float* q, const float* k32, const float* v32, int64_t n_pos,
                          int head_dim, float scale, float* scores, float* out);
// Split-K decode: the partial records {m, l, o[head_dim]} (attention.h) of the `group` query heads
// q (group, head_dim) of kv head `kv_head` over positions [p0, p1), p0 a multiple of block_size.
// Query head g's record is at rec + g · rec_stride; scratch holds 4 · (p1 − p0) floats.
void paged_decode_partial_avx2(const PagedKv& kv, const int32_t* blocks, int kv_head, int64_t p0,
                               int64_t p1, const float* q, int group, float scale, float* rec,
                               int64_t rec_stride, float* scratch);
bool paged_attention_avx2_supports(int head_dim);

}  // namespace tokenfab::kernels
