// The GPU's weight decoders (kernels/cuda/dequantize_device.cuh, what the dequantize and
// embedding kernels run per element) run on the host, against kernels::dequantize_row bit for
// bit: every element of random rows of every weight type — random bytes, so every level,
// sub-block scale and minimum occurs, with finite fp16 scales over their whole range (subnormal
// ones among them, and ±0 often enough that zeros of either sign meet in the final additions and
// subtractions, whose order decides the sign of the result), and rows whose scales may be NaN or
// infinite too. On the host
// the decoders round each operation on its own as the device's _rn intrinsics do, so this checks
// the layouts, the index arithmetic and the order of operations the GPU uses; the device's own
// fp16 conversion and intrinsics are IEEE-exact, and test_cuda_ops (label gpu) compares the
// kernels with the CPU on a GPU. Needs the CUDA headers but no GPU: labelled unit.

#include <QtTest>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/quantize.h"
#include "kernels/cuda/dequantize_device.cuh"

using namespace tokenfab::kernels;

namespace {

// The byte offsets of a block's fp16 scales: d, and m or dmin where the format has one (−1 where
// it has not), with the names describe_bad_block gives them (checked below).
struct ScaleFields {
  int d = 0;
  int second = -1;
  const char* second_name = "";
};
ScaleFields scale_fields(WeightType type) {
  switch (type) {
    case WeightType::Q4_1:
    case WeightType::Q5_1:
      return {0, 2, "m"};
    case WeightType::Q4_K:
    case WeightType::Q5_K:
      return {0, 2, "dmin"};
    case WeightType::Q2_K:
      return {offsetof(BlockQ2_K, d), offsetof(BlockQ2_K, dmin), "dmin"};
    case WeightType::Q3_K:
      return {offsetof(BlockQ3_K, d)};
    case WeightType::Q6_K:
      return {offsetof(BlockQ6_K, d)};
    default:
      return {};  // Q4_0, Q8_0, Q5_0, IQ4_NL, IQ4_XS: d first
  }
}

// `rows` rows of n elements of `type` from random bytes. With finite_scales, each fp16 scale is
// then ±0 one time in four (so that zero products of either sign meet in the final additions and
// subtractions) and otherwise random finite bits; without, the scales stay random bits (NaN and
// infinities among them).
std::vector<uint8_t> random_rows(std::mt19937& rng, WeightType type, int64_t rows, int64_t n,
                                 bool finite_scales) {
  std::vector<uint8_t> bytes(row_bytes(type, static_cast<uint64_t>(n)) * rows);
  std::uniform_int_distribution<int> byte(0, 255), bits(0, 0xffff), quarter(0, 3);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(byte(rng));
  if (!finite_scales || !is_block_quantized(type)) return bytes;
  const ScaleFields f = scale_fields(type);
  for (size_t at = 0; at < bytes.size(); at += static_cast<size_t>(block_bytes(type)))
    for (const int offset : {f.d, f.second}) {
      if (offset < 0) continue;
      uint16_t h = static_cast<uint16_t>(bits(rng));
      if (quarter(rng) == 0) h &= 0x8000;
      while ((h & 0x7c00) == 0x7c00) h = static_cast<uint16_t>(bits(rng));
      std::memcpy(bytes.data() + at + offset, &h, sizeof h);
    }
  return bytes;
}

}  // namespace

class DequantizeDeviceTest : public QObject {
  Q_OBJECT
 private slots:
  void decodes_every_element_as_the_cpu_data() {
    QTest::addColumn<int>("type");
    QTest::addColumn<bool>("finite_scales");
    for (int t = 0; t < cuda_detail::kWeightTypeCount; ++t) {
      const char* name = weight_type_name(static_cast<WeightType>(t));
      QTest::addRow("%s", name) << t << true;
      if (is_block_quantized(static_cast<WeightType>(t)))
        QTest::addRow("%s, any scales", name) << t << false;
    }
  }

