// Element-wise ops against formulas evaluated here in double, and each AVX2 variant against its
// scalar reference.

#include <QtTest>
#include <bit>
#include <cmath>
#include <limits>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/ops.h"
#include "tests/kernels/kernel_test.h"

using namespace tokenfab::kernels;
using tokenfab::kernels::test::kF32Eps;
using tokenfab::kernels::test::uniform_floats;

// y = x·w / sqrt(mean(x²) + eps). The kernel's f32 steps (mean → f32, + eps, sqrt, 1/·, two
// products) each round once: 6 ulps, so relative 1e-6 with room to spare.
void KernelTest::rms_norm_matches_formula() {
  std::mt19937 rng(5);
  for (int64_t n : {1, 7, 576, 4096}) {
    for (float magnitude : {3.0f, 1e15f, 1e-20f, 0.0f}) {
      for (float eps : {1e-5f, 1e-6f}) {
        std::vector<float> x = uniform_floats(rng, n, -magnitude, magnitude);
        const std::vector<float> w = uniform_floats(rng, n, 0.5f, 1.5f);
        std::vector<float> y(n);
        rms_norm(x.data(), w.data(), y.data(), n, eps);
        double sum = 0;
        for (float v : x) sum += static_cast<double>(v) * v;
        const double scale = 1 / std::sqrt(sum / n + eps);
        for (int64_t i = 0; i < n; ++i) {
          const double want = x[i] * scale * w[i];
          QVERIFY2(std::fabs(y[i] - want) <= 1e-6 * std::fabs(want),
                   qPrintable(QString("n=%1 |x|≤%2 eps=%3 i=%4: %5, want %6")
                                  .arg(n)
                                  .arg(static_cast<double>(magnitude))
                                  .arg(static_cast<double>(eps))
                                  .arg(i)
                                  .arg(static_cast<double>(y[i]), 0, 'g', 9)
                                  .arg(want, 0, 'g', 9)));
        }
      }
    }
  }
}

// rope_table against angle_i = pos / base^(2i/rot_dim) in double: 1.5e-7 absolute, a little over
// one f32 ulp at 1 (the kernel rounds its own double angle, which may differ from ours in the
// last bits, to f32). rope against (a cos − b sin, a sin + b cos) with our double angles: the
// tables' half-ulp errors plus three roundings, ≤ 8u·(|a| + |b|); the same bound for each pair's
// norm, which a rotation keeps. Elements past rot_dim are untouched; position 0 is the identity.
void KernelTest::rope_matches_formula_and_keeps_norms() {
  constexpr int n_heads = 3, head_dim = 64;
  std::mt19937 rng(11);
  for (int rot_dim : {64, 32}) {
    for (float base : {10000.0f, 500000.0f}) {
      for (int64_t pos : {0, 1, 37, 4095, 100000}) {
        std::vector<float> cos_t(rot_dim / 2), sin_t(rot_dim / 2);
        rope_table(pos, rot_dim, base, cos_t.data(), sin_t.data());
        std::vector<double> angle(rot_dim / 2);
        for (int i = 0; i < rot_dim / 2; ++i) {
          angle[i] =
              static_cast<double>(pos) / std::pow(static_cast<double>(base), 2.0 * i / rot_dim);
          QVERIFY(std::fabs(cos_t[i] - std::cos(angle[i])) <= 1.5e-7);
          QVERIFY(std::fabs(sin_t[i] - std::sin(angle[i])) <= 1.5e-7);
        }

        const std::vector<float> x0 = uniform_floats(rng, n_heads * head_dim, -4.0f, 4.0f);
        std::vector<float> x = x0;
        rope(x.data(), n_heads, head_dim, rot_dim, cos_t.data(), sin_t.data());
        for (int h = 0; h < n_heads; ++h) {
          const int base_i = h * head_dim;
          for (int i = 0; i < rot_dim / 2; ++i) {
            const double a = x0[base_i + 2 * i], b = x0[base_i + 2 * i + 1];
            const double tol = 8 * kF32Eps * (std::fabs(a) + std::fabs(b));
            const double c = std::cos(angle[i]), s = std::sin(angle[i]);
            const float ra = x[base_i + 2 * i], rb = x[base_i + 2 * i + 1];
            QVERIFY2(
                std::fabs(ra - (a * c - b * s)) <= tol && std::fabs(rb - (a * s + b * c)) <= tol,
                qPrintable(QString("rot_dim=%1 base=%2 pos=%3 head %4 pair %5")
                               .arg(rot_dim)
                               .arg(static_cast<double>(base))
                               .arg(pos)
                               .arg(h)
                               .arg(i)));
            QVERIFY(std::fabs(std::hypot(static_cast<double>(ra), static_cast<double>(rb)) -
                              std::hypot(a, b)) <= tol);
            if (pos == 0) QVERIFY(ra == x0[base_i + 2 * i] && rb == x0[base_i + 2 * i + 1]);
          }
          for (int i = rot_dim; i < head_dim; ++i) QCOMPARE(x[base_i + i], x0[base_i + i]);
        }
      }
    }
  }
}

