// Block formats against hand-built bytes and hand-computed values, and against gguf.quants'
// dequantizer (tests/data/quant_golden.json); fp16 / bf16 conversions over every value and every
// rounding midpoint; the scale checker for loaders.

#include <QFile>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QtTest>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <optional>
#include <string>

#include "kernels/cpu/quantize.h"
#include "tests/kernels/kernel_test.h"

using namespace tokenfab::kernels;

namespace {

// First element whose bits differ from the expected value ("" when all match): bitwise, so that
// -0 and +0 count as different.
QString first_mismatch(const float* got, const std::vector<float>& want) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want[i])) {
      return QString("element %1: got %2, want %3")
          .arg(i)
          .arg(static_cast<double>(got[i]), 0, 'g', 9)
          .arg(static_cast<double>(want[i]), 0, 'g', 9);
    }
  }
  return {};
}

void expect_dequantized(WeightType type, const void* blocks, const std::vector<float>& want) {
  std::vector<float> got(want.size(), std::numeric_limits<float>::quiet_NaN());
  dequantize_row(type, blocks, got.data(), static_cast<int64_t>(want.size()));
  const QString mismatch = first_mismatch(got.data(), want);
  QVERIFY2(mismatch.isEmpty(), qPrintable(mismatch));
}

// The value of a finite fp16 bit pattern straight from the IEEE definition, computed in double.
double fp16_value(uint16_t h) {
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  const double magnitude =
      exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);  // 2^(e-15) · 1.m
  return (h & 0x8000) ? -magnitude : magnitude;
}

}  // namespace

// Q4_0 value = d · (q − 8); byte j holds element j in its low nibble and element j + 16 in its
// high nibble. Block 0: d = 0.5, byte j = j | (15 − j) << 4. Block 1: d = −2, every byte 0x5A.
void KernelTest::dequantizes_hand_built_q4_0() {
  BlockQ4_0 blocks[2];
  blocks[0].d = 0x3800;  // fp16 0.5
  for (int j = 0; j < 16; ++j) blocks[0].qs[j] = static_cast<uint8_t>(j | (15 - j) << 4);
  blocks[1].d = 0xC000;  // fp16 -2
  std::memset(blocks[1].qs, 0x5A, sizeof blocks[1].qs);
  const std::vector<float> want = {// block 0, elements 0..15: 0.5 · (j − 8)
                                   -4.0f, -3.5f, -3.0f, -2.5f, -2.0f, -1.5f, -1.0f, -0.5f, 0.0f,
                                   0.5f, 1.0f, 1.5f, 2.0f, 2.5f, 3.0f, 3.5f,
                                   // block 0, elements 16..31: 0.5 · ((15 − j) − 8)
                                   3.5f, 3.0f, 2.5f, 2.0f, 1.5f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f,
                                   -1.5f, -2.0f, -2.5f, -3.0f, -3.5f, -4.0f,
                                   // block 1: low nibble 0xA → −2 · 2, high nibble 0x5 → −2 · −3
                                   -4.0f, -4.0f, -4.0f, -4.0f, -4.0f, -4.0f, -4.0f, -4.0f, -4.0f,
                                   -4.0f, -4.0f, -4.0f, -4.0f, -4.0f, -4.0f, -4.0f, 6.0f, 6.0f,
                                   6.0f, 6.0f, 6.0f, 6.0f, 6.0f, 6.0f, 6.0f, 6.0f, 6.0f, 6.0f, 6.0f,
                                   6.0f, 6.0f, 6.0f};
  expect_dequantized(WeightType::Q4_0, blocks, want);
  QCOMPARE(row_bytes(WeightType::Q4_0, 64), uint64_t{36});
}

// Q4_1 value = d · q + m, same nibble order. Block 0: d = 0.25, m = −1, byte j = (15 − j) | j << 4.
// Block 1: d = 3, m = 5, every byte 0xF0.
void KernelTest::dequantizes_hand_built_q4_1() {
  BlockQ4_1 blocks[2];
  blocks[0].d = 0x3400;  // fp16 0.25
  blocks[0].m = 0xBC00;  // fp16 -1
  for (int j = 0; j < 16; ++j) blocks[0].qs[j] = static_cast<uint8_t>((15 - j) | j << 4);
  blocks[1].d = 0x4200;  // fp16 3
  blocks[1].m = 0x4500;  // fp16 5
  std::memset(blocks[1].qs, 0xF0, sizeof blocks[1].qs);
  const std::vector<float> want = {// block 0, elements 0..15: 0.25 · (15 − j) − 1
                                   2.75f, 2.5f, 2.25f, 2.0f, 1.75f, 1.5f, 1.25f, 1.0f, 0.75f, 0.5f,
                                   0.25f, 0.0f, -0.25f, -0.5f, -0.75f, -1.0f,
                                   // block 0, elements 16..31: 0.25 · j − 1
                                   -1.0f, -0.75f, -0.5f, -0.25f, 0.0f, 0.25f, 0.5f, 0.75f, 1.0f,
                                   1.25f, 1.5f, 1.75f, 2.0f, 2.25f, 2.5f, 2.75f,
                                   // block 1: low nibble 0 → 5, high nibble 15 → 3 · 15 + 5
                                   5.0f, 5.0f, 5.0f, 5.0f, 5.0f, 5.0f, 5.0f, 5.0f, 5.0f, 5.0f, 5.0f,
                                   5.0f, 5.0f, 5.0f, 5.0f, 5.0f, 50.0f, 50.0f, 50.0f, 50.0f, 50.0f,
                                   50.0f, 50.0f, 50.0f, 50.0f, 50.0f, 50.0f, 50.0f, 50.0f, 50.0f,
                                   50.0f, 50.0f};
  expect_dequantized(WeightType::Q4_1, blocks, want);
  QCOMPARE(row_bytes(WeightType::Q4_1, 64), uint64_t{40});
}

