#pragma once
// Causal grouped-query attention of a chunk of query tokens over one sequence's K/V rows
// (positions 0 .. pos0 + n_tokens - 1 laid out contiguously, one row per position, stored as
// fp16: decode reads the whole cache every step, so its bytes matter as much as the weights').

#include <cstdint>

namespace tokenfab::kernels {

struct AttentionArgs {
  const float* q;      // (n_tokens, n_head, head_dim), q_stride floats between tokens
  int64_t q_stride;
  const uint16_t* k;   // fp16 (positions, n_kv_head, head_dim), kv_stride elements between positions
  const uint16_t* v;   // same layout as k
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

// Work items are (head, token) pairs, head-major: item = h * n_tokens + t, so a contiguous range
// of items shares few kv heads. `scratch` holds attention_scratch_floats(a) floats (per calling
// thread): the scores, and for multi-token chunks an f32 copy of the kv head's K and V rows,
// converted once and read by every query of the group.
int64_t attention_scratch_floats(const AttentionArgs& a);
void attention(const AttentionArgs& a, int64_t item_begin, int64_t item_end, float* scratch);
void attention_scalar(const AttentionArgs& a, int64_t item_begin, int64_t item_end, float* scratch);
void attention_avx2(const AttentionArgs& a, int64_t item_begin, int64_t item_end, float* scratch);
bool attention_avx2_supports(int head_dim);

}  // namespace tokenfab::kernels
