// The quantizers: weight formats (quantize_row_*) within the error their format allows, and the
// activation quantizer (BlockQ8A) against its definition, its AVX2 version against the scalar
// one bit for bit.

#include <QtTest>
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/quantize.h"
#include "tests/kernels/kernel_test.h"

using namespace tokenfab::kernels;
using tokenfab::kernels::test::kF32Eps;

// ---------------------------------------------------------------------------------------------
// Weight formats

namespace {

enum class Fill { Uniform, Wide, Small, Outlier, Positive, Constant, Zero, OnGrid };

// Blocks of 32 values; OnGrid blocks hold values the format represents exactly, with the scale
// (and minimum) the quantizer will pick exact in fp16, so quantize → dequantize is the identity.
std::vector<float> make_weights(WeightType type, Fill fill, int64_t n, std::mt19937& rng) {
  using tokenfab::kernels::test::uniform_floats;
  std::vector<float> x(static_cast<size_t>(n));
  std::uniform_int_distribution<int> q_dist(0, 15), q8_dist(-127, 127);
  for (int64_t b = 0; b < n / kQK; ++b) {
    float* blk = x.data() + b * kQK;
    std::vector<float> u;
    switch (fill) {
      case Fill::Uniform:
        u = uniform_floats(rng, kQK, -1.0f, 1.0f);
        break;
      case Fill::Wide:
        u = uniform_floats(rng, kQK, -1000.0f, 1000.0f);
        break;
      case Fill::Small:
        u = uniform_floats(rng, kQK, -1e-3f, 1e-3f);
        break;
      case Fill::Positive:
        u = uniform_floats(rng, kQK, 2.0f, 3.0f);
        break;
      case Fill::Outlier:
        u = uniform_floats(rng, kQK, -0.1f, 0.1f);
        u[b % kQK] = (b % 2 ? 50.0f : -50.0f);
        break;
      case Fill::Constant:
        u.assign(kQK, 0.1f * static_cast<float>(b - 3));
        break;
      case Fill::Zero:
        u.assign(kQK, 0.0f);
        break;
      case Fill::OnGrid:
        u.resize(kQK);
        if (type == WeightType::Q8_0) {  // d = 63.5 / 127 = 0.5
          for (float& v : u) v = 0.5f * static_cast<float>(q8_dist(rng));
          u[b % kQK] = (b % 2 ? 63.5f : -63.5f);
        } else if (type == WeightType::Q4_0) {  // d = -2 / -8 = 0.25
          for (float& v : u) v = 0.25f * static_cast<float>(q_dist(rng) - 8);
          u[b % kQK] = -2.0f;
        } else {  // Q4_1: m = -1, d = (0.875 + 1) / 15 = 0.125
          for (float& v : u) v = -1.0f + 0.125f * static_cast<float>(q_dist(rng));
          u[b % kQK] = -1.0f;
          u[(b + 1) % kQK] = 0.875f;
        }
        break;
    }
    std::copy(u.begin(), u.end(), blk);
  }
  return x;
}

// Largest |fp16(v) − v| for round-to-nearest, from the format: half an ulp, which is 2^-25 in
// the subnormal range (|v| < 2^-14) and 2^(e − 11) for |v| in [2^e, 2^(e+1)). Worked out here
// rather than by calling fp32_to_fp16, so that a conversion bug cannot widen the bound.
double fp16_half_ulp(double v) {
  v = std::fabs(v);
  if (v < 0x1p-14) return 0x1p-25;
  return std::ldexp(1.0, static_cast<int>(std::floor(std::log2(v))) - 11);
}

double error_bound(WeightType type, const float* blk, float x) {
  double amax = 0, max = 0, lo = blk[0], hi = blk[0];
  for (int i = 0; i < kQK; ++i) {
    if (std::fabs(blk[i]) > amax) {
      amax = std::fabs(blk[i]);
      max = blk[i];
    }
    lo = std::min<double>(lo, blk[i]);
    hi = std::max<double>(hi, blk[i]);
  }
  const double slack = 8 * kF32Eps * amax;
  switch (type) {
    case WeightType::Q8_0: {
      const double d = amax / 127;
      return d / 2 + 127 * fp16_half_ulp(d) + slack;
    }
    case WeightType::Q4_0: {
      const double d = max / -8;
      const double t = d != 0 ? x / d : 0;
      return std::fabs(d) * std::max(0.5, t - 7) + 8 * fp16_half_ulp(d) + slack;
    }
    case WeightType::Q4_1: {
      const double d = (hi - lo) / 15;
      return d / 2 + 15 * fp16_half_ulp(d) + fp16_half_ulp(lo) + slack;
    }
    default:
      return 0;
  }
}

}  // namespace

