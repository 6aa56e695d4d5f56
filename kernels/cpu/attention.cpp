#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quant_types.h"

namespace tokenfab::kernels {

int64_t attention_scratch_floats(const AttentionArgs& a) {
  const int64_t positions = a.pos0 + a.n_tokens;
  return positions * (1 + 2 * static_cast<int64_t>(a.head_dim));
}

void attention_scalar(const AttentionArgs& a, int64_t item_begin, int64_t item_end, float* scores) {
  const int group = a.n_head / a.n_kv_head;
  for (int64_t item = item_begin; item < item_end; ++item) {
    const int h = static_cast<int>(item / a.n_tokens);
    const int64_t t = item % a.n_tokens;
    const int kvh = h / group;
    const float* q = a.q + t * a.q_stride + static_cast<int64_t>(h) * a.head_dim;
    const int64_t n_pos = a.pos0 + t + 1;
    const int64_t first = attention_first_position(n_pos - 1, a.window);
    for (int64_t p = first; p < n_pos; ++p) {
      const uint16_t* k = a.k + p * a.kv_stride + static_cast<int64_t>(kvh) * a.kv_head_stride;
      float dot = 0.0f;
      for (int d = 0; d < a.head_dim; ++d) dot += q[d] * fp16_to_fp32(k[d]);
      scores[p - first] = dot * a.scale;
    }
    if (a.softcap > 0) softcap(scores, n_pos - first, a.softcap);
    softmax_scalar(scores, n_pos - first);
    float* out = a.out + t * a.out_stride + static_cast<int64_t>(h) * a.head_dim;
    for (int d = 0; d < a.head_dim; ++d) out[d] = 0.0f;
    for (int64_t p = first; p < n_pos; ++p) {
      const uint16_t* v = a.v + p * a.kv_stride + static_cast<int64_t>(kvh) * a.kv_head_stride;
      for (int d = 0; d < a.head_dim; ++d) out[d] += scores[p - first] * fp16_to_fp32(v[d]);
    }
  }
}

void attention(const AttentionArgs& a, int64_t item_begin, int64_t item_end, float* scratch) {
  if (use_avx2() && attention_avx2_supports(a.head_dim) && attention_is_plain(a)) {
    attention_avx2(a, item_begin, item_end, scratch);
  } else {
    attention_scalar(a, item_begin, item_end, scratch);
  }
}

int64_t attention_decode_partial_floats(const AttentionArgs& a, int n_splits) {
  return static_cast<int64_t>(a.n_head) * n_splits * (2 + a.head_dim);
}

int64_t attention_decode_scratch_floats(const AttentionArgs& a, int n_splits) {
  const int64_t range = (a.pos0 + 1 + n_splits - 1) / n_splits + 1;  // longest split
  const int64_t group = a.n_head / a.n_kv_head;
  return range * std::max<int64_t>(group, 1 + 2 * static_cast<int64_t>(a.head_dim));
}

void attention_decode_partial_scalar(const AttentionArgs& a, int n_splits, int64_t item,
                                     float* partials, float* scratch) {
  const int group = a.n_head / a.n_kv_head;
  const int kvh = static_cast<int>(item / n_splits);
  const int64_t split = item % n_splits, n_pos = a.pos0 + 1;
  const int64_t first = attention_first_position(a.pos0, a.window), span = n_pos - first;
  const int64_t p0 = first + span * split / n_splits, p1 = first + span * (split + 1) / n_splits;
  const int64_t kv_off = static_cast<int64_t>(kvh) * a.kv_head_stride;
  for (int g = 0; g < group; ++g) {
    const int h = kvh * group + g;
    float* rec = partials + (static_cast<int64_t>(h) * n_splits + split) * (2 + a.head_dim);
    const float* q = a.q + static_cast<int64_t>(h) * a.head_dim;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t p = p0; p < p1; ++p) {
      const uint16_t* k = a.k + p * a.kv_stride + kv_off;
      float dot = 0.0f;
      for (int d = 0; d < a.head_dim; ++d) dot += q[d] * fp16_to_fp32(k[d]);
      scratch[p - p0] = dot * a.scale;
      if (a.softcap > 0) scratch[p - p0] = a.softcap * std::tanh(scratch[p - p0] / a.softcap);
      m = std::max(m, scratch[p - p0]);
    }
    float l = 0.0f;
    float* o = rec + 2;
    for (int d = 0; d < a.head_dim; ++d) o[d] = 0.0f;
    for (int64_t p = p0; p < p1; ++p) {
      const float e = std::exp(scratch[p - p0] - m);
      l += e;
      const uint16_t* v = a.v + p * a.kv_stride + kv_off;
      for (int d = 0; d < a.head_dim; ++d) o[d] += e * fp16_to_fp32(v[d]);
    }
    rec[0] = m;
    rec[1] = l;
  }
}

void attention_decode_partial(const AttentionArgs& a, int n_splits, int64_t item, float* partials,
                              float* scratch) {
  if (use_avx2() && attention_avx2_supports(a.head_dim) && attention_is_plain(a)) {
    attention_decode_partial_avx2(a, n_splits, item, partials, scratch);
  } else {
    attention_decode_partial_scalar(a, n_splits, item, partials, scratch);
  }
}

void attention_decode_merge(const AttentionArgs& a, int n_splits, const float* partials) {
  const int64_t rec_size = 2 + a.head_dim;
  for (int h = 0; h < a.n_head; ++h) {
    const float* recs = partials + static_cast<int64_t>(h) * n_splits * rec_size;
    float m = -std::numeric_limits<float>::infinity();
    for (int s = 0; s < n_splits; ++s) m = std::max(m, recs[s * rec_size]);
    float* out = a.out + static_cast<int64_t>(h) * a.head_dim;
    for (int d = 0; d < a.head_dim; ++d) out[d] = 0.0f;
    float l = 0.0f;
    for (int s = 0; s < n_splits; ++s) {
      const float* rec = recs + s * rec_size;
      if (rec[1] == 0.0f) continue;  // an empty split
      const float w = std::exp(rec[0] - m);
      l += w * rec[1];
      for (int d = 0; d < a.head_dim; ++d) out[d] += w * rec[2 + d];
    }
    const float inv = 1.0f / l;
    for (int d = 0; d < a.head_dim; ++d) out[d] *= inv;
  }
}

}  // namespace tokenfab::kernels
