#pragma once
// Causal grouped-query attention of a chunk of query tokens over one sequence's K/V rows
// (positions 0 .. pos0 + n_tokens - 1 laid out contiguously, one row per position).

#include <cstdint>

namespace tokenfab::kernels {

struct AttentionArgs {
  const float* q;      // (n_tokens, n_head, head_dim), q_stride floats between tokens
  int64_t q_stride;
  const float* k;      // (positions, n_kv_head, head_dim), kv_stride floats between positions
  const float* v;      // same layout as k
  int64_t kv_stride;
  float* out;          // (n_tokens, n_head, head_dim), out_stride floats between tokens
  int64_t out_stride;
  int64_t n_tokens;
  int64_t pos0;        // position of the first query token
  int n_head;
  int n_kv_head;       // query head h reads kv head h / (n_head / n_kv_head)
  int head_dim;
  float scale;         // usually 1/sqrt(head_dim)
};

// Work items are (token, head) pairs, token-major: item = t * n_head + h. `scores` holds at
// least pos0 + n_tokens floats (per calling thread).
void attention(const AttentionArgs& a, int64_t item_begin, int64_t item_end, float* scores);
void attention_scalar(const AttentionArgs& a, int64_t item_begin, int64_t item_end, float* scores);
void attention_avx2(const AttentionArgs& a, int64_t item_begin, int64_t item_end, float* scores);
bool attention_avx2_supports(int head_dim);

}  // namespace tokenfab::kernels