void KernelTest::quantize_dequantize_error_is_bounded_data() {
  QTest::addColumn<WeightType>("type");
  QTest::addColumn<int>("fill");
  const struct {
    const char* name;
    Fill fill;
  } fills[] = {{"uniform", Fill::Uniform},   {"wide", Fill::Wide},
               {"small", Fill::Small},       {"outlier", Fill::Outlier},
               {"positive", Fill::Positive}, {"constant", Fill::Constant},
               {"zero", Fill::Zero},         {"on grid (exact)", Fill::OnGrid}};
  for (WeightType type : {WeightType::Q4_0, WeightType::Q4_1, WeightType::Q8_0}) {
    for (const auto& f : fills) {
      QTest::addRow("%s %s", weight_type_name(type), f.name) << type << static_cast<int>(f.fill);
    }
  }
}

void KernelTest::quantize_dequantize_error_is_bounded() {
  QFETCH(WeightType, type);
  QFETCH(int, fill);
  constexpr int64_t n = 64 * kQK;
  std::mt19937 rng(1234 + fill);
  const std::vector<float> x = make_weights(type, static_cast<Fill>(fill), n, rng);
  std::vector<uint8_t> blocks(row_bytes(type, n));
  quantize_row(type, x.data(), blocks.data(), n);
  std::vector<float> y(n);
  dequantize_row(type, blocks.data(), y.data(), n);

  const bool exact =
      static_cast<Fill>(fill) == Fill::OnGrid || static_cast<Fill>(fill) == Fill::Zero;
  double worst = 0;  // largest error as a fraction of its bound
  for (int64_t i = 0; i < n; ++i) {
    const float* blk = x.data() + i / kQK * kQK;
    const double err = std::fabs(static_cast<double>(y[i]) - x[i]);
    const double bound = exact ? 0.0 : error_bound(type, blk, x[i]);
    if (!(err <= bound)) {
      QFAIL(qPrintable(QString("element %1: x = %2, dequantized %3, error %4 > bound %5")
                           .arg(i)
                           .arg(static_cast<double>(x[i]), 0, 'g', 9)
                           .arg(static_cast<double>(y[i]), 0, 'g', 9)
                           .arg(err, 0, 'g', 3)
                           .arg(bound, 0, 'g', 3)));
    }
    if (bound > 0) worst = std::max(worst, err / bound);
  }
  // On plain uniform data the bound must also be tight, or this test would prove little.
  if (static_cast<Fill>(fill) == Fill::Uniform) QVERIFY2(worst > 0.5, "the bound is too loose");
}

// ---------------------------------------------------------------------------------------------
// Activation quantizer (BlockQ8A)