// Q8_0 value = d · q. Block 0: d = 0.125, q_i = 8i − 128 except q_31 = 127 (both int8 extremes).
// Block 1: d = −2^-24 (the negative smallest fp16 subnormal), q alternating 3, −5.
void KernelTest::dequantizes_hand_built_q8_0() {
  BlockQ8_0 blocks[2];
  blocks[0].d = 0x3000;  // fp16 0.125
  for (int i = 0; i < 32; ++i) blocks[0].qs[i] = static_cast<int8_t>(8 * i - 128);
  blocks[0].qs[31] = 127;
  blocks[1].d = 0x8001;  // fp16 -2^-24
  for (int i = 0; i < 32; ++i) blocks[1].qs[i] = static_cast<int8_t>(i % 2 ? -5 : 3);
  std::vector<float> want = {-16.0f, -15.0f, -14.0f, -13.0f, -12.0f, -11.0f, -10.0f, -9.0f,
                             -8.0f,  -7.0f,  -6.0f,  -5.0f,  -4.0f,  -3.0f,  -2.0f,  -1.0f,
                             0.0f,   1.0f,   2.0f,   3.0f,   4.0f,   5.0f,   6.0f,   7.0f,
                             8.0f,   9.0f,   10.0f,  11.0f,  12.0f,  13.0f,  14.0f,  15.875f};
  for (int i = 0; i < 32; ++i) want.push_back(i % 2 ? 0x5p-24f : -0x3p-24f);
  expect_dequantized(WeightType::Q8_0, blocks, want);
  QCOMPARE(row_bytes(WeightType::Q8_0, 64), uint64_t{68});
}

// fp16 bit patterns with their values worked out by hand, incl. both zeros, subnormals, the
// largest finite value and the infinities; NaNs stay NaN with their sign and payload.
void KernelTest::dequantizes_hand_built_f16() {
  const std::vector<uint16_t> halves = {0x0000, 0x8000, 0x3C00, 0xC000, 0x3555, 0x7BFF, 0x0400,
                                        0x03FF, 0x0200, 0x0001, 0x8001, 0x7C00, 0xFC00};
  const std::vector<float> want = {0.0f,
                                   -0.0f,
                                   1.0f,
                                   -2.0f,
                                   0x1.554p-2f,   // 0.333251953125: 2^-2 · (1 + 0x155/1024)
                                   65504.0f,      // largest finite
                                   0x1p-14f,      // smallest normal
                                   0x1.ff8p-15f,  // largest subnormal: 1023 · 2^-24
                                   0x1p-15f,
                                   0x1p-24f,  // smallest subnormal
                                   -0x1p-24f,
                                   std::numeric_limits<float>::infinity(),
                                   -std::numeric_limits<float>::infinity()};
  expect_dequantized(WeightType::F16, halves.data(), want);

  QCOMPARE(std::bit_cast<uint32_t>(fp16_to_fp32(0x7E00)), 0x7FC00000u);  // quiet NaN, payload kept
  QCOMPARE(std::bit_cast<uint32_t>(fp16_to_fp32(0xFE01)), 0xFFC02000u);
  QVERIFY(std::isnan(fp16_to_fp32(0x7C01)));  // signalling NaN stays a NaN
  QCOMPARE(row_bytes(WeightType::F16, 64), uint64_t{128});
}

void KernelTest::dequantizes_hand_built_bf16() {
  const std::vector<uint16_t> values = {0x3F80, 0xC0A0, 0x4049, 0x0001, 0x0080,
                                        0x7F7F, 0x7F80, 0xFF80, 0x8000};
  const std::vector<float> want = {1.0f,
                                   -5.0f,        // 2^2 · (1 + 32/128)
                                   3.140625f,    // 2 · (1 + 73/128)
                                   0x1p-133f,    // smallest bf16 subnormal
                                   0x1p-126f,    // smallest normal
                                   0x1.fep127f,  // largest finite
                                   std::numeric_limits<float>::infinity(),
                                   -std::numeric_limits<float>::infinity(),
                                   -0.0f};
  expect_dequantized(WeightType::BF16, values.data(), want);
  QCOMPARE(row_bytes(WeightType::BF16, 64), uint64_t{128});
}

