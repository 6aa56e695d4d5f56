#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/simd_math_avx2.h"

namespace tokenfab::kernels {

namespace {

// Scores of one query row against positions [0, n): s[p] = scale · q·k_p. Four positions at a time
// share each q load and give four independent FMA chains; one hadd tree reduces them together.
template <int NV>
void scores_row(const float* q, const float* k, int64_t kv_stride, int64_t n, float scale, float* s) {
  const __m256 vscale = _mm256_set1_ps(scale);
  int64_t p = 0;
  for (; p + 4 <= n; p += 4) {
    const float* k0 = k + p * kv_stride;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int j = 0; j < NV; ++j) {
      const __m256 qj = _mm256_loadu_ps(q + 8 * j);
      a0 = _mm256_fmadd_ps(qj, _mm256_loadu_ps(k0 + 8 * j), a0);
      a1 = _mm256_fmadd_ps(qj, _mm256_loadu_ps(k0 + kv_stride + 8 * j), a1);
      a2 = _mm256_fmadd_ps(qj, _mm256_loadu_ps(k0 + 2 * kv_stride + 8 * j), a2);
      a3 = _mm256_fmadd_ps(qj, _mm256_loadu_ps(k0 + 3 * kv_stride + 8 * j), a3);
    }
    // hadd(a0,a1), hadd(a2,a3) → per 128-bit lane [a0 a0 a1 a1 | ...]; again → [a0 a1 a2 a3] per lane.
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    const __m128 sum = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    _mm_storeu_ps(s + p, _mm_mul_ps(sum, _mm256_castps256_ps128(vscale)));
  }
  for (; p < n; ++p) {
    const float* kp = k + p * kv_stride;
    __m256 a = _mm256_setzero_ps();
    for (int j = 0; j < NV; ++j) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * j), _mm256_loadu_ps(kp + 8 * j), a);
    s[p] = hsum_avx2(a) * scale;
  }
}

// scores[0..n) ← softmax(scores), vectorised exp.
void softmax_avx2(float* s, int64_t n) {
  __m256 vmax = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(s + i));
  float max = hmax_avx2(vmax);
  for (; i < n; ++i) max = s[i] > max ? s[i] : max;
  const __m256 m = _mm256_set1_ps(max);
  __m256 vsum = _mm256_setzero_ps();
  i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + i), m));
    _mm256_storeu_ps(s + i, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  float sum = hsum_avx2(vsum);
  for (; i < n; ++i) {
    s[i] = _mm256_cvtss_f32(exp_avx2(_mm256_set1_ps(s[i] - max)));
    sum += s[i];
  }
  const float inv = 1.0f / sum;
  const __m256 vinv = _mm256_set1_ps(inv);
  i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(s + i, _mm256_mul_ps(_mm256_loadu_ps(s + i), vinv));
  for (; i < n; ++i) s[i] *= inv;
}

// out = Σ_p w[p] · v_p, the whole head row held in NV registers.
template <int NV>
void weighted_sum(const float* w, const float* v, int64_t kv_stride, int64_t n, float* out) {
  __m256 acc[NV];
  for (int j = 0; j < NV; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t p = 0; p < n; ++p) {
    const float* vp = v + p * kv_stride;
    const __m256 wp = _mm256_broadcast_ss(w + p);
    for (int j = 0; j < NV; ++j) acc[j] = _mm256_fmadd_ps(wp, _mm256_loadu_ps(vp + 8 * j), acc[j]);
  }
  for (int j = 0; j < NV; ++j) _mm256_storeu_ps(out + 8 * j, acc[j]);
}

template <int NV>
void attention_items(const AttentionArgs& a, int64_t item_begin, int64_t item_end, float* scores) {
  const int group = a.n_head / a.n_kv_head;
  for (int64_t item = item_begin; item < item_end; ++item) {
    const int64_t t = item / a.n_head;
    const int h = static_cast<int>(item % a.n_head);
    const int64_t kv_off = static_cast<int64_t>(h / group) * a.head_dim;
    const float* q = a.q + t * a.q_stride + static_cast<int64_t>(h) * a.head_dim;
    const int64_t n_pos = a.pos0 + t + 1;
    scores_row<NV>(q, a.k + kv_off, a.kv_stride, n_pos, a.scale, scores);
    softmax_avx2(scores, n_pos);
    weighted_sum<NV>(scores, a.v + kv_off, a.kv_stride, n_pos,
                     a.out + t * a.out_stride + static_cast<int64_t>(h) * a.head_dim);
  }
}

}  // namespace

// Specialised for the common head sizes; attention() sends other sizes to the scalar version.
bool attention_avx2_supports(int head_dim) {
  return head_dim == 64 || head_dim == 128 || head_dim == 32 || head_dim == 96;
}

void attention_avx2(const AttentionArgs& a, int64_t item_begin, int64_t item_end, float* scores) {
  switch (a.head_dim) {
    case 32: attention_items<4>(a, item_begin, item_end, scores); return;
    case 64: attention_items<8>(a, item_begin, item_end, scores); return;
    case 96: attention_items<12>(a, item_begin, item_end, scores); return;
    case 128: attention_items<16>(a, item_begin, item_end, scores); return;
    default: attention_scalar(a, item_begin, item_end, scores); return;
  }
}

}  // namespace tokenfab::kernels