// silu_mul_avx2 uses a polynomial exp (simd_math_avx2.h: relative error < 2e-7) where the scalar
// uses std::exp; with the division and product that stays below relative 1e-6. exp_avx2 clamps
// its argument to ≤ 88, so for gate < −88 the AVX2 result is gate·up/(1 + e^88) where the true
// value is smaller still (std::exp overflows to inf and gives −0): the difference is at most
// |gate·up|·e^-88 < |gate·up|·1e-38, which the absolute term allows. Lengths cover the 8-wide loop
// and its scalar tail.
void KernelTest::silu_mul_avx2_matches_scalar() {
  if (!cpu_features().avx2) QSKIP("this CPU has no AVX2 (or TOKENFAB_FORCE_SCALAR=1)");
  std::mt19937 rng(3);
  const std::vector<float> specials = {0.0f,   -0.0f,   1e-30f, -1e-30f, 1.0f,   -1.0f,
                                       20.0f,  -20.0f,  87.5f,  -87.5f,  88.7f,  -88.7f,
                                       -89.0f, -100.0f, 100.0f, 1e30f,   -1e30f, 0.5f};
  for (int64_t n : {1, 7, 8, 9, 18, 1000}) {
    std::vector<float> gate = uniform_floats(rng, n, -20.0f, 20.0f);
    for (size_t i = 0; i < specials.size() && i < gate.size(); ++i) gate[i] = specials[i];
    const std::vector<float> up = uniform_floats(rng, n, -2.0f, 2.0f);
    std::vector<float> scalar = gate, avx2 = gate;
    silu_mul_scalar(scalar.data(), up.data(), n);
    silu_mul_avx2(avx2.data(), up.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const double clamp_term = std::fabs(static_cast<double>(gate[i]) * up[i]) * 1e-38;
      QVERIFY2(std::fabs(avx2[i] - scalar[i]) <= 1e-6 * std::fabs(scalar[i]) + clamp_term + 1e-38,
               qPrintable(QString("n=%1 gate=%2 up=%3: avx2 %4, scalar %5")
                              .arg(n)
                              .arg(static_cast<double>(gate[i]), 0, 'g', 9)
                              .arg(static_cast<double>(up[i]), 0, 'g', 9)
                              .arg(static_cast<double>(avx2[i]), 0, 'g', 9)
                              .arg(static_cast<double>(scalar[i]), 0, 'g', 9)));
    }
  }
}

