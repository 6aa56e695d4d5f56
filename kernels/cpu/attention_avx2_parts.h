#pragma once
// AVX2 building blocks of attention, shared by the contiguous (attention_avx2.cpp) and paged
// (paged_attention_avx2.cpp) kernels. Include only from translation units compiled with AVX2/FMA/
// F16C. NV = head_dim / 8 (the head held as NV 8-float registers).

#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "kernels/cpu/simd_math_avx2.h"

namespace tokenfab::kernels::avx2 {

// Decode reads K and V rows once per step, straight from memory: rows this far ahead are
// prefetched while the current ones are computed on.
inline constexpr int64_t kPrefetchRows = 16;

inline __m256 load_h8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 load_h8(const float* p) { return _mm256_loadu_ps(p); }

// Scores of one query row against positions [0, n): s[p] = scale · q·k_p. Four positions at a time
// share each q load and give four independent FMA chains; one hadd tree reduces them together.
template <int NV, typename E>
void scores_row(const float* q, const E* k, int64_t kv_stride, int64_t n, float scale, float* s) {
  const __m256 vscale = _mm256_set1_ps(scale);
  int64_t p = 0;
  for (; p + 4 <= n; p += 4) {
    const E* k0 = k + p * kv_stride;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int j = 0; j < NV; ++j) {
      const __m256 qj = _mm256_loadu_ps(q + 8 * j);
      a0 = _mm256_fmadd_ps(qj, load_h8(k0 + 8 * j), a0);
      a1 = _mm256_fmadd_ps(qj, load_h8(k0 + kv_stride + 8 * j), a1);
      a2 = _mm256_fmadd_ps(qj, load_h8(k0 + 2 * kv_stride + 8 * j), a2);
      a3 = _mm256_fmadd_ps(qj, load_h8(k0 + 3 * kv_stride + 8 * j), a3);
    }
    // hadd(a0,a1), hadd(a2,a3) → per 128-bit lane [a0 a0 a1 a1 | ...]; again → [a0 a1 a2 a3] per lane.
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    const __m128 sum = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    _mm_storeu_ps(s + p, _mm_mul_ps(sum, _mm256_castps256_ps128(vscale)));
  }
  for (; p < n; ++p) {
    const E* kp = k + p * kv_stride;
    __m256 a = _mm256_setzero_ps();
    for (int j = 0; j < NV; ++j) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * j), load_h8(kp + 8 * j), a);
    s[p] = hsum_avx2(a) * scale;
  }
}

// s[0..n) ← exp(s − max); returns {max, Σ}. Vectorised exp.
struct ExpSum {
  float max;
  float sum;
};
inline ExpSum exp_and_sum_avx2(float* s, int64_t n) {
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
  return {max, sum};
}

// scores[0..n) ← softmax(scores).
inline void softmax_avx2(float* s, int64_t n) {
  const float inv = 1.0f / exp_and_sum_avx2(s, n).sum;
  int64_t i = 0;
  const __m256 vinv = _mm256_set1_ps(inv);
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(s + i, _mm256_mul_ps(_mm256_loadu_ps(s + i), vinv));
  for (; i < n; ++i) s[i] *= inv;
}

// out = Σ_p w[p] · v_p, the whole head row held in NV registers.
template <int NV, typename E>
void weighted_sum(const float* w, const E* v, int64_t kv_stride, int64_t n, float* out) {
  __m256 acc[NV];
  for (int j = 0; j < NV; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t p = 0; p < n; ++p) {
    const E* vp = v + p * kv_stride;
    const __m256 wp = _mm256_broadcast_ss(w + p);
    for (int j = 0; j < NV; ++j) acc[j] = _mm256_fmadd_ps(wp, load_h8(vp + 8 * j), acc[j]);
  }
  for (int j = 0; j < NV; ++j) _mm256_storeu_ps(out + 8 * j, acc[j]);
}

// dst (n, head_dim) f32 ← n fp16 rows of head_dim, `stride` elements apart.
inline void convert_head_rows(const uint16_t* src, int64_t stride, int64_t n, int head_dim, float* dst) {
  for (int64_t p = 0; p < n; ++p)
    for (int d = 0; d < head_dim; d += 8)
      _mm256_storeu_ps(dst + p * head_dim + d, load_h8(src + p * stride + d));
}

