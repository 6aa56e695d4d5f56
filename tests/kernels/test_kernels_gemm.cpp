// The matmul kernels, for every weight type: gemm_scalar against a double-precision reference
// built from dequantize_row, gemm_avx2 and the x8 kernels against gemm_scalar, the AVX-512 VNNI
// x8 kernel against the AVX2 one bit for bit (where the CPU has VNNI), and the threaded matmul()
// against per-job gemm_scalar (registered twice: as the CPU dispatches, and capped at AVX2).
//
// Tolerances are measured against mag = Σ_i (|w_i| + 2·|bias_i|)·|x_i|, which bounds every
// intermediate the kernels form: a block's terms d·d_a·Σq·q_a and bias·s, where bias_i is the
// part of weight i that the kernels form as a float term of its own — −8d (Q4_0), −16d (Q5_0),
// m (Q4_1, Q5_1), −dmin·m_s (Q4_K, Q5_K: per 32 elements; Q2_K: per 16) — satisfy
// |d·sc·q| ≤ |w| + |bias| (w = d·sc·q + bias). The other types' offsets (Q6_K's q − 32, Q3_K's
// q − 4, the IQ4 values' + 128 in the VNNI kernels, Q8_0's likewise) are taken inside the exact
// integer sums, so no float intermediate of theirs exceeds Σ|w_i|·|x_i|: bias 0. Rounding errors
// scale with mag, not with the result, which can cancel to near zero.

#include <QtTest>
#include <bit>
#include <cmath>
#include <cstring>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cpu/repack.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/kernels/kernel_test.h"

using namespace tokenfab::kernels;
using tokenfab::kernels::test::kF32Eps;
using tokenfab::kernels::test::uniform_floats;

namespace {

constexpr int64_t kMaxRows = 200;
constexpr int64_t kMaxCols = 70;
constexpr int64_t kRowCounts[] = {1, 7, 13, 33, 8, 16, 64, 200};
constexpr int64_t kColCounts[] = {1, 2, 3, 5, 9, 70};
constexpr size_t kRowPad = 32;  // bytes after each weight / activation row: strides are honoured
// Marks y cells the kernels must not write (the ldy padding); a NaN no kernel produces.
constexpr uint32_t kUntouched = 0x7FC0DEADu;

// Where a block type keeps its fp16 scales: d's byte offset, and the second scale's (m or dmin;
// -1: none).
struct ScaleOffsets {
  int d, second;
};
ScaleOffsets scale_offsets(WeightType type) {
  switch (type) {
    case WeightType::Q4_1:
    case WeightType::Q5_1:
    case WeightType::Q4_K:
    case WeightType::Q5_K:
      return {0, 2};
    case WeightType::Q2_K:
      return {offsetof(BlockQ2_K, d), offsetof(BlockQ2_K, dmin)};
    case WeightType::Q3_K:
      return {offsetof(BlockQ3_K, d), -1};
    case WeightType::Q6_K:
      return {offsetof(BlockQ6_K, d), -1};
    default:
      return {0, -1};
  }
}

// `rows` weight rows of k elements, `stride` bytes apart. Quantized blocks get random bytes
// (every level, sub-block scale and minimum, Q8_0's −128 included) and random finite fp16 scales
// of either sign, so the kernels see the whole format, not just what our quantizer emits.
std::vector<uint8_t> random_weights(WeightType type, int64_t rows, int64_t k, size_t stride,
                                    std::mt19937& rng) {
  std::vector<uint8_t> w(rows * stride, 0xEE);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.002f, 0.05f), minimum(-0.5f, 0.5f);
  const size_t block = static_cast<size_t>(block_bytes(type));
  const ScaleOffsets at = scale_offsets(type);
  const bool super = block_elements(type) == kQK_K;
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = w.data() + r * stride;
    if (!is_block_quantized(type)) {
      const std::vector<float> v = uniform_floats(rng, static_cast<size_t>(k), -1.0f, 1.0f);
      quantize_row(type, v.data(), row, k);
      continue;
    }
    for (int64_t b = 0; b < k / block_elements(type); ++b) {
      uint8_t* blk = row + b * block;
      for (size_t i = 0; i < block; ++i) blk[i] = static_cast<uint8_t>(byte(rng));
      const uint16_t d = fp32_to_fp16(byte(rng) % 2 ? scale(rng) : -scale(rng));
      std::memcpy(blk + at.d, &d, 2);
      if (at.second >= 0) {
        // Q4_1 / Q5_1: the minimum itself; the K-quants: the scale of their 4- or 6-bit minimums.
        const float v = super ? (byte(rng) % 2 ? scale(rng) : -scale(rng)) : minimum(rng);
        const uint16_t m = fp32_to_fp16(v);
        std::memcpy(blk + at.second, &m, 2);
      }
    }
  }
  return w;
}