namespace {

// Blocks of activation-like data, each named case chosen to reach a different corner of the
// quantizer: exact zeros (d = 0), values near the f32 limits, ties at x·127/amax = k + ½ (both
// versions round half to even), subnormals, and magnitudes below 127/FLT_MAX, where 127/amax
// overflows to inf.
std::vector<float> make_activations(const QString& kind, int64_t n, std::mt19937& rng) {
  using tokenfab::kernels::test::uniform_floats;
  std::vector<float> x = uniform_floats(rng, static_cast<size_t>(n), -1.0f, 1.0f);
  float scale = 1.0f;
  if (kind == "uniform") {
    scale = 3.0f;
  } else if (kind == "huge") {
    scale = 3e38f;
  } else if (kind == "tiny normal") {
    scale = 1e-30f;
  } else if (kind == "below 127/FLT_MAX") {
    scale = 2e-37f;
  } else if (kind == "subnormal") {
    scale = 1e-40f;
  }
  for (float& v : x) v *= scale;
  if (kind == "zeros") {
    for (int64_t i = 0; i < n; ++i) x[i] = (i / kQK) % 2 ? 0.0f : -0.0f;
    x[n - 1] = 1.0f;  // one non-zero block at the end
  } else if (kind == "ties") {
    // amax = 127 gives 127/amax = 1 exactly, so x = k + ½ is an exact tie.
    for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 64 - 32) + 0.5f;
    for (int64_t b = 0; b < n / kQK; ++b) x[b * kQK + 7] = (b % 2) ? 127.0f : -127.0f;
  } else if (kind == "mixed") {
    for (int64_t b = 0; b < n / kQK; ++b) x[b * kQK + b % kQK] = (b % 2 ? 1e30f : -1e30f);
  }
  return x;
}

}  // namespace

void KernelTest::q8a_avx2_matches_scalar_bitwise_data() {
  QTest::addColumn<QString>("kind");
  if (!cpu_features().avx2) {
    QTest::newRow("no AVX2") << QString();  // one row, which skips
    return;
  }
  for (const char* kind : {"uniform", "zeros", "ties", "huge", "tiny normal", "mixed", "subnormal",
                           "below 127/FLT_MAX"}) {
    QTest::newRow(kind) << QString(kind);
  }
}

void KernelTest::q8a_avx2_matches_scalar_bitwise() {
  if (!cpu_features().avx2) QSKIP("this CPU has no AVX2 (or TOKENFAB_FORCE_SCALAR=1)");
  QFETCH(QString, kind);
  constexpr int64_t n = 16 * kQK;
  std::mt19937 rng(99);
  const std::vector<float> x = make_activations(kind, n, rng);
  std::vector<BlockQ8A> scalar(n / kQK), avx2(n / kQK);
  std::memset(scalar.data(), 0xAB, scalar.size() * sizeof(BlockQ8A));
  std::memset(avx2.data(), 0xCD, avx2.size() * sizeof(BlockQ8A));
  quantize_row_q8a_scalar(x.data(), scalar.data(), n);
  quantize_row_q8a_avx2(x.data(), avx2.data(), n);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const BlockQ8A& s = scalar[b];
    const BlockQ8A& a = avx2[b];
    if (std::memcmp(&s, &a, sizeof s) == 0) continue;
    QString qs_s, qs_a;
    for (int i = 0; i < kQK; ++i) {
      qs_s += QString::number(s.qs[i]) + " ";
      qs_a += QString::number(a.qs[i]) + " ";
    }
    QFAIL(
        qPrintable(QString("block %1 (x[0] = %2): scalar d=%3 s=%4 qs=[%5], avx2 d=%6 s=%7 qs=[%8]")
                       .arg(b)
                       .arg(static_cast<double>(x[b * kQK]), 0, 'g', 9)
                       .arg(static_cast<double>(s.d), 0, 'g', 9)
                       .arg(static_cast<double>(s.s), 0, 'g', 9)
                       .arg(qs_s.trimmed())
                       .arg(static_cast<double>(a.d), 0, 'g', 9)
                       .arg(static_cast<double>(a.s), 0, 'g', 9)
                       .arg(qs_a.trimmed())));
  }
}