// Every one of the 65536 halves: fp16_to_fp32 gives the IEEE value and fp32_to_fp16 gives the
// same bits back. NaNs come back as the canonical quiet NaN of their sign (payload dropped).
void KernelTest::fp16_round_trips_every_value() {
  for (uint32_t i = 0; i <= 0xffff; ++i) {
    const auto h = static_cast<uint16_t>(i);
    const float f = fp16_to_fp32(h);
    const bool nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
    const bool inf = (h & 0x7fff) == 0x7c00;
    if (nan) {
      QVERIFY2(std::isnan(f), qPrintable(QString::number(h, 16)));
      QCOMPARE(fp32_to_fp16(f), static_cast<uint16_t>((h & 0x8000) | 0x7e00));
      continue;
    }
    if (inf) {
      QVERIFY(std::isinf(f) && std::signbit(f) == ((h & 0x8000) != 0));
    } else if (static_cast<double>(f) != fp16_value(h) || std::signbit(f) != ((h & 0x8000) != 0)) {
      QFAIL(qPrintable(QString("fp16 0x%1 → %2, want %3")
                           .arg(h, 4, 16, QChar('0'))
                           .arg(static_cast<double>(f), 0, 'g', 17)
                           .arg(fp16_value(h), 0, 'g', 17)));
    }
    if (fp32_to_fp16(f) != h) {
      QFAIL(qPrintable(QString("fp16 0x%1 round trip gives 0x%2")
                           .arg(h, 4, 16, QChar('0'))
                           .arg(fp32_to_fp16(f), 4, 16, QChar('0'))));
    }
  }
}

// Hand-picked cases, then every midpoint between adjacent finite halves (exact in f32: 12
// significant bits): the midpoint goes to the even neighbour, one f32 ulp either side goes to the
// nearer one.
void KernelTest::fp16_rounds_to_nearest_even() {
  const float inf = std::numeric_limits<float>::infinity();
  const struct {
    float f;
    uint16_t want;
  } cases[] = {
      {1.0f + 0x1p-11f, 0x3C00},             // halfway 1 / 1+2^-10 → even (1)
      {1.0f + 0x3p-11f, 0x3C02},             // halfway 1+2^-10 / 1+2^-9 → even (…02)
      {1.0f + 0x1p-11f + 0x1p-20f, 0x3C01},  // above halfway → up
      {65519.0f, 0x7BFF},                    // below the midpoint to 65536 → largest finite
      {65520.0f, 0x7C00},                    // midpoint 65504 / 65536 → even → inf
      {1e6f, 0x7C00},                        // overflow
      {-1e6f, 0xFC00},
      {0x1p-25f, 0x0000},      // halfway 0 / 2^-24 → even (0)
      {0x1.8p-24f, 0x0002},    // halfway 2^-24 / 2^-23 → even (2)
      {0x1.4p-24f, 0x0001},    // below halfway → down
      {0x1p-26f, 0x0000},      // underflow
      {-0x1p-26f, 0x8000},     // underflow keeps the sign
      {0x1.ffcp-15f, 0x0400},  // halfway largest subnormal / smallest normal → even
      {-0.0f, 0x8000},
      {inf, 0x7C00},
      {-inf, 0xFC00},
      {std::numeric_limits<float>::quiet_NaN(), 0x7E00},
  };
  for (const auto& c : cases) {
    QVERIFY2(fp32_to_fp16(c.f) == c.want, qPrintable(QString("%1 → 0x%2, want 0x%3")
                                                         .arg(static_cast<double>(c.f), 0, 'g', 17)
                                                         .arg(fp32_to_fp16(c.f), 4, 16, QChar('0'))
                                                         .arg(c.want, 4, 16, QChar('0'))));
  }

  for (uint16_t h = 0; h < 0x7BFF; ++h) {
    for (const uint16_t sign : {uint16_t{0}, uint16_t{0x8000}}) {
      const float lo = fp16_to_fp32(sign | h), hi = fp16_to_fp32(sign | (h + 1));
      const float mid = (lo + hi) / 2;
      const auto even = static_cast<uint16_t>(sign | ((h & 1) ? h + 1 : h));
      const bool ok = fp32_to_fp16(lo) == (sign | h) && fp32_to_fp16(mid) == even &&
                      fp32_to_fp16(std::nextafter(mid, lo)) == (sign | h) &&
                      fp32_to_fp16(std::nextafter(mid, hi)) == (sign | (h + 1));
      if (!ok) QFAIL(qPrintable(QString("rounding around 0x%1").arg(sign | h, 4, 16, QChar('0'))));
    }
  }
}