  void decodes_every_element_as_the_cpu() {
    QFETCH(int, type);
    QFETCH(bool, finite_scales);
    const auto wtype = static_cast<WeightType>(type);
    std::mt19937 rng(static_cast<uint32_t>(17 + type));
    const int64_t rows = 24, n = 4 * kQK_K;
    const size_t stride = row_bytes(wtype, static_cast<uint64_t>(n));
    const std::vector<uint8_t> bytes = random_rows(rng, wtype, rows, n, finite_scales);
    std::vector<float> want(static_cast<size_t>(n));
    int64_t zeros = 0, negative_zeros = 0;
    if (finite_scales)
      for (int64_t r = 0; r < rows; ++r)
        QCOMPARE(describe_bad_block(wtype, bytes.data() + stride * r, n), std::string());
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* row = bytes.data() + stride * r;
      dequantize_row(wtype, row, want.data(), n);
      QString failure;
      cuda_detail::with_weight_type(type, [&](auto t) {
        for (int64_t i = 0; i < n && failure.isEmpty(); ++i) {
          const float got = cuda_detail::dequantize_element<decltype(t)::value>(row, i);
          const float w = want[static_cast<size_t>(i)];
          zeros += w == 0.0f;
          negative_zeros += w == 0.0f && std::signbit(w);
          if (std::isnan(got) && std::isnan(w)) continue;
          if (std::bit_cast<uint32_t>(got) != std::bit_cast<uint32_t>(w))
            failure = QStringLiteral(
                          "row %1 element %2: %3 (0x%4) on the device's path, %5 (0x%6) "
                          "on the CPU's")
                          .arg(r)
                          .arg(i)
                          .arg(static_cast<double>(got), 0, 'g', 9)
                          .arg(std::bit_cast<uint32_t>(got), 8, 16, QChar('0'))
                          .arg(static_cast<double>(w), 0, 'g', 9)
                          .arg(std::bit_cast<uint32_t>(w), 8, 16, QChar('0'));
        }
      });
      QVERIFY2(failure.isEmpty(), qPrintable(failure));
    }
    // The rows held zeros of both signs.
    if (is_block_quantized(wtype) && finite_scales) {
      QVERIFY2(
          negative_zeros > 0 && zeros > negative_zeros,
          qPrintable(QStringLiteral("%1 zeros, %2 of them -0").arg(zeros).arg(negative_zeros)));
    }
  }

  // The scale offsets random_rows writes are the ones describe_bad_block reads.
  void scale_fields_are_the_loaders() {
    for (int t = 0; t < cuda_detail::kWeightTypeCount; ++t) {
      const auto type = static_cast<WeightType>(t);
      if (!is_block_quantized(type)) continue;
      const ScaleFields f = scale_fields(type);
      for (const auto& [offset, name] : {std::pair{f.d, "d"}, std::pair{f.second, f.second_name}}) {
        if (offset < 0) continue;
        std::vector<uint8_t> block(static_cast<size_t>(block_bytes(type)), 0);
        const uint16_t inf = 0x7c00;
        std::memcpy(block.data() + offset, &inf, sizeof inf);
        QCOMPARE(describe_bad_block(type, block.data(), block_elements(type)),
                 std::string("block 0 of ") + weight_type_name(type) + ": " + name +
                     " is inf (fp16 0x7c00)");
      }
    }
  }

  void every_type_has_a_decoder() {
    for (int t = 0; t < cuda_detail::kWeightTypeCount; ++t)
      QVERIFY(cuda_detail::with_weight_type(t, [](auto) {}));
    QVERIFY(!cuda_detail::with_weight_type(cuda_detail::kWeightTypeCount, [](auto) {}));
    QVERIFY(!cuda_detail::with_weight_type(-1, [](auto) {}));
  }
};

QTEST_GUILESS_MAIN(DequantizeDeviceTest)
#include "test_dequantize_device.moc"