// The scalar activation quantizer is the reference for the AVX2 one and for every quantized
// gemm, so its own output is checked against the definition: d = amax/127, q = round(x/d) in
// −127..127, so |x − q·d| ≤ d/2 plus the f32 arithmetic: 4 ulps of amax for 127/amax and x·id,
// and 127 · 2^-150 for d itself, which is subnormal below amax = 127 · 2^-126. s = d·Σq.
void KernelTest::q8a_scalar_error_is_bounded() {
  constexpr int64_t n = 16 * kQK;
  for (const char* kind :
       {"uniform", "zeros", "ties", "huge", "tiny normal", "mixed", "below 127/FLT_MAX"}) {
    std::mt19937 rng(7);
    const std::vector<float> x = make_activations(kind, n, rng);
    std::vector<BlockQ8A> y(n / kQK);
    quantize_row_q8a_scalar(x.data(), y.data(), n);
    for (int64_t b = 0; b < n / kQK; ++b) {
      const float* xb = x.data() + b * kQK;
      double amax = 0;
      for (int i = 0; i < kQK; ++i) amax = std::max<double>(amax, std::fabs(xb[i]));
      QCOMPARE(std::bit_cast<uint32_t>(y[b].d),
               std::bit_cast<uint32_t>(static_cast<float>(amax) / 127.0f));
      int sum = 0;
      for (int i = 0; i < kQK; ++i) {
        const double err = std::fabs(xb[i] - static_cast<double>(y[b].qs[i]) * y[b].d);
        QVERIFY2(y[b].qs[i] >= -127 && err <= y[b].d / 2.0 + 4 * kF32Eps * amax + 127 * 0x1p-150,
                 qPrintable(QString("%1 block %2 element %3: x = %4, q = %5, d = %6")
                                .arg(kind)
                                .arg(b)
                                .arg(i)
                                .arg(static_cast<double>(xb[i]), 0, 'g', 9)
                                .arg(y[b].qs[i])
                                .arg(static_cast<double>(y[b].d), 0, 'g', 9)));
        sum += y[b].qs[i];
      }
      QCOMPARE(std::bit_cast<uint32_t>(y[b].s),
               std::bit_cast<uint32_t>(y[b].d * static_cast<float>(sum)));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The searched weight quantizers: Q5_0, Q5_1, the K-quants, IQ4_NL, IQ4_XS.

namespace {

constexpr WeightType kSearchedTypes[] = {WeightType::Q5_0, WeightType::Q5_1,   WeightType::Q2_K,
                                         WeightType::Q3_K, WeightType::Q4_K,   WeightType::Q5_K,
                                         WeightType::Q6_K, WeightType::IQ4_NL, WeightType::IQ4_XS};

// Weight-like rows: Gaussian (σ = 0.02), or heavy-tailed (Student's t with 3 degrees of
// freedom, scaled alike), where a few large values per block stretch the plain scale.
std::vector<float> weight_row(bool heavy_tailed, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> gauss(0.0f, 0.02f);
  std::student_t_distribution<float> student(3.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = heavy_tailed ? 0.02f * student(rng) : gauss(rng);
  return x;
}

double sum_squares(const std::vector<float>& x) {
  double s = 0;
  for (float v : x) s += static_cast<double>(v) * v;
  return s;
}

// Σ (dequantize(quantize(x)) − x)².
double round_trip_error(WeightType type, const std::vector<float>& x) {
  const auto n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> q(row_bytes(type, n));
  quantize_row(type, x.data(), q.data(), n);
  std::vector<float> y(x.size());
  dequantize_row(type, q.data(), y.data(), n);
  double e = 0;
  for (size_t i = 0; i < x.size(); ++i) e += (static_cast<double>(y[i]) - x[i]) * (y[i] - x[i]);
  return e;
}

// Plain max-scaling, in double and with every scale kept exact (no fp16, no 4/6/8-bit
// sub-block scales: a baseline with an advantage the real formats do not have). Per block of
// `sub` values: linear levels [lo, hi] with the value of largest magnitude on `lo` (symmetric
// formats), or levels 0..hi from min (min ≤ 0 for the K-quants) to max; or the IQ4 table with
// the value of largest magnitude on −127.
struct Plain {
  enum Kind { Symmetric, MinMax, MinMaxAtMostZero, IQ4 } kind;
  int sub, lo, hi;
};

Plain plain_for(WeightType type) {
  switch (type) {
    case WeightType::Q5_0: return {Plain::Symmetric, 32, -16, 15};
    case WeightType::Q5_1: return {Plain::MinMax, 32, 0, 31};
    case WeightType::Q2_K: return {Plain::MinMaxAtMostZero, 16, 0, 3};
    case WeightType::Q3_K: return {Plain::Symmetric, 16, -4, 3};
    case WeightType::Q4_K: return {Plain::MinMaxAtMostZero, 32, 0, 15};
    case WeightType::Q5_K: return {Plain::MinMaxAtMostZero, 32, 0, 31};
    case WeightType::Q6_K: return {Plain::Symmetric, 16, -32, 31};
    default: return {Plain::IQ4, 32, 0, 15};  // IQ4_NL, IQ4_XS
  }
}

double plain_error(WeightType type, const std::vector<float>& x) {
  const Plain p = plain_for(type);
  double e = 0;
  for (size_t b = 0; b < x.size(); b += p.sub) {
    const float* v = x.data() + b;
    double lo = v[0], hi = v[0], vmax = 0;
    for (int i = 0; i < p.sub; ++i) {
      lo = std::min<double>(lo, v[i]);
      hi = std::max<double>(hi, v[i]);
      if (std::fabs(v[i]) > std::fabs(vmax)) vmax = v[i];
    }
    if (p.kind == Plain::MinMaxAtMostZero) lo = std::min(lo, 0.0);
    for (int i = 0; i < p.sub; ++i) {
      double y = 0;
      if (p.kind == Plain::Symmetric) {
        const double d = vmax / p.lo;
        y = d == 0 ? 0 : d * std::clamp(std::nearbyint(v[i] / d), double(p.lo), double(p.hi));
      } else if (p.kind == Plain::IQ4) {
        const double d = vmax / -127.0;
        double best = INFINITY;
        for (const int8_t k : kIQ4Values) {
          if (std::fabs(d * k - v[i]) < std::fabs(best - v[i])) best = d * k;
        }
        y = d == 0 ? 0 : best;
      } else {
        const double d = (hi - lo) / p.hi;
        y = d == 0 ? lo : lo + d * std::clamp(std::nearbyint((v[i] - lo) / d), 0.0, double(p.hi));
      }
      e += (y - v[i]) * (y - v[i]);
    }
  }
  return e;
}

}  // namespace

// RMS error relative to the RMS of the data, on 256 super-blocks (65,536 values). The bounds are
// the errors measured when the quantizers were written (2026-12-05, gcc 12 on x86-64; in the
// comments, Gaussian / heavy-tailed) plus 5 %, so that a change that makes a quantizer worse
// fails here. They agree with the uniform-quantization estimate step/√12: a Gaussian block of 16
// spans about ±1.8σ, so Q6_K's 64 levels give a step of 3.6σ/63 and an error of 0.0165σ; with
// the search below plain max-scaling (the next test logs both).
void KernelTest::searched_quantizers_error_is_bounded_data() {
  QTest::addColumn<WeightType>("type");
  QTest::addColumn<bool>("heavy_tailed");
  QTest::addColumn<double>("bound");
  const struct {
    WeightType type;
    double gauss, heavy;
  } bounds[] = {
      {WeightType::Q5_0, 0.0422, 0.0642},    // 0.0401 / 0.0611
      {WeightType::Q5_1, 0.0352, 0.0449},    // 0.0335 / 0.0427
      {WeightType::Q2_K, 0.2765, 0.2879},    // 0.2633 / 0.2741
      {WeightType::Q3_K, 0.1510, 0.1782},    // 0.1438 / 0.1697
      {WeightType::Q4_K, 0.0738, 0.0892},    // 0.0702 / 0.0849
      {WeightType::Q5_K, 0.0363, 0.0460},    // 0.0345 / 0.0438
      {WeightType::Q6_K, 0.0175, 0.0255},    // 0.0166 / 0.0242
      {WeightType::IQ4_NL, 0.0779, 0.0974},  // 0.0741 / 0.0927
      {WeightType::IQ4_XS, 0.0784, 0.0985},  // 0.0746 / 0.0938
  };
  for (const auto& b : bounds) {
    QTest::addRow("%s gaussian", weight_type_name(b.type)) << b.type << false << b.gauss;
    QTest::addRow("%s heavy-tailed", weight_type_name(b.type)) << b.type << true << b.heavy;
  }
}

void KernelTest::searched_quantizers_error_is_bounded() {
  QFETCH(WeightType, type);
  QFETCH(bool, heavy_tailed);
  QFETCH(double, bound);
  constexpr int64_t n = 256 * kQK_K;
  const std::vector<float> x = weight_row(heavy_tailed, n, 42);
  const double rel = std::sqrt(round_trip_error(type, x) / sum_squares(x));
  qInfo("%s %s: relative RMS error %.4f (bound %.4f)", weight_type_name(type),
        heavy_tailed ? "heavy-tailed" : "gaussian", rel, bound);
  QVERIFY2(rel <= bound, qPrintable(QString("relative RMS error %1 > %2").arg(rel).arg(bound)));
  // The quantized rows are well formed: finite scales.
  std::vector<uint8_t> q(row_bytes(type, n));
  quantize_row(type, x.data(), q.data(), n);
  QCOMPARE(QString::fromStdString(describe_bad_block(type, q.data(), n)), QString());
}

// What the search is for: with its scales rounded to fp16 and to 4/6/8-bit sub-block integers,
// each quantizer still has a lower squared error than plain max-scaling with exact scales.
void KernelTest::searched_quantizers_beat_plain_max_scaling_data() {
  QTest::addColumn<WeightType>("type");
  QTest::addColumn<bool>("heavy_tailed");
  for (WeightType type : kSearchedTypes) {
    QTest::addRow("%s gaussian", weight_type_name(type)) << type << false;
    QTest::addRow("%s heavy-tailed", weight_type_name(type)) << type << true;
  }
}

void KernelTest::searched_quantizers_beat_plain_max_scaling() {
  QFETCH(WeightType, type);
  QFETCH(bool, heavy_tailed);
  constexpr int64_t n = 256 * kQK_K;
  const std::vector<float> x = weight_row(heavy_tailed, n, 7);
  const double ours = std::sqrt(round_trip_error(type, x) / sum_squares(x));
  const double plain = std::sqrt(plain_error(type, x) / sum_squares(x));
  qInfo("%s %s: relative RMS error %.4f, plain max-scaling %.4f", weight_type_name(type),
        heavy_tailed ? "heavy-tailed" : "gaussian", ours, plain);
  QVERIFY2(ours < plain, qPrintable(QString("searched %1 ≥ plain %2").arg(ours).arg(plain)));
}

// Each block depends on its own values only (so rows can be quantized in any split, by any
// number of threads), the same input gives the same bytes, and zeros stay exact zeros.
void KernelTest::searched_quantizers_are_blockwise_and_keep_zeros_data() {
  QTest::addColumn<WeightType>("type");
  for (WeightType type : kSearchedTypes) QTest::newRow(weight_type_name(type)) << type;
}

void KernelTest::searched_quantizers_are_blockwise_and_keep_zeros() {
  QFETCH(WeightType, type);
  const int64_t block = block_elements(type);
  const int64_t n = 8 * block;
  std::vector<float> x = weight_row(true, n, 3);
  std::fill(x.begin() + 2 * block, x.begin() + 4 * block, 0.0f);  // blocks 2 and 3: zeros
  std::vector<uint8_t> whole(row_bytes(type, n)), again(whole.size()), split(whole.size());
  quantize_row(type, x.data(), whole.data(), n);
  quantize_row(type, x.data(), again.data(), n);
  QVERIFY(whole == again);
  for (int64_t b = 0; b < n / block; ++b) {
    quantize_row(type, x.data() + b * block, split.data() + b * block_bytes(type), block);
  }
  QVERIFY(whole == split);
  std::vector<float> y(static_cast<size_t>(n));
  dequantize_row(type, whole.data(), y.data(), n);
  for (int64_t i = 2 * block; i < 4 * block; ++i) {
    QVERIFY2(y[i] == 0.0f, qPrintable(QString("element %1: %2").arg(i).arg(y[i])));
  }
}