// bf16 is the top half of an f32: every non-NaN pattern round-trips; NaNs stay quiet NaNs of
// their sign; the f32 pattern b·2^16 + 0x8000 is exactly halfway between b and b + 1.
void KernelTest::bf16_round_trips_and_rounds_to_nearest_even() {
  QCOMPARE(fp32_to_bf16(1.0f + 0x1p-8f), uint16_t{0x3F80});                     // halfway → even
  QCOMPARE(fp32_to_bf16(1.0f + 0x3p-8f), uint16_t{0x3F82});                     // halfway → even
  QCOMPARE(fp32_to_bf16(std::bit_cast<float>(0x3F808001u)), uint16_t{0x3F81});  // above → up
  QCOMPARE(fp32_to_bf16(std::bit_cast<float>(0x7F7F8000u)), uint16_t{0x7F80});  // → inf

  for (uint32_t i = 0; i <= 0xffff; ++i) {
    const auto b = static_cast<uint16_t>(i);
    const float f = bf16_to_fp32(b);
    QCOMPARE(std::bit_cast<uint32_t>(f), i << 16);
    if (std::isnan(f)) {
      const uint16_t r = fp32_to_bf16(f);
      QVERIFY((r & 0x7f80) == 0x7f80 && (r & 0x40) && (r & 0x8000) == (b & 0x8000));
      continue;
    }
    if (fp32_to_bf16(f) != b) QFAIL(qPrintable(QString("bf16 0x%1 round trip").arg(b, 0, 16)));
    if ((b & 0x7fff) >= 0x7f7f) continue;  // the next pattern up is inf or NaN
    const uint32_t mid = i << 16 | 0x8000;
    const auto even = static_cast<uint16_t>((b & 1) ? b + 1 : b);
    if (fp32_to_bf16(std::bit_cast<float>(mid)) != even ||
        fp32_to_bf16(std::bit_cast<float>(mid - 1)) != b ||
        fp32_to_bf16(std::bit_cast<float>(mid + 1)) != b + 1) {
      QFAIL(qPrintable(QString("bf16 rounding around 0x%1").arg(b, 0, 16)));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Q5_0, Q5_1, the K-quants and IQ4: hand-built blocks, golden blocks from gguf.quants, the
// scale checker for loaders.

namespace {

// Dequantizes `blocks` (n elements) and compares the listed elements bitwise.
void expect_elements(WeightType type, const void* blocks, int64_t n,
                     const std::vector<std::pair<int, float>>& want) {
  std::vector<float> got(static_cast<size_t>(n), std::numeric_limits<float>::quiet_NaN());
  dequantize_row(type, blocks, got.data(), n);
  for (const auto& [i, value] : want) {
    QVERIFY2(std::bit_cast<uint32_t>(got[i]) == std::bit_cast<uint32_t>(value),
             qPrintable(QString("%1 element %2: got %3, want %4")
                            .arg(weight_type_name(type))
                            .arg(i)
                            .arg(static_cast<double>(got[i]), 0, 'g', 9)
                            .arg(static_cast<double>(value), 0, 'g', 9)));
  }
}

}  // namespace

void KernelTest::block_sizes_match_ggml() {
  const struct {
    WeightType type;
    int elements, bytes;
  } sizes[] = {
      {WeightType::F32, 1, 4},      {WeightType::F16, 1, 2},      {WeightType::BF16, 1, 2},
      {WeightType::Q4_0, 32, 18},   {WeightType::Q4_1, 32, 20},   {WeightType::Q8_0, 32, 34},
      {WeightType::Q5_0, 32, 22},   {WeightType::Q5_1, 32, 24},   {WeightType::Q2_K, 256, 84},
      {WeightType::Q3_K, 256, 110}, {WeightType::Q4_K, 256, 144}, {WeightType::Q5_K, 256, 176},
      {WeightType::Q6_K, 256, 210}, {WeightType::IQ4_NL, 32, 18}, {WeightType::IQ4_XS, 256, 136}};
  for (const auto& s : sizes) {
    QCOMPARE(block_elements(s.type), s.elements);
    QCOMPARE(block_bytes(s.type), s.bytes);
    QCOMPARE(row_bytes(s.type, 512), uint64_t{512} / s.elements * s.bytes);
    QCOMPARE(is_block_quantized(s.type), s.elements > 1);
  }
  QCOMPARE(QString(weight_type_name(WeightType::IQ4_XS)), QString("IQ4_XS"));
}

// Q5_0 value = d · (q − 16), q = low nibble (Q4_0 order) | bit i of qh << 4. d = 0.5, byte j =
// j | (15 − j) << 4, qh = 0x0000FFFF: element j < 16 is q = j + 16 → 0.5·j; element 16 + j is
// q = 15 − j → 0.5·(−1 − j).
void KernelTest::dequantizes_hand_built_q5_0() {
  BlockQ5_0 block;
  block.d = 0x3800;  // fp16 0.5
  for (int j = 0; j < 16; ++j) block.qs[j] = static_cast<uint8_t>(j | (15 - j) << 4);
  const uint8_t qh[4] = {0xFF, 0xFF, 0x00, 0x00};
  std::memcpy(block.qh, qh, 4);
  expect_elements(WeightType::Q5_0, &block, 32,
                  {{0, 0.0f}, {1, 0.5f}, {15, 7.5f}, {16, -0.5f}, {20, -2.5f}, {31, -8.0f}});
}

// Q5_1 value = d · q + m. d = 0.25, m = −4, every byte 0x21 (low 1, high 2), qh bits 0, 16 and
// 31 set: element 0 → q = 17 → 0.25; element 1 → q = 1 → −3.75; element 16 → q = 18 → 0.5;
// element 17 → q = 2 → −3.5; element 31 → q = 18 → 0.5.
void KernelTest::dequantizes_hand_built_q5_1() {
  BlockQ5_1 block;
  block.d = 0x3400;  // fp16 0.25
  block.m = 0xC400;  // fp16 -4
  std::memset(block.qs, 0x21, sizeof block.qs);
  const uint8_t qh[4] = {0x01, 0x00, 0x01, 0x80};  // little-endian 0x80010001
  std::memcpy(block.qh, qh, 4);
  expect_elements(WeightType::Q5_1, &block, 32,
                  {{0, 0.25f}, {1, -3.75f}, {16, 0.5f}, {17, -3.5f}, {31, 0.5f}});
}

// Q2_K value = d·(sc & 15)·q − dmin·(sc >> 4) for sub-block s = e / 16; q = (qs[32·h + l] >>
// 2k) & 3 for e = 128h + 32k + l. d = 0.5, dmin = 0.25, scales[s] = s | (15 − s) << 4, every qs
// byte 0xE4 (q = k) except qs[37] = 0x1B (h = 1, l = 5: q = 3 − k).
//   e = 0:   s 0,  q 0: 0 − 0.25·15 = −3.75
//   e = 40:  s 2,  q 1: 1·1 − 0.25·13 = −2.25
//   e = 100: s 6,  q 3: 3·3 − 0.25·9 = 6.75
//   e = 200: s 12, q 2: 6·2 − 0.25·3 = 11.25
//   e = 255: s 15, q 3: 7.5·3 − 0 = 22.5
//   e = 133: s 8,  q 3 (qs[37]): 4·3 − 0.25·7 = 10.25
//   e = 229: s 14, q 0 (qs[37]): 0 − 0.25·1 = −0.25
void KernelTest::dequantizes_hand_built_q2_k() {
  BlockQ2_K block;
  block.d = 0x3800;     // fp16 0.5
  block.dmin = 0x3400;  // fp16 0.25
  for (int s = 0; s < 16; ++s) block.scales[s] = static_cast<uint8_t>(s | (15 - s) << 4);
  std::memset(block.qs, 0xE4, sizeof block.qs);
  block.qs[37] = 0x1B;
  expect_elements(WeightType::Q2_K, &block, 256,
                  {{0, -3.75f},
                   {40, -2.25f},
                   {100, 6.75f},
                   {200, 11.25f},
                   {255, 22.5f},
                   {133, 10.25f},
                   {229, -0.25f}});
}

// Q3_K value = d·(u − 32)·(low2 − (hbit ? 0 : 4)), u the 6-bit scale of sub-block e / 16.
// d = 0.25. u = 33 everywhere except u0 = 32, u1 = 40, u5 = 0, u10 = 63, packed by hand:
// bytes 0..7 hold low4(u_j) | low4(u_{j+8}) << 4, bytes 8..11 the high two bits of u_i, u_i+4,
// u_i+8, u_i+12 at bits 0, 2, 4, 6. hmask all 0xFF except hmask[3] = 0xFE (bit 0 clear) and
// hmask[7] = 0x7F (bit 7 clear); qs all 0 except qs[3] = 0xE4, qs[20] = 0x02, qs[24] = 0x30,
// qs[40] = 0x03, qs[42] = 0x0C.
//   e = 3:   u0 → dl 0;   low2 0, hmask[3] bit 0 clear → q −4: 0 · −4 = −0
//   e = 35:  u2 → 0.25;   qs[3] >> 2 = 1, hbit 1 → q 1: 0.25
//   e = 67:  u4 → 0.25;   qs[3] >> 4 = 2 → 0.5
//   e = 99:  u6 → 0.25;   qs[3] >> 6 = 3 → 0.75
//   e = 20:  u1 → 2;      qs[20] = 2 → 4
//   e = 88:  u5 → −8;     qs[24] >> 4 = 3 → −24
//   e = 136: u8 → 0.25;   qs[40] = 3 → 0.75
//   e = 170: u10 → 7.75;  qs[42] >> 2 = 3 → 23.25
//   e = 231: u14 → 0.25;  qs[39] >> 6 = 0, hmask[7] bit 7 clear → q −4: −1
void KernelTest::dequantizes_hand_built_q3_k() {
  BlockQ3_K block;
  block.d = 0x3400;  // fp16 0.25
  const uint8_t scales[12] = {0x10, 0x18, 0xF1, 0x11, 0x11, 0x10,
                              0x11, 0x11, 0xAA, 0xA2, 0xBA, 0xAA};
  std::memcpy(block.scales, scales, 12);
  std::memset(block.hmask, 0xFF, sizeof block.hmask);
  block.hmask[3] = 0xFE;
  block.hmask[7] = 0x7F;
  std::memset(block.qs, 0x00, sizeof block.qs);
  block.qs[3] = 0xE4;
  block.qs[20] = 0x02;
  block.qs[24] = 0x30;
  block.qs[40] = 0x03;
  block.qs[42] = 0x0C;
  expect_elements(WeightType::Q3_K, &block, 256,
                  {{3, -0.0f},
                   {35, 0.25f},
                   {67, 0.5f},
                   {99, 0.75f},
                   {20, 4.0f},
                   {88, -24.0f},
                   {136, 0.75f},
                   {170, 23.25f},
                   {231, -1.0f}});
}

namespace {

// Q4_K / Q5_K scales of the hand-built blocks: sc = {1, 63, 2, 2, 17, 2, 2, 48}, m = {0, 1, 3,
// 3, 35, 3, 3, 63}, packed by hand: bytes 0..3 = sc[j] | (sc[j+4] >> 4) << 6, bytes 4..7 =
// m[j] | (m[j+4] >> 4) << 6, bytes 8..11 = (sc[j+4] & 15) | (m[j+4] & 15) << 4.
constexpr uint8_t kK4Scales[12] = {0x41, 0x3F, 0x02, 0xC2, 0x80, 0x01,
                                   0x03, 0xC3, 0x31, 0x32, 0x32, 0xF0};

}  // namespace

// Q4_K value = d·sc·q − dmin·m, sub-block s = e / 32, q = qs[32·(s/2) + l] nibble s % 2.
// d = 0.5, dmin = 2; qs all 0 except qs[0] = 0xF1, qs[69] = 0x7A, qs[127] = 0xF0.
//   e = 0:   s0 (0.5, 0):    q 1  → 0.5
//   e = 1:   s0:             q 0  → 0 − 0 = 0
//   e = 32:  s1 (31.5, 2):   q 15 → 472.5 − 2 = 470.5
//   e = 133: s4 (8.5, 70):   q 10 → 85 − 70 = 15
//   e = 165: s5 (1, 6):      q 7  → 1
//   e = 223: s6 (1, 6):      q 0  → −6
//   e = 255: s7 (24, 126):   q 15 → 360 − 126 = 234
void KernelTest::dequantizes_hand_built_q4_k() {
  BlockQ4_K block;
  block.d = 0x3800;     // fp16 0.5
  block.dmin = 0x4000;  // fp16 2
  std::memcpy(block.scales, kK4Scales, 12);
  std::memset(block.qs, 0x00, sizeof block.qs);
  block.qs[0] = 0xF1;
  block.qs[69] = 0x7A;
  block.qs[127] = 0xF0;
  expect_elements(
      WeightType::Q4_K, &block, 256,
      {{0, 0.5f}, {1, 0.0f}, {32, 470.5f}, {133, 15.0f}, {165, 1.0f}, {223, -6.0f}, {255, 234.0f}});
}

// Q5_K: Q4_K's scales and qs, bit 4 of element e in bit e / 32 of qh[e % 32]. d = 0.25,
// dmin = 0.5, qh all 0 except qh[0] = 0x03 (elements 0 and 32), qh[31] = 0x80 (element 255).
//   e = 0:   s0 (0.25, 0):     q 17 → 4.25
//   e = 1:   s0:               q 0  → 0
//   e = 32:  s1 (15.75, 0.5):  q 31 → 488.25 − 0.5 = 487.75
//   e = 133: s4 (4.25, 17.5):  q 10 → 42.5 − 17.5 = 25
//   e = 223: s6 (0.5, 1.5):    q 0  → −1.5
//   e = 255: s7 (12, 31.5):    q 31 → 372 − 31.5 = 340.5
void KernelTest::dequantizes_hand_built_q5_k() {
  BlockQ5_K block;
  block.d = 0x3400;     // fp16 0.25
  block.dmin = 0x3800;  // fp16 0.5
  std::memcpy(block.scales, kK4Scales, 12);
  std::memset(block.qs, 0x00, sizeof block.qs);
  block.qs[0] = 0xF1;
  block.qs[69] = 0x7A;
  block.qs[127] = 0xF0;
  std::memset(block.qh, 0x00, sizeof block.qh);
  block.qh[0] = 0x03;
  block.qh[31] = 0x80;
  expect_elements(
      WeightType::Q5_K, &block, 256,
      {{0, 4.25f}, {1, 0.0f}, {32, 487.75f}, {133, 25.0f}, {223, -1.5f}, {255, 340.5f}});
}

// Q6_K value = d·sc·(q − 32), s = e / 16, q = ql[64h + 32(k%2) + l] nibble k / 2 | ((qh[32h + l]
// >> 2k) & 3) << 4. d = 0.125; scales 2 except s0 = 1, s1 = −1, s5 = 127, s15 = −128; ql all 0
// except ql[0] = 0x5F, ql[16] = 0x70, ql[49] = 0x0C, ql[127] = 0xF0; qh all 0xAA (high bits 2:
// q − 32 = low nibble) except qh[5] = 0xA8 and qh[63] = 0x2A (one field 0: q − 32 = low − 32).
//   e = 0:   s0, ql[0] low 15        → 0.125·15 = 1.875
//   e = 64:  s4, ql[0] high 5        → 0.25·5 = 1.25
//   e = 49:  s3, ql[49] low 12       → 0.25·12 = 3
//   e = 5:   s0, low 0, high 0       → 0.125·−32 = −4
//   e = 16:  s1, low 0               → −0.125·0 = −0
//   e = 80:  s5, ql[16] high 7       → 15.875·7 = 111.125
//   e = 255: s15, ql[127] high 15, qh[63] field 3 = 0 → −16·(15 − 32) = 272
void KernelTest::dequantizes_hand_built_q6_k() {
  BlockQ6_K block;
  block.d = 0x3000;  // fp16 0.125
  for (int8_t& s : block.scales) s = 2;
  block.scales[0] = 1;
  block.scales[1] = -1;
  block.scales[5] = 127;
  block.scales[15] = -128;
  std::memset(block.ql, 0x00, sizeof block.ql);
  block.ql[0] = 0x5F;
  block.ql[16] = 0x70;
  block.ql[49] = 0x0C;
  block.ql[127] = 0xF0;
  std::memset(block.qh, 0xAA, sizeof block.qh);
  block.qh[5] = 0xA8;
  block.qh[63] = 0x2A;
  expect_elements(WeightType::Q6_K, &block, 256,
                  {{0, 1.875f},
                   {64, 1.25f},
                   {49, 3.0f},
                   {5, -4.0f},
                   {16, -0.0f},
                   {80, 111.125f},
                   {255, 272.0f}});
}

// IQ4_NL value = d · kvalues[q], kvalues = −127 −104 −83 −65 −49 −35 −22 −10 1 13 25 38 53 69
// 89 113 (ggml's kvalues_iq4nl), Q4_0 nibble order. d = 0.5, byte j = j | (15 − j) << 4.
void KernelTest::dequantizes_hand_built_iq4_nl() {
  BlockIQ4_NL block;
  block.d = 0x3800;  // fp16 0.5
  for (int j = 0; j < 16; ++j) block.qs[j] = static_cast<uint8_t>(j | (15 - j) << 4);
  expect_elements(WeightType::IQ4_NL, &block, 32,
                  {{0, -63.5f},  // kvalues[0]
                   {7, -5.0f},   // kvalues[7]
                   {8, 0.5f},    // kvalues[8]
                   {15, 56.5f},  // kvalues[15]
                   {16, 56.5f},  // high nibble of byte 0: 15
                   {20, 19.0f},  // high nibble of byte 4: 11 → 38
                   {31, -63.5f}});
}

// IQ4_XS value = d·(ls − 32)·kvalues[q], sub-block s = e / 32 with 16 bytes of Q4_0-order
// nibbles. d = 0.5; ls = {32, 33, 0, 63, 34, 34, 34, 34}: scales_l = low nibbles in pairs
// {0x10, 0xF0, 0x22, 0x22}, scales_h = high two bits at 2s: 2, 2, 0, 3, 2, 2, 2, 2 → 0xAACA.
// Every qs byte 0x0F (low nibble → 113, high → −127).
//   e = 0: dl 0 → 0;  e = 16: 0 · −127 = −0;  e = 32: 0.5·113 = 56.5;  e = 48: −63.5;
//   e = 64: −16·113 = −1808;  e = 80: 2032;  e = 96: 15.5·113 = 1751.5;  e = 255: −127
void KernelTest::dequantizes_hand_built_iq4_xs() {
  BlockIQ4_XS block;
  block.d = 0x3800;  // fp16 0.5
  block.scales_h = 0xAACA;
  const uint8_t scales_l[4] = {0x10, 0xF0, 0x22, 0x22};
  std::memcpy(block.scales_l, scales_l, 4);
  std::memset(block.qs, 0x0F, sizeof block.qs);
  expect_elements(WeightType::IQ4_XS, &block, 256,
                  {{0, 0.0f},
                   {16, -0.0f},
                   {32, 56.5f},
                   {48, -63.5f},
                   {64, -1808.0f},
                   {80, 2032.0f},
                   {96, 1751.5f},
                   {255, -127.0f}});
}

// tests/data/quant_golden.json: blocks and their values from gguf.quants.dequantize
// (tools/golden_quants.py, gguf 0.19.0), an implementation that shares no code with ours: random
// and edge-case blocks, and blocks taken from real files (llama-quantize's Q4_K_M, Q5_K_M, Q6_K,
// Q3_K_M, IQ4_XS and Q2_K files of the embedded model, and a Q2_K file of a synthetic model whose
// rows take Q2_K; each case names its file and tensor).
// Every element of every block must match bitwise.
void KernelTest::dequantizes_golden_blocks_data() {
  QTest::addColumn<QString>("type_name");
  for (const char* name :
       {"Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"}) {
    QTest::newRow(name) << QString(name);
  }
}

void KernelTest::dequantizes_golden_blocks() {
  QFETCH(QString, type_name);
  QFile file(QStringLiteral(TOKENFAB_SOURCE_DIR "/tests/data/quant_golden.json"));
  QVERIFY2(file.open(QIODevice::ReadOnly), qPrintable(file.fileName()));
  QJsonParseError parse_error;
  const QJsonDocument doc = QJsonDocument::fromJson(file.readAll(), &parse_error);
  QVERIFY2(!doc.isNull(), qPrintable(parse_error.errorString()));
  QVERIFY(doc.object().value("generated_by").toString().contains("gguf 0.19.0"));

  std::optional<WeightType> type;
  for (int t = 0; t <= static_cast<int>(WeightType::IQ4_XS); ++t) {
    if (type_name == weight_type_name(static_cast<WeightType>(t)))
      type = static_cast<WeightType>(t);
  }
  QVERIFY(type.has_value());
  const QJsonObject entry = doc.object().value("types").toObject().value(type_name).toObject();
  QCOMPARE(entry.value("block_bytes").toInt(), block_bytes(*type));
  QCOMPARE(entry.value("block_elements").toInt(), block_elements(*type));
  const QJsonArray cases = entry.value("cases").toArray();
  QVERIFY(cases.size() >= 10);

  const int elements = block_elements(*type);
  for (const QJsonValue& value : cases) {
    const QJsonObject c = value.toObject();
    const QByteArray block = QByteArray::fromHex(c.value("block").toString().toLatin1());
    const QByteArray want_bytes = QByteArray::fromBase64(c.value("values").toString().toLatin1());
    QCOMPARE(block.size(), block_bytes(*type));
    QCOMPARE(want_bytes.size(), elements * 4);
    std::vector<float> want(static_cast<size_t>(elements));
    std::memcpy(want.data(), want_bytes.constData(), want_bytes.size());  // little-endian f32
    std::vector<float> got(static_cast<size_t>(elements));
    dequantize_row(*type, block.constData(), got.data(), elements);
    const QString mismatch = first_mismatch(got.data(), want);
    if (!mismatch.isEmpty()) {
      QFAIL(qPrintable(
          QString("%1, block \"%2\": %3").arg(type_name, c.value("name").toString(), mismatch)));
    }
  }
}

// describe_bad_block: "" for finite scales; the first NaN or infinite fp16 scale named by block
// and field. Rows: each block type and each of its fp16 fields.
void KernelTest::describe_bad_block_names_the_block_data() {
  QTest::addColumn<WeightType>("type");
  QTest::addColumn<int>("offset");
  QTest::addColumn<QString>("field");
  const struct {
    WeightType type;
    size_t offset;
    const char* field;
  } rows[] = {
      {WeightType::Q4_0, offsetof(BlockQ4_0, d), "d"},
      {WeightType::Q4_1, offsetof(BlockQ4_1, d), "d"},
      {WeightType::Q4_1, offsetof(BlockQ4_1, m), "m"},
      {WeightType::Q8_0, offsetof(BlockQ8_0, d), "d"},
      {WeightType::Q5_0, offsetof(BlockQ5_0, d), "d"},
      {WeightType::Q5_1, offsetof(BlockQ5_1, d), "d"},
      {WeightType::Q5_1, offsetof(BlockQ5_1, m), "m"},
      {WeightType::Q2_K, offsetof(BlockQ2_K, d), "d"},
      {WeightType::Q2_K, offsetof(BlockQ2_K, dmin), "dmin"},
      {WeightType::Q3_K, offsetof(BlockQ3_K, d), "d"},
      {WeightType::Q4_K, offsetof(BlockQ4_K, d), "d"},
      {WeightType::Q4_K, offsetof(BlockQ4_K, dmin), "dmin"},
      {WeightType::Q5_K, offsetof(BlockQ5_K, d), "d"},
      {WeightType::Q5_K, offsetof(BlockQ5_K, dmin), "dmin"},
      {WeightType::Q6_K, offsetof(BlockQ6_K, d), "d"},
      {WeightType::IQ4_NL, offsetof(BlockIQ4_NL, d), "d"},
      {WeightType::IQ4_XS, offsetof(BlockIQ4_XS, d), "d"},
  };
  for (const auto& r : rows) {
    QTest::addRow("%s %s", weight_type_name(r.type), r.field)
        << r.type << static_cast<int>(r.offset) << QString(r.field);
  }
}

void KernelTest::describe_bad_block_names_the_block() {
  QFETCH(WeightType, type);
  QFETCH(int, offset);
  QFETCH(QString, field);
  const int64_t n = 5 * block_elements(type);
  std::mt19937 rng(5);
  const std::vector<float> x = tokenfab::kernels::test::uniform_floats(rng, n, -1.0f, 1.0f);
  std::vector<uint8_t> row(row_bytes(type, n));
  quantize_row(type, x.data(), row.data(), n);
  QCOMPARE(QString::fromStdString(describe_bad_block(type, row.data(), n)), QString());

  const struct {
    uint16_t bits;
    const char* what;
  } bad[] = {{0x7E00, "nan"}, {0xFC01, "nan"}, {0x7C00, "inf"}, {0xFC00, "-inf"}};
  for (const auto& b : bad) {
    std::vector<uint8_t> broken = row;
    for (const int64_t block : {3, 4}) {  // the first bad one is named
      std::memcpy(broken.data() + block * block_bytes(type) + offset, &b.bits, 2);
    }
    const QString got = QString::fromStdString(describe_bad_block(type, broken.data(), n));
    const QString want = QString("block 3 of %1: %2 is %3 (fp16 0x%4)")
                             .arg(weight_type_name(type), field, b.what)
                             .arg(b.bits, 4, 16, QChar('0'));
    QCOMPARE(got, want);
  }
  // The largest finite and the subnormal scales are fine.
  std::vector<uint8_t> edge = row;
  const uint16_t finite[] = {0x7BFF, 0xFBFF, 0x0001};
  for (int64_t block = 0; block < 3; ++block) {
    std::memcpy(edge.data() + block * block_bytes(type) + offset, &finite[block], 2);
  }
  QCOMPARE(QString::fromStdString(describe_bad_block(type, edge.data(), n)), QString());
}

// The float types have no scales: NaN or infinite data is not the checker's business.
void KernelTest::describe_bad_block_ignores_float_types() {
  const uint16_t halves[4] = {0x7E00, 0x7C00, 0xFC00, 0x3C00};
  const float floats[2] = {std::numeric_limits<float>::quiet_NaN(), 1.0f};
  QCOMPARE(describe_bad_block(WeightType::F16, halves, 4), std::string());
  QCOMPARE(describe_bad_block(WeightType::BF16, halves, 4), std::string());
  QCOMPARE(describe_bad_block(WeightType::F32, floats, 2), std::string());
}
