#pragma once
// Causal grouped-query attention of a chunk of query tokens over one sequence's K/V rows
// (positions 0 .. pos0 + n_tokens - 1), stored as fp16: decode reads the whole cache every step,
// so its bytes matter as much as the weights'. Head-major layouts (each kv head's rows
// contiguous) make those reads one stream per head.

#include <cstdint>

namespace tokenfab::kernels {

struct AttentionArgs {
  const float* q;      // (n_tokens, n_head, head_dim), q_stride floats between tokens
  int64_t q_stride;
  const uint16_t* k;   // fp16 rows of head_dim elements: row (kv head g, position p) starts at
  const uint16_t* v;   //   g * kv_head_stride + p * kv_stride (same layout for v)
  int64_t kv_stride;
  int64_t kv_head_stride;
  float* out;          // (n_tokens, n_head, head_dim), out_stride floats between tokens
  int64_t out_stride;
  int64_t n_tokens;
  int64_t pos0;        // position of the first query token
  int n_head;
  int n_kv_head;       // query head h reads kv head h / (n_head / n_kv_head)
  int head_dim;
  float scale;         // usually 1/sqrt(head_dim)
  int64_t window = 0;  // > 0: a query at position p attends only (p − window, p] (sliding window)
  float softcap = 0;   // > 0: each score s becomes softcap · tanh(s / softcap) (Gemma 2)
};

// The first position a query at `pos` attends: pos − window + 1 with a window, else 0.
inline int64_t attention_first_position(int64_t pos, int64_t window) {
  return window > 0 && pos >= window ? pos - window + 1 : 0;
}

// The AVX2 kernels compute plain causal attention; a soft-cap, or a window that hides some
// position from some query of the call, takes the scalar ones.
inline bool attention_is_plain(const AttentionArgs& a) {
  return a.softcap == 0 && (a.window == 0 || a.pos0 + a.n_tokens <= a.window);
}

// Work items are (head, token) pairs, head-major: item = h * n_tokens + t, so a contiguous range
// of items shares few kv heads. `scratch` holds attention_scratch_floats(a) floats (per calling
// thread): the scores, and for multi-token chunks an f32 copy of the kv head's K and V rows,
// converted once and read by every query of the group.
int64_t attention_scratch_floats(const AttentionArgs& a);
void attention(const AttentionArgs& a, int64_t item_begin, int64_t item_end, float* scratch);
void attention_scalar(const AttentionArgs& a, int64_t item_begin, int64_t item_end, float* scratch);
void attention_avx2(const AttentionArgs& a, int64_t item_begin, int64_t item_end, float* scratch);
bool attention_avx2_supports(int head_dim);

// Decode (n_tokens == 1) split over kv heads and position ranges ("split-K"), so every thread gets
// an equal share however few kv heads the model has. Item i = kv_head * n_splits + split covers
// positions [n·split/S, n·(split+1)/S) of n = pos0 + 1 for the group's query heads and writes, per
// query head h, the partial softmax record at partials + (h * S + split) * (2 + head_dim):
//   { m = max score, l = Σ exp(score − m), o[head_dim] = Σ exp(score − m) · v }.
// attention_decode_merge() combines the records of all splits into a.out.
int64_t attention_decode_partial_floats(const AttentionArgs& a, int n_splits);
int64_t attention_decode_scratch_floats(const AttentionArgs& a, int n_splits);
void attention_decode_partial(const AttentionArgs& a, int n_splits, int64_t item, float* partials,
                              float* scratch);
void attention_decode_partial_scalar(const AttentionArgs& a, int n_splits, int64_t item,
                                     float* partials, float* scratch);
void attention_decode_partial_avx2(const AttentionArgs& a, int n_splits, int64_t item,
                                   float* partials, float* scratch);
void attention_decode_merge(const AttentionArgs& a, int n_splits, const float* partials);

}  // namespace tokenfab::kernels
