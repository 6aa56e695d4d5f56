// Block formats against hand-built bytes and hand-computed values; fp16 / bf16 conversions over
// every value and every rounding midpoint.

#include <QtTest>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

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