// |bias| of element i of a row (see the file comment).
double element_bias(WeightType type, const uint8_t* row, int64_t i) {
  const uint8_t* blk = row + i / block_elements(type) * block_bytes(type);
  const ScaleOffsets at = scale_offsets(type);
  uint16_t d, second = 0;
  std::memcpy(&d, blk + at.d, 2);
  if (at.second >= 0) std::memcpy(&second, blk + at.second, 2);
  const int e = static_cast<int>(i % kQK_K);
  switch (type) {
    case WeightType::Q4_0:
      return 8 * std::fabs(fp16_to_fp32(d));
    case WeightType::Q5_0:
      return 16 * std::fabs(fp16_to_fp32(d));
    case WeightType::Q4_1:
    case WeightType::Q5_1:
      return std::fabs(fp16_to_fp32(second));
    case WeightType::Q4_K:
    case WeightType::Q5_K: {
      const auto& q = reinterpret_cast<const BlockQ4_K*>(blk)->scales;  // same place in Q5_K
      const int s = e / 32;
      const int m = s < 4 ? q[s + 4] & 63 : (q[s + 4] >> 4) | (q[s] >> 6) << 4;
      return std::fabs(fp16_to_fp32(second)) * m;
    }
    case WeightType::Q2_K:
      return std::fabs(fp16_to_fp32(second)) *
             (reinterpret_cast<const BlockQ2_K*>(blk)->scales[e / 16] >> 4);
    default:
      return 0;
  }
}

// Activations: cols rows of k f32 with a different magnitude per row; row 3 is all zeros and
// every seventh block of the others is zero (d = 0 blocks).
std::vector<float> random_activations(int64_t cols, int64_t k, int64_t ldx, std::mt19937& rng) {
  std::vector<float> x(cols * ldx, 0.0f);
  for (int64_t c = 0; c < cols; ++c) {
    const float s = std::pow(10.0f, static_cast<float>(c % 5) - 2.0f);
    const std::vector<float> v = uniform_floats(rng, static_cast<size_t>(k), -s, s);
    std::copy(v.begin(), v.end(), x.begin() + c * ldx);
    for (int64_t b = 0; b < k / kQK; ++b) {
      if (c == 3 || (b + c) % 7 == 0) std::fill_n(x.begin() + c * ldx + b * kQK, kQK, 0.0f);
    }
  }
  return x;
}

// Activations in the layout the kernels read for `type`, `stride` bytes apart, and the values
// those bytes stand for (Q8A: q·d, exact in double) as (cols, k) doubles.
struct Activations {
  std::vector<uint8_t> bytes;
  size_t stride;
  std::vector<double> values;
};

Activations convert_activations(WeightType type, const std::vector<float>& x, int64_t ldx,
                                int64_t cols, int64_t k,
                                void (*q8a)(const float*, BlockQ8A*, int64_t)) {
  Activations a;
  a.stride = activation_row_bytes(type, k) + kRowPad;
  a.bytes.assign(cols * a.stride, 0xEE);
  a.values.resize(cols * k);
  for (int64_t c = 0; c < cols; ++c) {
    uint8_t* row = a.bytes.data() + c * a.stride;
    if (is_block_quantized(type)) {
      auto* blocks = reinterpret_cast<BlockQ8A*>(row);
      q8a(x.data() + c * ldx, blocks, k);
      for (int64_t i = 0; i < k; ++i) {
        const BlockQ8A& b = blocks[i / kQK];
        a.values[c * k + i] = static_cast<double>(b.qs[i % kQK]) * b.d;
      }
    } else {
      std::memcpy(row, x.data() + c * ldx, k * sizeof(float));
      for (int64_t i = 0; i < k; ++i) a.values[c * k + i] = x[c * ldx + i];
    }
  }
  return a;
}

