#include "core/speculative/dense_math.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/cpu_features.h"

// The kernels use GCC vector extensions: an 8-float vector is one AVX register in the AVX2+FMA
// variant and a pair of SSE registers in the baseline one. Each body is written once, force-inlined
// into a baseline and a target("avx2,fma") entry point, and kernels::use_avx2() picks one at run
// time (as the CPU kernels do). Vectors never cross a real call, so GCC's note on the ABI of
// vector return values does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

#define TF_AVX2 __attribute__((target("avx2,fma")))
#define TF_INLINE inline __attribute__((always_inline))

namespace tokenfab::dense {

namespace {

typedef float V8 __attribute__((vector_size(32)));
typedef int32_t I8 __attribute__((vector_size(32)));

TF_INLINE V8 load8(const float* p) {
  V8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
TF_INLINE void store8(float* p, const V8& v) {
  std::memcpy(p, &v, sizeof v);
}
TF_INLINE V8 splat(float x) {
  return V8{} + x;
}  // a broadcast
TF_INLINE float hsum(const V8& v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

// C tile (MR, NR) of C = A · Bᵀ: MR rows of A against NR rows of B, 8 lanes of k at a time.
template <int MR, int NR>
TF_INLINE void nt_tile(int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                       float* c, int64_t ldc, bool accumulate) {
  V8 s[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) s[i][j] = splat(0.0f);
  int64_t p = 0;
  for (; p + 8 <= k; p += 8) {
    V8 bv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) bv[j] = load8(b + j * ldb + p);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const V8 av = load8(a + i * lda + p);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) s[i][j] += av * bv[j];
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      float t = hsum(s[i][j]);
      for (int64_t q = p; q < k; ++q) t += a[i * lda + q] * b[j * ldb + q];
      c[i * ldc + j] = accumulate ? c[i * ldc + j] + t : t;
    }
  }
}

// C tile (MR, 16) += A (MR, kc) · B (kc, 16): B's 16 columns as two vectors, A broadcast.
template <int MR>
TF_INLINE void nn_tile(int64_t kc, const float* a, int64_t lda, const float* b, int64_t ldb,
                       float* c, int64_t ldc, bool load_c) {
  V8 s[MR][2];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    s[i][0] = load_c ? load8(c + i * ldc) : splat(0.0f);
    s[i][1] = load_c ? load8(c + i * ldc + 8) : splat(0.0f);
  }
  for (int64_t p = 0; p < kc; ++p) {
    const V8 b0 = load8(b + p * ldb), b1 = load8(b + p * ldb + 8);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const V8 x = splat(a[i * lda + p]);
      s[i][0] += x * b0;
      s[i][1] += x * b1;
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    store8(c + i * ldc, s[i][0]);
    store8(c + i * ldc + 8, s[i][1]);
  }
}

// e^x for x in [−87, 88]: x = n·ln2 + r, |r| ≤ ln2/2, e^r by its degree-7 Taylor polynomial
// (truncation error r^8/8! < 1e-8), 2^n built in the exponent bits.
TF_INLINE V8 exp8(const V8& arg) {
  V8 x = arg;
  const V8 lo = splat(-87.0f), hi = splat(88.0f);
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  const V8 magic = splat(12582912.0f);  // 1.5 · 2^23: adding it rounds to an integer
  const V8 n = (x * splat(1.44269504088896341f) + magic) - magic;
  const V8 r = (x - n * splat(0.693145751953125f)) - n * splat(1.428606765330187e-06f);
  V8 p = splat(1.0f / 5040.0f);
  p = p * r + splat(1.0f / 720.0f);
  p = p * r + splat(1.0f / 120.0f);
  p = p * r + splat(1.0f / 24.0f);
  p = p * r + splat(1.0f / 6.0f);
  p = p * r + splat(0.5f);
  p = p * r + splat(1.0f);
  p = p * r + splat(1.0f);
  const I8 bits = (__builtin_convertvector(n, I8) + 127) << 23;
  V8 scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

TF_INLINE void gemm_nt_impl(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                            const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  // Rows of A in blocks that stay in L2 while every row of B passes by once.
  constexpr int64_t kBlockRows = 128;
  for (int64_t i0 = 0; i0 < m; i0 += kBlockRows) {
    const int64_t ie = std::min(m, i0 + kBlockRows);
    int64_t j = 0;
    for (; j + 3 <= n; j += 3) {
      int64_t i = i0;
      for (; i + 4 <= ie; i += 4)
        nt_tile<4, 3>(k, a + i * lda, lda, b + j * ldb, ldb, c + i * ldc + j, ldc, accumulate);
      for (; i < ie; ++i)
        nt_tile<1, 3>(k, a + i * lda, lda, b + j * ldb, ldb, c + i * ldc + j, ldc, accumulate);
    }
    for (; j < n; ++j) {
      int64_t i = i0;
      for (; i + 4 <= ie; i += 4)
        nt_tile<4, 1>(k, a + i * lda, lda, b + j * ldb, ldb, c + i * ldc + j, ldc, accumulate);
      for (; i < ie; ++i)
        nt_tile<1, 1>(k, a + i * lda, lda, b + j * ldb, ldb, c + i * ldc + j, ldc, accumulate);
    }
  }
}

TF_INLINE void gemm_nn_impl(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                            const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  if (k == 0) {
    if (!accumulate)
      for (int64_t i = 0; i < m; ++i) std::fill_n(c + i * ldc, n, 0.0f);
    return;
  }
  // k in slices whose (kc, 16) strip of B stays in L1 while all rows of A pass over it.
  constexpr int64_t kSliceK = 256;
  for (int64_t p0 = 0; p0 < k; p0 += kSliceK) {
    const int64_t kc = std::min(kSliceK, k - p0);
    const bool load_c = accumulate || p0 > 0;
    int64_t j0 = 0;
    for (; j0 + 16 <= n; j0 += 16) {
      const float* bp = b + p0 * ldb + j0;
      int64_t i = 0;
      for (; i + 6 <= m; i += 6)
        nn_tile<6>(kc, a + i * lda + p0, lda, bp, ldb, c + i * ldc + j0, ldc, load_c);
      for (; i + 2 <= m; i += 2)
        nn_tile<2>(kc, a + i * lda + p0, lda, bp, ldb, c + i * ldc + j0, ldc, load_c);
      for (; i < m; ++i)
        nn_tile<1>(kc, a + i * lda + p0, lda, bp, ldb, c + i * ldc + j0, ldc, load_c);
    }
    for (int64_t i = 0; i < m && j0 < n; ++i) {
      for (int64_t j = j0; j < n; ++j) {
        float t = load_c ? c[i * ldc + j] : 0.0f;
        for (int64_t p = p0; p < p0 + kc; ++p) t += a[i * lda + p] * b[p * ldb + j];
        c[i * ldc + j] = t;
      }
    }
  }
}

}  // namespace