// F16C against the scalar fp32_to_fp16 (itself checked in test_kernels_quant.cpp): identical
// bits on every rounding midpoint of the fp16 range, one f32 ulp either side, and random f32 bit
// patterns of every class. NaNs only need to stay NaNs of the same sign: F16C keeps the top
// payload bits, fp32_to_fp16 returns the canonical quiet NaN, and no kernel depends on payloads.
void KernelTest::fp16_row_avx2_matches_scalar() {
  if (!cpu_features().avx2) QSKIP("this CPU has no AVX2 (or TOKENFAB_FORCE_SCALAR=1)");
  std::vector<float> x = {0.0f,
                          -0.0f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          65520.0f,
                          65519.0f,
                          1e-45f};
  for (uint32_t h = 0; h < 0x7BFF; ++h) {
    for (const uint32_t sign : {0u, 0x8000u}) {
      const float lo = fp16_to_fp32(static_cast<uint16_t>(sign | h));
      const float hi = fp16_to_fp32(static_cast<uint16_t>(sign | (h + 1)));
      const float mid = (lo + hi) / 2;
      x.insert(x.end(), {lo, mid, std::nextafter(mid, lo), std::nextafter(mid, hi)});
    }
  }
  std::mt19937 rng(17);
  for (int i = 0; i < 200000; ++i) x.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  x.resize(x.size() / 8 * 8 + 5);  // a scalar tail after the 8-wide loop

  const auto n = static_cast<int64_t>(x.size());
  std::vector<uint16_t> avx2(n);
  fp32_to_fp16_row_avx2(x.data(), avx2.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t want = fp32_to_fp16(x[i]);
    const bool both_nan = std::isnan(x[i]) && (avx2[i] & 0x7c00) == 0x7c00 && (avx2[i] & 0x3ff) &&
                          (avx2[i] & 0x8000) == (want & 0x8000);
    if (avx2[i] != want && !both_nan) {
      QFAIL(qPrintable(QString("f32 0x%1: avx2 0x%2, scalar 0x%3")
                           .arg(std::bit_cast<uint32_t>(x[i]), 8, 16, QChar('0'))
                           .arg(avx2[i], 4, 16, QChar('0'))
                           .arg(want, 4, 16, QChar('0'))));
    }
  }
  // Short rows: only the tail loop, and the dispatched entry point.
  for (int64_t len = 1; len <= 9; ++len) {
    std::vector<uint16_t> y(len + 1, 0xBEEF);
    fp32_to_fp16_row(x.data() + 1000, y.data(), len);
    for (int64_t i = 0; i < len; ++i) QCOMPARE(y[i], fp32_to_fp16(x[1000 + i]));
    QCOMPARE(y[len], uint16_t{0xBEEF});
  }
}

// Σ softmax(x) = 1 within 3u: inv = 1/Σe rounds once, each e·inv once (the test sums in double).
// Each value also matches the double-precision formula within 8u plus the rounding of x − max in
// f32, which shifts the exponent by up to u·|x − max| (relative).
void KernelTest::softmax_matches_formula_and_sums_to_one() {
  std::mt19937 rng(23);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t n : {1, 2, 3, 17, 1000, 4096}) {
    for (float spread : {0.0f, 5.0f, 1000.0f}) {
      std::vector<float> x = uniform_floats(rng, n, -spread, spread);
      if (n > 2) x[1] = neg_inf;  // a masked position
      std::vector<float> y = x;
      softmax_scalar(y.data(), n);
      const double max = *std::max_element(x.begin(), x.end());
      double sum_ref = 0, sum = 0;
      for (int64_t i = 0; i < n; ++i) {
        sum_ref += std::exp(x[i] - max);
        sum += y[i];
      }
      QVERIFY2(
          std::fabs(sum - 1) <= 3 * kF32Eps,
          qPrintable(QString("n=%1 spread=%2: Σ = %3").arg(n).arg(spread).arg(sum, 0, 'g', 17)));
      for (int64_t i = 0; i < n; ++i) {
        const double want = std::exp(x[i] - max) / sum_ref;
        const double tol = want * (8 + 2 * std::fabs(x[i] - max)) * kF32Eps + 0x1p-149;
        QVERIFY2(y[i] >= 0 && (x[i] == neg_inf ? y[i] == 0 : std::fabs(y[i] - want) <= tol),
                 qPrintable(QString("n=%1 spread=%2 i=%3: %4, want %5")
                                .arg(n)
                                .arg(spread)
                                .arg(i)
                                .arg(static_cast<double>(y[i]), 0, 'g', 9)
                                .arg(want, 0, 'g', 9)));
      }
      if (spread == 0.0f && n > 2) QCOMPARE(y[0], 1.0f / static_cast<float>(n - 1));
    }
  }
}