// y_ref[c][r] = Σ_i dequantize_row(w_r)_i · x_c,i in double, and mag[c][r] (file comment).
struct Reference {
  std::vector<double> y, mag;  // (cols, rows)
};

Reference reference_gemm(WeightType type, const uint8_t* w, size_t w_stride, int64_t rows,
                         const std::vector<double>& x, int64_t cols, int64_t k) {
  std::vector<double> wf(rows * k), bias(rows * k);
  std::vector<float> row(k);
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(type, w + r * w_stride, row.data(), k);
    for (int64_t i = 0; i < k; ++i) {
      wf[r * k + i] = row[i];
      bias[r * k + i] = std::fabs(row[i]) + 2 * element_bias(type, w + r * w_stride, i);
    }
  }
  Reference ref;
  ref.y.resize(cols * rows);
  ref.mag.resize(cols * rows);
  for (int64_t c = 0; c < cols; ++c) {
    const double* xc = x.data() + c * k;
    for (int64_t r = 0; r < rows; ++r) {
      double y = 0, mag = 0;
      for (int64_t i = 0; i < k; ++i) {
        y += wf[r * k + i] * xc[i];
        mag += bias[r * k + i] * std::fabs(xc[i]);
      }
      ref.y[c * rows + r] = y;
      ref.mag[c * rows + r] = mag;
    }
  }
  return ref;
}

// Compares y (cols, ldy) against `want` (cols, ldy) with |Δ| ≤ rel·mag + 1e-30 and checks the
// ldy padding kept its marker. Returns "" or the first failure.
QString compare_tile(const char* what, const float* y, const std::vector<double>& want,
                     const std::vector<double>& mag, int64_t rows, int64_t cols, int64_t ldy,
                     double rel) {
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t r = 0; r < ldy; ++r) {
      const float got = y[c * ldy + r];
      if (r >= rows) {
        if (std::bit_cast<uint32_t>(got) != kUntouched)
          return QString("%1 wrote y[%2][%3] beyond rows = %4").arg(what).arg(c).arg(r).arg(rows);
        continue;
      }
      const double diff = std::fabs(got - want[c * ldy + r]);
      const double tol = rel * mag[c * ldy + r] + 1e-30;
      if (!(diff <= tol)) {
        return QString("%1 y[%2][%3] = %4, want %5 (|Δ| %6 > tolerance %7)")
            .arg(what)
            .arg(c)
            .arg(r)
            .arg(static_cast<double>(got), 0, 'g', 9)
            .arg(want[c * ldy + r], 0, 'g', 9)
            .arg(diff, 0, 'g', 3)
            .arg(tol, 0, 'g', 3);
      }
    }
  }
  return {};
}

// The avx2 / x8 kernels against gemm_scalar: same integer block sums, different f32 summation
// order (8 lanes, FMA, bias terms summed apart). Order-dependent rounding of random data grows like
// √n·u·mag (< 1e-6·mag at these sizes); a real mistake — a lost or repeated block or element, a
// wrong scale — moves a result by at least one term, ≥ mag/K ≈ 6e-4·mag.
constexpr double kFastVsScalar = 1e-5;

}  // namespace