void transpose(const float* a, int64_t rows, int64_t cols, int64_t lda, float* t, int64_t ldt) {
  constexpr int64_t kTile = 16;
  for (int64_t r0 = 0; r0 < rows; r0 += kTile)
    for (int64_t c0 = 0; c0 < cols; c0 += kTile)
      for (int64_t r = r0; r < std::min(rows, r0 + kTile); ++r)
        for (int64_t c = c0; c < std::min(cols, c0 + kTile); ++c) t[c * ldt + r] = a[r * lda + c];
}

namespace {

TF_INLINE float max_value_impl(const float* x, int64_t n) {
  float best = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  if (n >= 8) {
    V8 m = load8(x);
    for (i = 8; i + 8 <= n; i += 8) {
      const V8 v = load8(x + i);
      m = v > m ? v : m;
    }
    for (int l = 0; l < 8; ++l) best = std::max(best, m[l]);
  }
  for (; i < n; ++i) best = std::max(best, x[i]);
  return best;
}

TF_INLINE double exp_shifted_sum_impl(float* x, int64_t n, float shift) {
  const V8 s = splat(shift);
  V8 acc = splat(0.0f);
  double total = 0.0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const V8 e = exp8(load8(x + i) - s);
    store8(x + i, e);
    acc += e;
    if ((i & 1023) == 1016) {  // flush the f32 partial sums every 128 vectors
      total += hsum(acc);
      acc = splat(0.0f);
    }
  }
  total += hsum(acc);
  if (i < n) {
    float tail[8];
    std::fill_n(tail, 8, shift);
    std::copy(x + i, x + n, tail);
    const V8 e = exp8(load8(tail) - s);
    for (int64_t l = 0; l < n - i; ++l) {
      x[i + l] = e[l];
      total += e[l];
    }
  }
  return total;
}

TF_AVX2 void gemm_nt_avx2(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                          const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  gemm_nt_impl(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}
TF_AVX2 void gemm_nn_avx2(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                          const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  gemm_nn_impl(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}
TF_AVX2 float max_value_avx2(const float* x, int64_t n) {
  return max_value_impl(x, n);
}
TF_AVX2 double exp_shifted_sum_avx2(float* x, int64_t n, float shift) {
  return exp_shifted_sum_impl(x, n, shift);
}

}  // namespace

void gemm_nt(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
             int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  if (kernels::use_avx2()) return gemm_nt_avx2(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
  gemm_nt_impl(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}

void gemm_nn(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
             int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  if (kernels::use_avx2()) return gemm_nn_avx2(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
  gemm_nn_impl(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}

float max_value(const float* x, int64_t n) {
  return kernels::use_avx2() ? max_value_avx2(x, n) : max_value_impl(x, n);
}

double exp_shifted_sum(float* x, int64_t n, float shift) {
  return kernels::use_avx2() ? exp_shifted_sum_avx2(x, n, shift)
                             : exp_shifted_sum_impl(x, n, shift);
}

double log_sum_exp(float* x, int64_t n) {
  const float mx = max_value(x, n);
  return double(mx) + std::log(exp_shifted_sum(x, n, mx));
}

}  // namespace tokenfab::dense
