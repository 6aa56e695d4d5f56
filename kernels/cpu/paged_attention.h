#pragma once
// Attention for a batch of sequences whose fp16 K/V live in fixed-size blocks of one shared pool
// (a block table per sequence maps position p to blocks[p / block_size], row p % block_size).
// Every query row — a decode token or a row of a prefill chunk — is computed the same way: its kv
// head's rows [0, pos] are gathered into f32 (an exact conversion; a lone row reads them in
// place, converted the same way) and one softmax-weighted sum runs over them in position order.
// A row's output therefore depends only on its query and its context: not on the batch around
// it, the chunk it belongs to, or the number of threads. That is what makes greedy outputs
// identical whether a request runs alone, batched with others, prefilled in chunks or on another
// device (the engine's modes). Work items are (sequence, kv head, token range); a prefill item
// gathers its rows once for all its tokens.

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
  // How this layer's queries attend (attention.h's AttentionArgs has the same two): a sliding
  // window (> 0: a row at position p sees only positions (p − window, p]) and a score soft-cap.
  int64_t window = 0;
  float softcap = 0;
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
  // Tree rows (speculative verification of a draft tree), or null for causal rows. Row t's K/V
  // sit at position pos0 + t as usual, but it attends the context [0, pos0) and then only its
  // ancestors and itself: parent[t] is the row it follows (−1: the context; 0 ≤ parent[t] < t
  // otherwise). Its rows are gathered in depth order, so row t computes exactly what the same
  // token computes at position pos0 + depth(t) on a chain (depth: its number of ancestors).
  const int32_t* parent = nullptr;
};

// depth(t) of a tree row (its number of ancestors); t itself for causal rows (parent null).
int64_t paged_row_depth(const PagedSequence& s, int64_t t);

// Per-thread scratch, grown as needed and reused between calls.
struct PagedAttentionScratch {
  std::vector<std::vector<float>> per_thread;
};

// q: (rows, n_head, head_dim), q_stride floats between rows; out: same layout, out_stride.
// Query head h reads kv head h / (n_head / kv.n_kv_head). Runs on all threads of `pool`.
void paged_attention(const PagedKv& kv, std::span<const PagedSequence> seqs, const float* q,
                     int64_t q_stride, float* out, int64_t out_stride, int n_head, float scale,
                     ThreadPool& pool, PagedAttentionScratch& scratch);

// The reference for causal rows (`parent` null): gathers each sequence's K/V into contiguous rows
// and runs attention_scalar. Tree rows are tested against their paths as chains (test_paged).
void paged_attention_reference(const PagedKv& kv, std::span<const PagedSequence> seqs,
                               const float* q, int64_t q_stride, float* out, int64_t out_stride,
                               int n_head, float scale);

// Building blocks, scalar and AVX2 (paged_attention_avx2.cpp); the AVX2 ones need head_dim 32, 64,
// 96, 128 or 256 (paged_attention_avx2_supports).
//
// k32, v32 ← rows [first, n_rows) of kv head `kv_head`, converted to f32: (n_rows − first,
// head_dim) each; `first` is a multiple of the block size.
void paged_gather_rows_scalar(const PagedKv& kv, const int32_t* blocks, int kv_head, int64_t first,
                              int64_t n_rows, float* k32, float* v32);
void paged_gather_rows_avx2(const PagedKv& kv, const int32_t* blocks, int kv_head, int64_t first,
                            int64_t n_rows, float* k32, float* v32);
// out (head_dim) = softmax(scale · q·k_p for p < n_pos) · v over contiguous f32 rows (n_pos,
// head_dim); scores holds n_pos floats. The scalar one soft-caps the scores when softcap > 0.
void attend_rows_f32_scalar(const float* q, const float* k32, const float* v32, int64_t n_pos,
                            int head_dim, float scale, float* scores, float* out,
                            float softcap = 0);
void attend_rows_f32_avx2(const float* q, const float* k32, const float* v32, int64_t n_pos,
                          int head_dim, float scale, float* scores, float* out);
// The `group` query heads of one kv head at once (q and out: `group` heads of head_dim, one after
// the other; scores: group · n_pos floats), each K and V row loaded once for all of them. Equal,
// bit for bit, to attend_rows_f32_avx2 for each head in turn.
void attend_rows_grouped_f32_avx2(const float* q, const float* k32, const float* v32, int64_t n_pos,
                                  int head_dim, int group, float scale, float* scores, float* out);
bool paged_attention_avx2_supports(int head_dim);
// attend_rows_grouped_f32_avx2 over positions [0, n_pos) of kv head `kv_head`, read in place from
// the pool's fp16 blocks instead of a gathered f32 copy (a decode row, which would use its gather
// once): the same result bit for bit. Returns false, computing nothing, where it has no
// specialisation (head_dim, a group of more than 4 heads, a block size not a multiple of 4).
bool attend_paged_in_place_avx2(const PagedKv& kv, const int32_t* blocks, int kv_head,
                                int64_t n_pos, int group, const float* q, float scale,
                                float* scores, float* out);

}  // namespace tokenfab::kernels