void KernelTest::gemm_matches_reference_data() {
  QTest::addColumn<WeightType>("type");
  QTest::addColumn<int64_t>("k");
  for (WeightType type :
       {WeightType::F32, WeightType::F16, WeightType::BF16, WeightType::Q4_0, WeightType::Q4_1,
        WeightType::Q8_0, WeightType::Q5_0, WeightType::Q5_1, WeightType::IQ4_NL}) {
    for (int64_t k : {32, 64, 576, 1536}) {
      QTest::addRow("%s k=%lld", weight_type_name(type), static_cast<long long>(k)) << type << k;
    }
  }
  // The super-block types: K a multiple of 256.
  for (WeightType type : {WeightType::Q2_K, WeightType::Q3_K, WeightType::Q4_K, WeightType::Q5_K,
                          WeightType::Q6_K, WeightType::IQ4_XS}) {
    for (int64_t k : {256, 512, 1536}) {
      QTest::addRow("%s k=%lld", weight_type_name(type), static_cast<long long>(k)) << type << k;
    }
  }
}

// For each (rows, cols) in the lists, a tile taken from a 200 × 70 problem at a row and column
// offset (x8: a group boundary), with ldy = rows + 3:
//   (a) gemm_scalar vs the double reference: within (n + 8)·u·mag, the worst case of recursive
//       summation over n terms (n = K products for float weights, K/32 block terms for blocks)
//       plus a few roundings per term (d·d_a, s, the bias product, the integer sum's conversion
//       where it passes 2^24; in the reference, dequantize_row's d·sc, its product with q and
//       the minimum's subtraction);
//   (b) gemm_avx2 vs gemm_scalar, (c) repack_x8 + gemm_x8_avx2 vs gemm_scalar, (d) for Q4
//       weights, gemm_x8_q8b_avx2 on the expanded activations vs gemm_scalar: kFastVsScalar;
//   (e) where the CPU has AVX-512 VNNI, gemm_x8_vnni vs gemm_x8_avx2 and, for tiles of whole
//       16-row groups, repack_x16 + gemm_x16_vnni vs gemm_x8_avx2: bit for bit.
void KernelTest::gemm_matches_reference() {
  QFETCH(WeightType, type);
  QFETCH(int64_t, k);
  const bool avx2 = cpu_features().avx2;
  const bool vnni = cpu_features().avx512_vnni;
  std::mt19937 rng(static_cast<unsigned>(k * 10 + static_cast<int>(type)));
  const size_t w_stride = row_bytes(type, k) + kRowPad;
  const std::vector<uint8_t> w = random_weights(type, kMaxRows, k, w_stride, rng);
  const std::vector<float> xf = random_activations(kMaxCols, k, k, rng);
  const Activations x = convert_activations(type, xf, k, kMaxCols, k, quantize_row_q8a_scalar);
  const Reference ref = reference_gemm(type, w.data(), w_stride, kMaxRows, x.values, kMaxCols, k);

  std::vector<uint8_t> packed;
  if (avx2 && x8_supported(type)) {
    packed.resize(x8_group_stride(type, k) * (kMaxRows / kX8Rows));
    repack_x8(type, w.data(), w_stride, packed.data(), kMaxRows, k);
  }
  const double n_terms = static_cast<double>(is_block_quantized(type) ? k / kQK : k);
  const double ref_rel = (n_terms + 8) * kF32Eps;

  for (int64_t rows : kRowCounts) {
    for (int64_t cols : kColCounts) {
      const int64_t r0 = kMaxRows - rows, c0 = (kMaxCols - cols) / 2, ldy = rows + 3;
      // The tile's reference values and magnitudes, laid out like y.
      std::vector<double> want(cols * ldy), mag(cols * ldy);
      for (int64_t c = 0; c < cols; ++c) {
        for (int64_t r = 0; r < rows; ++r) {
          want[c * ldy + r] = ref.y[(c0 + c) * kMaxRows + r0 + r];
          mag[c * ldy + r] = ref.mag[(c0 + c) * kMaxRows + r0 + r];
        }
      }
      const QString shape = QString(" rows=%1 cols=%2").arg(rows).arg(cols);
      const GemmArgs args{.type = type,
                          .w = w.data() + r0 * w_stride,
                          .w_stride = w_stride,
                          .x = x.bytes.data() + c0 * x.stride,
                          .x_stride = x.stride,
                          .k = k,
                          .y = nullptr,
                          .ldy = ldy,
                          .rows = rows,
                          .cols = cols};

      std::vector<float> y_scalar(cols * ldy, std::bit_cast<float>(kUntouched));
      GemmArgs a = args;
      a.y = y_scalar.data();
      gemm_scalar(a);
      QString err =
          compare_tile("gemm_scalar", y_scalar.data(), want, mag, rows, cols, ldy, ref_rel);
      QVERIFY2(err.isEmpty(), qPrintable(err + shape));
      if (!avx2) continue;

      const std::vector<double> scalar_y(y_scalar.begin(), y_scalar.end());
      std::vector<float> y_avx2(cols * ldy, std::bit_cast<float>(kUntouched));
      a.y = y_avx2.data();
      gemm_avx2(a);
      err = compare_tile("gemm_avx2", y_avx2.data(), scalar_y, mag, rows, cols, ldy, kFastVsScalar);
      QVERIFY2(err.isEmpty(), qPrintable(err + shape));

      if (packed.empty() || rows % kX8Rows != 0) continue;
      const size_t g_stride = x8_group_stride(type, k);
      std::vector<float> y_x8(cols * ldy, std::bit_cast<float>(kUntouched));
      a.w = packed.data() + r0 / kX8Rows * g_stride;
      a.w_stride = g_stride;
      a.y = y_x8.data();
      gemm_x8_avx2(a);
      err =
          compare_tile("gemm_x8_avx2", y_x8.data(), scalar_y, mag, rows, cols, ldy, kFastVsScalar);
      QVERIFY2(err.isEmpty(), qPrintable(err + shape));

      // (e) the VNNI kernel: the same integer sums and float operations as gemm_x8_avx2, so the
      // same bits (untouched padding included).
      if (vnni) {
        std::vector<float> y_vnni(cols * ldy, std::bit_cast<float>(kUntouched));
        a.y = y_vnni.data();
        gemm_x8_vnni(a);
        QVERIFY2(std::memcmp(y_vnni.data(), y_x8.data(), y_x8.size() * sizeof(float)) == 0,
                 qPrintable("gemm_x8_vnni differs from gemm_x8_avx2 bitwise" + shape));
        if (rows % kX16Rows == 0) {
          std::vector<uint8_t> packed16(packed_group_stride(type, kX16Rows, k) *
                                        static_cast<size_t>(rows / kX16Rows));
          repack_x16(type, w.data() + r0 * w_stride, w_stride, packed16.data(), rows, k);
          std::vector<float> y_x16(cols * ldy, std::bit_cast<float>(kUntouched));
          GemmArgs a16 = a;
          a16.w = packed16.data();
          a16.w_stride = packed_group_stride(type, kX16Rows, k);
          a16.y = y_x16.data();
          gemm_x16_vnni(a16);
          QVERIFY2(std::memcmp(y_x16.data(), y_x8.data(), y_x8.size() * sizeof(float)) == 0,
                   qPrintable("gemm_x16_vnni differs from gemm_x8_avx2 bitwise" + shape));
        }
      }

      // (d) Q4 weights with the broadcast activation layout: the same blocks, expanded.
      if (type != WeightType::Q4_0 && type != WeightType::Q4_1) continue;
      const int64_t nb = k / kQK;
      std::vector<BlockQ8B> xb(static_cast<size_t>(cols * nb));
      for (int64_t c = 0; c < cols; ++c)
        expand_q8b(reinterpret_cast<const BlockQ8A*>(x.bytes.data() + (c0 + c) * x.stride),
                   xb.data() + c * nb, nb);
      std::vector<float> y_q8b(cols * ldy, std::bit_cast<float>(kUntouched));
      a.x = reinterpret_cast<const uint8_t*>(xb.data());
      a.x_stride = static_cast<size_t>(nb) * sizeof(BlockQ8B);
      a.y = y_q8b.data();
      gemm_x8_q8b_avx2(a);
      err = compare_tile("gemm_x8_q8b_avx2", y_q8b.data(), scalar_y, mag, rows, cols, ldy,
                         kFastVsScalar);
      QVERIFY2(err.isEmpty(), qPrintable(err + shape));
    }
  }
}

