#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/simd_math_avx2.h"

namespace tokenfab::kernels {

namespace {

// head_dim a multiple of 8, at most 256 (32 registers' worth of q held in an array).
inline float dot_row(const float* q, const float* k, int head_dim) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int d = 0;
  for (; d + 16 <= head_dim; d += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), _mm256_loadu_ps(k + d + 8), acc1);
  }
  if (d < head_dim) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), acc0);
  return hsum_avx2(_mm256_add_ps(acc0, acc1));
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
    const __m256 e = exp_avx2(_mm256_set1_ps(s[i] - max));
    s[i] = _mm256_cvtss_f32(e);
    sum += s[i];
  }
  const __m256 inv = _mm256_set1_ps(1.0f / sum);
  i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(s + i, _mm256_mul_ps(_mm256_loadu_ps(s + i), inv));
  for (; i < n; ++i) s[i] *= 1.0f / sum;
}

}  // namespace

void attention_avx2(const AttentionArgs& a, int64_t item_begin, int64_t item_end, float* scores) {
  const int group = a.n_head / a.n_kv_head;
  const int nv = a.head_dim / 8;
  for (int64_t item = item_begin; item < item_end; ++item) {
    const int64_t t = item / a.n_head;
    const int h = static_cast<int>(item % a.n_head);
    const int64_t kv_off = static_cast<int64_t>(h / group) * a.head_dim;
    const float* q = a.q + t * a.q_stride + static_cast<int64_t>(h) * a.head_dim;
    const int64_t n_pos = a.pos0 + t + 1;
    for (int64_t p = 0; p < n_pos; ++p)
      scores[p] = dot_row(q, a.k + p * a.kv_stride + kv_off, a.head_dim) * a.scale;
    softmax_avx2(scores, n_pos);
    __m256 acc[32];
    for (int j = 0; j < nv; ++j) acc[j] = _mm256_setzero_ps();
    for (int64_t p = 0; p < n_pos; ++p) {
      const float* v = a.v + p * a.kv_stride + kv_off;
      const __m256 w = _mm256_set1_ps(scores[p]);
      for (int j = 0; j < nv; ++j) acc[j] = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 8 * j), acc[j]);
    }
    float* out = a.out + t * a.out_stride + static_cast<int64_t>(h) * a.head_dim;
    for (int j = 0; j < nv; ++j) _mm256_storeu_ps(out + 8 * j, acc[j]);
  }
}

}  // namespace tokenfab::kernels
