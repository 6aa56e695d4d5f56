#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_avx2_parts.h"

namespace tokenfab::kernels {

namespace {

using namespace avx2;

// Chunks of at least this many query tokens convert a kv head's K/V rows to f32 once (each row is
// then read by group × n_tokens queries); single-token decode reads the fp16 rows directly.
constexpr int64_t kConvertMinTokens = 4;

template <int NV>
void attention_items(const AttentionArgs& a, int64_t item_begin, int64_t item_end, float* scratch) {
  const int group = a.n_head / a.n_kv_head;
  const int64_t positions = a.pos0 + a.n_tokens;
  float* scores = scratch;
  float* k32 = scratch + positions;                // (positions, head_dim)
  float* v32 = k32 + positions * a.head_dim;       // (positions, head_dim)
  const bool convert = a.n_tokens >= kConvertMinTokens;
  int converted_kvh = -1;
  for (int64_t item = item_begin; item < item_end; ++item) {
    const int h = static_cast<int>(item / a.n_tokens);
    const int64_t t = item % a.n_tokens;
    const int kvh = h / group;
    const int64_t kv_off = static_cast<int64_t>(kvh) * a.kv_head_stride;
    const float* q = a.q + t * a.q_stride + static_cast<int64_t>(h) * a.head_dim;
    float* out = a.out + t * a.out_stride + static_cast<int64_t>(h) * a.head_dim;
    const int64_t n_pos = a.pos0 + t + 1;
    if (convert) {
      if (kvh != converted_kvh) {
        convert_head_rows(a.k + kv_off, a.kv_stride, positions, a.head_dim, k32);
        convert_head_rows(a.v + kv_off, a.kv_stride, positions, a.head_dim, v32);
        converted_kvh = kvh;
      }
      scores_row<NV>(q, k32, a.head_dim, n_pos, a.scale, scores);
      softmax_avx2(scores, n_pos);
      weighted_sum<NV>(scores, v32, a.head_dim, n_pos, out);
    } else {
      scores_row<NV>(q, a.k + kv_off, a.kv_stride, n_pos, a.scale, scores);
      softmax_avx2(scores, n_pos);
      weighted_sum<NV>(scores, a.v + kv_off, a.kv_stride, n_pos, out);
    }
  }
}

template <int NV, int G>
void decode_partial_grouped(const AttentionArgs& a, int n_splits, int64_t item, float* partials,
                            float* scratch) {
  const int kvh = static_cast<int>(item / n_splits);
  const int64_t split = item % n_splits, n_pos = a.pos0 + 1;
  const int64_t p0 = n_pos * split / n_splits, n = n_pos * (split + 1) / n_splits - p0;
  const uint16_t* k = a.k + static_cast<int64_t>(kvh) * a.kv_head_stride + p0 * a.kv_stride;
  const uint16_t* v = a.v + static_cast<int64_t>(kvh) * a.kv_head_stride + p0 * a.kv_stride;
  float* rec[G];
  for (int g = 0; g < G; ++g)
    rec[g] = partials + (static_cast<int64_t>(kvh * G + g) * n_splits + split) * (2 + a.head_dim);
  if (n == 0) {
    for (int g = 0; g < G; ++g) {
      rec[g][0] = -INFINITY;
      rec[g][1] = 0.0f;
      for (int d = 0; d < a.head_dim; ++d) rec[g][2 + d] = 0.0f;
    }
    return;
  }
  float* scores = scratch;  // (G, n)
  grouped_scores<NV, G>(a.q + static_cast<int64_t>(kvh) * G * a.head_dim, a.head_dim, k, a.kv_stride,
                        n, a.scale, scores, n);
  float* out[G];
  for (int g = 0; g < G; ++g) {
    const ExpSum es = exp_and_sum_avx2(scores + g * n, n);
    rec[g][0] = es.max;
    rec[g][1] = es.sum;
    out[g] = rec[g] + 2;
  }
  grouped_weighted_sum<NV, G>(scores, n, v, a.kv_stride, n, out);
}

template <int NV>
void decode_partial(const AttentionArgs& a, int n_splits, int64_t item, float* partials,
                    float* scratch) {
  const int group = a.n_head / a.n_kv_head;
  switch (group) {
    case 1: return decode_partial_grouped<NV, 1>(a, n_splits, item, partials, scratch);
    case 2: return decode_partial_grouped<NV, 2>(a, n_splits, item, partials, scratch);
    case 3: return decode_partial_grouped<NV, 3>(a, n_splits, item, partials, scratch);
    case 4: return decode_partial_grouped<NV, 4>(a, n_splits, item, partials, scratch);
    default: break;  // larger groups: convert the rows once, then one head at a time
  }
  const int kvh = static_cast<int>(item / n_splits);
  const int64_t split = item % n_splits, n_pos = a.pos0 + 1;
  const int64_t p0 = n_pos * split / n_splits, n = n_pos * (split + 1) / n_splits - p0;
  const int64_t kv_off = static_cast<int64_t>(kvh) * a.kv_head_stride;
  // The range's K and V rows, converted once and read by every query head of the group.
  float* scores = scratch;
  float* k32 = scores + n + 1;
  float* v32 = k32 + n * a.head_dim;
  convert_head_rows(a.k + p0 * a.kv_stride + kv_off, a.kv_stride, n, a.head_dim, k32);
  convert_head_rows(a.v + p0 * a.kv_stride + kv_off, a.kv_stride, n, a.head_dim, v32);
  for (int g = 0; g < group; ++g) {
    const int h = kvh * group + g;
    float* rec = partials + (static_cast<int64_t>(h) * n_splits + split) * (2 + a.head_dim);
    if (n == 0) {
      rec[0] = -INFINITY;
      rec[1] = 0.0f;
      for (int d = 0; d < a.head_dim; ++d) rec[2 + d] = 0.0f;
      continue;
    }
    scores_row<NV>(a.q + static_cast<int64_t>(h) * a.head_dim, k32, a.head_dim, n, a.scale, scores);
    const ExpSum es = exp_and_sum_avx2(scores, n);
    weighted_sum<NV>(scores, v32, a.head_dim, n, rec + 2);
    rec[0] = es.max;
    rec[1] = es.sum;
  }
}

}  // namespace

void attention_decode_partial_avx2(const AttentionArgs& a, int n_splits, int64_t item,
                                   float* partials, float* scratch) {
  switch (a.head_dim) {
    case 32: decode_partial<4>(a, n_splits, item, partials, scratch); return;
    case 64: decode_partial<8>(a, n_splits, item, partials, scratch); return;
    case 96: decode_partial<12>(a, n_splits, item, partials, scratch); return;
    case 128: decode_partial<16>(a, n_splits, item, partials, scratch); return;
    case 256: decode_partial<32>(a, n_splits, item, partials, scratch); return;
    default: attention_decode_partial_scalar(a, n_splits, item, partials, scratch); return;
  }
}

// Specialised for the common head sizes (256: Gemma); attention() sends other sizes to the scalar
// version.
bool attention_avx2_supports(int head_dim) {
  return head_dim == 64 || head_dim == 128 || head_dim == 32 || head_dim == 96 || head_dim == 256;
}

void attention_avx2(const AttentionArgs& a, int64_t item_begin, int64_t item_end, float* scratch) {
  switch (a.head_dim) {
    case 32: attention_items<4>(a, item_begin, item_end, scratch); return;
    case 64: attention_items<8>(a, item_begin, item_end, scratch); return;
    case 96: attention_items<12>(a, item_begin, item_end, scratch); return;
    case 128: attention_items<16>(a, item_begin, item_end, scratch); return;
    case 256: attention_items<32>(a, item_begin, item_end, scratch); return;
    default: attention_scalar(a, item_begin, item_end, scratch); return;
  }
}

}  // namespace tokenfab::kernels