void KernelTest::matmul_matches_per_job_gemm_data() {
  QTest::addColumn<QString>("jobs_set");
  QTest::addColumn<int>("threads");
  QTest::addColumn<int64_t>("cols");
  // "quantized": block types, some x8; "q4x8": only x8 Q4 jobs, which take the BlockQ8B layout
  // from kQ8BMinCols columns on (with AVX2); "x16": x16 jobs (with AVX-512 VNNI; x8 otherwise)
  // beside an x8 one; "q5": Q5_0, Q5_1, IQ4_NL packed and not; "kquants": the super-block types
  // packed and not (K = 768); "mixed": a K-quant file's mix on one input, as its Q/K/V or
  // gate/up jobs share one (K = 768); "float": the float types.
  for (const QString set : {"quantized", "q4x8", "x16", "q5", "kquants", "mixed", "float"}) {
    for (int threads : {1, 2, 3}) {
      for (int64_t cols : {1, 5, 9, 20, 70}) {  // ≥ 8 converted in parallel; ≥ 64: Q8B
        QTest::addRow("%s threads=%d cols=%lld", qPrintable(set), threads,
                      static_cast<long long>(cols))
            << set << threads << cols;
      }
    }
  }
}

// Two to six jobs on one input, some in the x8 or x16 layout (with AVX2 / AVX-512 VNNI), rows
// that do and do not divide into the 8-row split unit, ldx > k and ldy > rows. Each job's y must
// match gemm_scalar over its GGUF rows on the same Q8A input (quantize_row_q8a, the conversion
// matmul itself uses) within kFastVsScalar, and its ldy padding must stay untouched.
void KernelTest::matmul_matches_per_job_gemm() {
  QFETCH(QString, jobs_set);
  QFETCH(int, threads);
  QFETCH(int64_t, cols);
  const int64_t k = jobs_set == "kquants" || jobs_set == "mixed" ? 768 : 576, ldx = k + 3;
  struct Spec {
    WeightType type;
    int64_t rows;
    int group;  // MatmulJob::group_rows
  };
  const int x8 = cpu_features().avx2 ? kX8Rows : 0;
  const int x16 = cpu_features().avx512_vnni ? kX16Rows : x8;
  std::vector<Spec> specs;
  if (jobs_set == "quantized") {
    specs = {{WeightType::Q4_0, 64, x8}, {WeightType::Q8_0, 13, 0}, {WeightType::Q4_1, 24, x8}};
  } else if (jobs_set == "q4x8") {
    specs = {{WeightType::Q4_1, 40, x8}, {WeightType::Q4_0, 16, x8}};
  } else if (jobs_set == "x16") {
    specs = {{WeightType::Q8_0, 48, x16},
             {WeightType::Q4_1, 80, x16},
             {WeightType::Q4_0, 16, x16},
             {WeightType::Q4_1, 24, x8}};
  } else if (jobs_set == "q5") {
    specs = {{WeightType::Q5_0, 64, x16},
             {WeightType::Q5_1, 24, x8},
             {WeightType::IQ4_NL, 13, 0},
             {WeightType::IQ4_NL, 32, x16},
             {WeightType::Q5_0, 40, x8}};
  } else if (jobs_set == "kquants") {
    specs = {{WeightType::Q4_K, 64, x16}, {WeightType::Q6_K, 24, x8}, {WeightType::Q5_K, 13, 0},
             {WeightType::Q3_K, 16, x16}, {WeightType::Q2_K, 40, x8}, {WeightType::IQ4_XS, 32, x16}};
  } else if (jobs_set == "mixed") {
    specs = {{WeightType::Q4_K, 48, x16},
             {WeightType::Q5_0, 16, x8},
             {WeightType::Q6_K, 7, 0},
             {WeightType::Q8_0, 32, x16},
             {WeightType::Q5_K, 24, x8}};
  } else {
    specs = {{WeightType::F16, 7, 0}, {WeightType::BF16, 33, 0}, {WeightType::F32, 16, 0}};
  }
  std::mt19937 rng(static_cast<unsigned>(threads * 100 + cols));
  const std::vector<float> xf = random_activations(cols, k, ldx, rng);

  struct JobData {
    std::vector<uint8_t> gguf, packed;
    std::vector<float> y;
    int64_t ldy;
  };
  std::vector<JobData> data(specs.size());
  std::vector<MatmulJob> jobs;
  for (size_t j = 0; j < specs.size(); ++j) {
    const Spec& s = specs[j];
    JobData& d = data[j];
    d.gguf = random_weights(s.type, s.rows, k, row_bytes(s.type, k), rng);
    if (s.group != 0) {
      d.packed.resize(packed_group_stride(s.type, s.group, k) * (s.rows / s.group));
      repack(s.type, s.group, d.gguf.data(), row_bytes(s.type, k), d.packed.data(), s.rows, k);
    }
    d.ldy = s.rows + 3;
    d.y.assign(cols * d.ldy, std::bit_cast<float>(kUntouched));
    jobs.push_back({s.type, s.group != 0 ? d.packed.data() : d.gguf.data(), s.rows, d.y.data(),
                    d.ldy, s.group});
  }

  ThreadPool pool(threads);
  ActivationScratch scratch;
  matmul(pool, jobs, xf.data(), ldx, k, cols, scratch);

  for (size_t j = 0; j < specs.size(); ++j) {
    const Spec& s = specs[j];
    const JobData& d = data[j];
    const Activations x = convert_activations(s.type, xf, ldx, cols, k, quantize_row_q8a);
    const size_t w_stride = row_bytes(s.type, k);
    std::vector<float> want(cols * d.ldy, std::bit_cast<float>(kUntouched));
    gemm_scalar({s.type, d.gguf.data(), w_stride, x.bytes.data(), x.stride, k, want.data(), d.ldy,
                 s.rows, cols});
    const Reference ref =
        reference_gemm(s.type, d.gguf.data(), w_stride, s.rows, x.values, cols, k);
    std::vector<double> want_d(want.begin(), want.end()), mag(cols * d.ldy, 0.0);
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t r = 0; r < s.rows; ++r) mag[c * d.ldy + r] = ref.mag[c * s.rows + r];
    const QString err =
        compare_tile("matmul", d.y.data(), want_d, mag, s.rows, cols, d.ldy, kFastVsScalar);
    QVERIFY2(err.isEmpty(), qPrintable(QString("job %1 (%2%3): ")
                                           .arg(j)
                                           .arg(weight_type_name(s.type))
                                           .arg(s.group != 0 ? QString(", x%1").arg(s.group) : "") +
                                       err));
  }
}

// matmul() refuses what its kernels cannot compute: K not a multiple of a quantized job's block
// (256 for the super-block types, 32 for the others) and a packed job of a type without a packed
// layout, with std::invalid_argument; K = 512 for Q4_K and 544 for Q5_0 run.
void KernelTest::matmul_rejects_what_it_cannot_compute() {
  ThreadPool pool(1);
  ActivationScratch scratch;
  std::vector<float> x(1024, 0.5f), y(64, 0.0f);
  std::vector<uint8_t> w(row_bytes(WeightType::Q4_K, 1024) * 8, 0);
  const auto run = [&](WeightType type, int64_t k, int group) {
    const MatmulJob job{type, w.data(), 8, y.data(), 8, group};
    matmul(pool, {&job, 1}, x.data(), k, k, 1, scratch);
  };
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument, run(WeightType::Q4_K, 576, 0));
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument, run(WeightType::Q6_K, 288, 0));
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument, run(WeightType::Q5_0, 560, 0));
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument, run(WeightType::F16, 64, kX8Rows));
  run(WeightType::Q4_K, 512, 0);
  run(WeightType::Q5_0, 544, 0);
}