// argmax (scalar and AVX2) against the definition written out here: the lowest index holding the
// largest non-NaN value, 0 when there is none. Rows with repeated maxima (one value drawn from a
// few levels), NaNs and infinities, at lengths around the 8- and 32-wide loops and a vocabulary.
void KernelTest::argmax_finds_the_first_maximum() {
  auto expected = [](const std::vector<float>& x) {
    float best = 0;
    bool any = false;
    for (const float v : x)
      if (!std::isnan(v) && (!any || v > best)) best = v, any = true;
    if (!any) return int64_t{0};
    for (size_t i = 0; i < x.size(); ++i)
      if (x[i] == best) return static_cast<int64_t>(i);
    return int64_t{0};
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::mt19937 rng(11);
  std::vector<std::vector<float>> rows = {{}, {nan}, {nan, nan, nan}, {-inf, -inf}, {nan, -inf, 3},
                                          {inf, nan, inf}, {1, 2, 2, 1}};
  for (int64_t n : {1, 7, 8, 9, 31, 32, 33, 63, 64, 65, 100, 49152}) {
    for (int kind = 0; kind < 4; ++kind) {
      std::vector<float> x = uniform_floats(rng, n, -10.0f, 10.0f);
      std::uniform_int_distribution<int64_t> at(0, n - 1);
      if (kind == 1)  // few levels: many ties for the maximum
        for (float& v : x) v = std::floor(v / 5.0f);
      if (kind == 2)
        for (int k = 0; k < 1 + n / 10; ++k) x[static_cast<size_t>(at(rng))] = nan;
      if (kind == 3) x[static_cast<size_t>(at(rng))] = inf, x[static_cast<size_t>(at(rng))] = nan;
      rows.push_back(std::move(x));
    }
  }
  for (const std::vector<float>& x : rows) {
    const int64_t n = static_cast<int64_t>(x.size());
    const int64_t want = expected(x);
    QCOMPARE(argmax_scalar(x.data(), n), want);
    if (cpu_features().avx2) QCOMPARE(argmax_avx2(x.data(), n), want);
    QCOMPARE(argmax(x.data(), n), want);
  }
}

// The families' RoPE: rope_table_scaled against angle_i = pos·s / (base^(2i/rot_dim)·f_i) in
// double with cos, sin times the attention factor (1.5e-7 of that factor, as rope_table's bound);
// with s = 1, no factors and a factor of 1 it is rope_table bit for bit. rope_halves pairs
// (x[i], x[i + rot_dim/2]) and rotates them as rope does its adjacent pairs, with rope's bound.
void KernelTest::rope_variants_match_formula() {
  constexpr int n_heads = 2, head_dim = 64;
  std::mt19937 rng(12);
  for (int rot_dim : {64, 32}) {
    std::vector<float> factors(rot_dim / 2);
    for (int i = 0; i < rot_dim / 2; ++i) factors[i] = 1.0f + 7.0f * i / (rot_dim / 2 - 1);
    for (int64_t pos : {0, 3, 511, 70000}) {
      std::vector<float> c0(rot_dim / 2), s0(rot_dim / 2), c(rot_dim / 2), s(rot_dim / 2);
      rope_table(pos, rot_dim, 10000.0f, c0.data(), s0.data());
      rope_table_scaled(pos, rot_dim, 10000.0f, 1.0f, nullptr, 1.0f, c.data(), s.data());
      QVERIFY(c == c0 && s == s0);
      rope_table_scaled(pos, rot_dim, 1000000.0f, 0.125f, factors.data(), 1.19f, c.data(),
                        s.data());
      std::vector<double> angle(rot_dim / 2);
      for (int i = 0; i < rot_dim / 2; ++i) {
        angle[i] = static_cast<double>(pos) * 0.125 /
                   (std::pow(1000000.0, 2.0 * i / rot_dim) * static_cast<double>(factors[i]));
        QVERIFY(std::fabs(c[i] - 1.19 * std::cos(angle[i])) <= 1.19 * 1.5e-7 + 1e-7);
        QVERIFY(std::fabs(s[i] - 1.19 * std::sin(angle[i])) <= 1.19 * 1.5e-7 + 1e-7);
      }
      rope_table(pos, rot_dim, 10000.0f, c.data(), s.data());
      const std::vector<float> x0 = uniform_floats(rng, n_heads * head_dim, -4.0f, 4.0f);
      std::vector<float> x = x0;
      rope_halves(x.data(), n_heads, head_dim, rot_dim, c.data(), s.data());
      const int half = rot_dim / 2;
      for (int h = 0; h < n_heads; ++h) {
        const int b0 = h * head_dim;
        for (int i = 0; i < half; ++i) {
          const double a = x0[b0 + i], b = x0[b0 + i + half];
          const double tol = 8 * kF32Eps * (std::fabs(a) + std::fabs(b));
          const double cc = std::cos(static_cast<double>(pos) / std::pow(10000.0, 2.0 * i / rot_dim));
          const double ss = std::sin(static_cast<double>(pos) / std::pow(10000.0, 2.0 * i / rot_dim));
          QVERIFY(std::fabs(x[b0 + i] - (a * cc - b * ss)) <= tol + 4e-7 * (std::fabs(a) + std::fabs(b)));
          QVERIFY(std::fabs(x[b0 + i + half] - (a * ss + b * cc)) <= tol + 4e-7 * (std::fabs(a) + std::fabs(b)));
        }
        for (int i = rot_dim; i < head_dim; ++i) QCOMPARE(x[b0 + i], x0[b0 + i]);
      }
    }
  }
}

// gelu_tanh_mul against g/2·(1 + tanh(√(2/π)(g + 0.044715 g³)))·u in double, and softcap against
// c·tanh(x/c): a handful of f32 roundings around std::tanh, relative 1e-6 plus 1e-30 absolute.
void KernelTest::gelu_and_softcap_match_formula() {
  std::mt19937 rng(13);
  const std::vector<float> g = uniform_floats(rng, 1001, -12.0f, 12.0f);
  const std::vector<float> u = uniform_floats(rng, 1001, -3.0f, 3.0f);
  std::vector<float> y = g;
  gelu_tanh_mul(y.data(), u.data(), static_cast<int64_t>(y.size()));
  for (size_t i = 0; i < g.size(); ++i) {
    const double x = g[i];
    const double want = 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))) * u[i];
    QVERIFY2(std::fabs(y[i] - want) <= 1e-6 * std::fabs(x * u[i]) + 1e-30,
             qPrintable(QString("gelu at %1: %2 against %3").arg(x).arg(y[i]).arg(want)));
  }
  for (float cap : {50.0f, 30.0f, 3.0f}) {
    std::vector<float> z = uniform_floats(rng, 1001, -200.0f, 200.0f);
    const std::vector<float> z0 = z;
    softcap(z.data(), static_cast<int64_t>(z.size()), cap);
    for (size_t i = 0; i < z.size(); ++i) {
      const double want = cap * std::tanh(static_cast<double>(z0[i]) / cap);
      QVERIFY(std::fabs(z[i] - want) <= 1e-6 * cap);
      QVERIFY(std::fabs(z[i]) <= cap);
    }
  }
}