// Scores of G query heads sharing one kv head, against the same rows: each K row is loaded (and,
// for fp16 rows, converted) once and used by all G heads. Decode reads the fp16 rows directly
// (no f32 copy); the paged kernel reads its f32 gathers. Scores: 4 positions × G heads in flight,
// reduced with one hadd tree per head. s: (G, n), s_stride floats apart. Every score is formed
// exactly as scores_row forms it (same FMA order over the head, same reduction of its group of
// four positions or of a tail position), so the result equals G scores_row calls bit for bit.
template <int NV, int G, typename E>
void grouped_scores(const float* q, int64_t q_head_stride, const E* k, int64_t stride, int64_t n,
                    float scale, float* s, int64_t s_stride) {
  int64_t p = 0;
  for (; p + 4 <= n; p += 4) {
    __m256 acc[G][4];
    for (int g = 0; g < G; ++g)
      for (int i = 0; i < 4; ++i) acc[g][i] = _mm256_setzero_ps();
    const E* kp = k + p * stride;
    // fp16 K rows are a stream from memory (the cache is far larger than L2): ask for the rows
    // kPrefetchRows ahead now, as the matmuls do for weights.
    if constexpr (sizeof(E) == 2) {
      for (int i = 0; i < 4; ++i)
        for (int b = 0; b < 16 * NV; b += 64)
          _mm_prefetch(reinterpret_cast<const char*>(kp + (kPrefetchRows + i) * stride) + b,
                       _MM_HINT_T0);
    }
    // G·4 accumulators + G query vectors + one K vector stay within the 16 ymm registers (G ≤ 3).
    for (int j = 0; j < NV; ++j) {
      __m256 qj[G];
      for (int g = 0; g < G; ++g) qj[g] = _mm256_loadu_ps(q + g * q_head_stride + 8 * j);
      for (int i = 0; i < 4; ++i) {
        const __m256 kv = load_h8(kp + i * stride + 8 * j);
        for (int g = 0; g < G; ++g) acc[g][i] = _mm256_fmadd_ps(qj[g], kv, acc[g][i]);
      }
    }
    for (int g = 0; g < G; ++g) {
      const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(acc[g][0], acc[g][1]),
                                      _mm256_hadd_ps(acc[g][2], acc[g][3]));
      const __m128 sum = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
      _mm_storeu_ps(s + g * s_stride + p, _mm_mul_ps(sum, _mm_set1_ps(scale)));
    }
  }
  for (; p < n; ++p) {
    for (int g = 0; g < G; ++g) {
      __m256 a = _mm256_setzero_ps();
      for (int j = 0; j < NV; ++j)
        a = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * q_head_stride + 8 * j), load_h8(k + p * stride + 8 * j), a);
      s[g * s_stride + p] = hsum_avx2(a) * scale;
    }
  }
}

// A run of consecutive positions' rows: row i of the run at rows + i · stride.
template <typename E>
struct RowRun {
  const E* rows;
  int64_t count;
};

// out_g = Σ_p w[g·w_stride + p] · v_p for the G heads, four 8-float chunks of the head at a time,
// each V row loaded once for all G heads. The rows come in runs: run(p0) gives the run starting at
// position p0 (a contiguous copy is one run, a paged pool one per block). Every lane sums its
// products in position order, as weighted_sum does, so the result equals G weighted_sum calls
// bit for bit, however the rows are cut into runs.
template <int NV, int G, typename E, typename Run>
void grouped_weighted_sum_runs(const float* w, int64_t w_stride, Run run, int64_t stride,
                               int64_t n, float* const* out) {
  static_assert(NV % 4 == 0);
  for (int c0 = 0; c0 < NV; c0 += 4) {
    __m256 acc[G][4];
    for (int g = 0; g < G; ++g)
      for (int j = 0; j < 4; ++j) acc[g][j] = _mm256_setzero_ps();
    // G·4 accumulators + G weights + one V vector stay within the 16 ymm registers (G ≤ 3).
    for (int64_t p0 = 0; p0 < n;) {
      const RowRun<E> r = run(p0);
      for (int64_t i = 0; i < r.count; ++i) {
        const E* v = r.rows + i * stride;
        if constexpr (sizeof(E) == 2) {
          if (i + kPrefetchRows < r.count)
            _mm_prefetch(reinterpret_cast<const char*>(v + kPrefetchRows * stride + 8 * c0),
                         _MM_HINT_T0);
        }
        __m256 wg[G];
        for (int g = 0; g < G; ++g) wg[g] = _mm256_broadcast_ss(w + g * w_stride + p0 + i);
        for (int j = 0; j < 4; ++j) {
          const __m256 vv = load_h8(v + 8 * (c0 + j));
          for (int g = 0; g < G; ++g) acc[g][j] = _mm256_fmadd_ps(wg[g], vv, acc[g][j]);
        }
      }
      p0 += r.count;
    }
    for (int g = 0; g < G; ++g)
      for (int j = 0; j < 4; ++j) _mm256_storeu_ps(out[g] + 8 * (c0 + j), acc[g][j]);
  }
}

// The same over n rows `stride` elements apart (one run).
template <int NV, int G, typename E>
void grouped_weighted_sum(const float* w, int64_t w_stride, const E* v, int64_t stride, int64_t n,
                          float* const* out) {
  grouped_weighted_sum_runs<NV, G, E>(
      w, w_stride, [&](int64_t p0) { return RowRun<E>{v + p0 * stride, n - p0}; }, stride, n,
      out);
}

}  // namespace tokenfab::kernels::avx2
