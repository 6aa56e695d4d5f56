#include <immintrin.h>

#include <limits>

#include "kernels/cpu/quantize.h"

namespace tokenfab::kernels {

// Same rounding as the scalar version (round half to even under the default MXCSR mode, which is
// what nearbyint uses), so both produce identical blocks.
void quantize_row_q8a_avx2(const float* x, BlockQ8A* y, int64_t n) {
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < n / kQK; ++b, x += kQK) {
    __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
    __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
    __m256 amax = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign_mask, v0), _mm256_andnot_ps(sign_mask, v1)),
                                _mm256_max_ps(_mm256_andnot_ps(sign_mask, v2), _mm256_andnot_ps(sign_mask, v3)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float max_scalar = _mm_cvtss_f32(m4);
    // Same rule as the scalar version: when 127/amax is not finite, q = clamp(x / d).
    const float id = max_scalar != 0.0f ? 127.0f / max_scalar : 0.0f;
    const bool tiny = !(id <= std::numeric_limits<float>::max());
    const float d = max_scalar / 127.0f;
    const auto scaled = [&](__m256 v) {
      if (!tiny) return _mm256_cvtps_epi32(_mm256_mul_ps(v, _mm256_set1_ps(id)));
      if (d == 0.0f) return _mm256_setzero_si256();  // amax below 127 × the smallest subnormal
      const __m256i q = _mm256_cvtps_epi32(_mm256_div_ps(v, _mm256_set1_ps(d)));
      return _mm256_max_epi32(_mm256_min_epi32(q, _mm256_set1_epi32(127)), _mm256_set1_epi32(-127));
    };
    __m256i i0 = scaled(v0), i1 = scaled(v1), i2 = scaled(v2), i3 = scaled(v3);
    const __m256i sum32 = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum32), _mm256_extracti128_si256(sum32, 1));
    s4 = _mm_hadd_epi32(s4, s4);
    s4 = _mm_hadd_epi32(s4, s4);
    // Pack 32-bit lanes to bytes; the packs interleave 128-bit lanes, the permute restores order.
    const __m256i p01 = _mm256_packs_epi32(i0, i1);
    const __m256i p23 = _mm256_packs_epi32(i2, i3);
    __m256i bytes = _mm256_packs_epi16(p01, p23);
    bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[b].qs), bytes);
    y[b].d = d;
    y[b].s = d * static_cast<float>(_mm_cvtsi128_si32(s4));
  }
}

}  // namespace tokenfab::kernels
