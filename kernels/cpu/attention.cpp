#include "kernels/cpu/attention.h"

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
    for (int64_t p = 0; p < n_pos; ++p) {
      const uint16_t* k = a.k + p * a.kv_stride + static_cast<int64_t>(kvh) * a.head_dim;
      float dot = 0.0f;
      for (int d = 0; d < a.head_dim; ++d) dot += q[d] * fp16_to_fp32(k[d]);
      scores[p] = dot * a.scale;
    }
    softmax_scalar(scores, n_pos);
    float* out = a.out + t * a.out_stride + static_cast<int64_t>(h) * a.head_dim;
    for (int d = 0; d < a.head_dim; ++d) out[d] = 0.0f;
    for (int64_t p = 0; p < n_pos; ++p) {
      const uint16_t* v = a.v + p * a.kv_stride + static_cast<int64_t>(kvh) * a.head_dim;
      for (int d = 0; d < a.head_dim; ++d) out[d] += scores[p] * fp16_to_fp32(v[d]);
    }
  }
}

void attention(const AttentionArgs& a, int64_t item_begin, int64_t item_end, float* scratch) {
  if (use_avx2() && attention_avx2_supports(a.head_dim)) {
    attention_avx2(a, item_begin, item_end, scratch);
  } else {
    attention_scalar(a, item_begin, item_end, scratch);
  }
}

}  // namespace tokenfab::kernels
