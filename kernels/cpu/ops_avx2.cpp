#include <immintrin.h>

#include <algorithm>
#include <limits>

#include <cmath>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/simd_math_avx2.h"

namespace tokenfab::kernels {

void silu_mul_avx2(float* gate, const float* up, int64_t n) {
  int64_t i = 0;
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 neg = _mm256_set1_ps(-0.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp_avx2(_mm256_xor_ps(g, neg));
    const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void fp32_to_fp16_row_avx2(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) y[i] = static_cast<uint16_t>(_cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT));
}

// Two passes: the maximum (max_ps returns its second operand when the first is NaN, so NaNs
// never enter the accumulators), then the first index holding it. Both read the row from cache.
int64_t argmax_avx2(const float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  if (n >= 32) {
    __m256 a0 = _mm256_set1_ps(m), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 32 <= n; i += 32) {
      a0 = _mm256_max_ps(_mm256_loadu_ps(x + i), a0);
      a1 = _mm256_max_ps(_mm256_loadu_ps(x + i + 8), a1);
      a2 = _mm256_max_ps(_mm256_loadu_ps(x + i + 16), a2);
      a3 = _mm256_max_ps(_mm256_loadu_ps(x + i + 24), a3);
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, _mm256_max_ps(_mm256_max_ps(a0, a1), _mm256_max_ps(a2, a3)));
    for (const float v : lanes) m = std::max(m, v);
  }
  for (; i < n; ++i)
    if (x[i] > m) m = x[i];
  const __m256 target = _mm256_set1_ps(m);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + j), target, _CMP_EQ_OQ));
    if (mask) return j + __builtin_ctz(static_cast<unsigned>(mask));
  }
  for (; j < n; ++j)
    if (x[j] == m) return j;
  return 0;  // every value is NaN
}

}  // namespace tokenfab::kernels
