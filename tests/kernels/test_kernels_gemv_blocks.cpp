// The quantized GPU GEMV's weight layout (kernels/cuda/gemv_blocks.h), built on the host: every
// element equals kernels::dequantize_row's value for the file's block exactly (Q4_0's zero is
// +0 where d·(q − 8) gives −0 for a negative d: equal values, so equal products), for each block
// type and for matrices stacked from parts; what has no such form (F16, Q5_0, Q5_1, the K-quants,
// IQ4) is refused.

#include <QtTest>
#include <cmath>

#include "kernels/cpu/quantize.h"
#include "kernels/cuda/gemv_blocks.h"
#include "tests/kernels/kernel_test.h"

using namespace tokenfab::kernels;

void KernelTest::gemv_blocks_equal_dequantized_rows_data() {
  QTest::addColumn<WeightType>("type");
  QTest::newRow("q4_0") << WeightType::Q4_0;
  QTest::newRow("q4_1") << WeightType::Q4_1;
  QTest::newRow("q8_0") << WeightType::Q8_0;
}

void KernelTest::gemv_blocks_equal_dequantized_rows() {
  QFETCH(WeightType, type);
  // A matrix stacked from two parts (3 and 5 rows of 96), as the GPU stacks Q, K and V.
  const int64_t k = 96;
  const int64_t part_rows[2] = {3, 5};
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  std::vector<std::vector<uint8_t>> parts;
  std::vector<std::vector<float>> want;  // per row, dequantize_row's values
  GemvBlocks blocks;
  for (const int64_t rows : part_rows) {
    std::vector<uint8_t> bytes(row_bytes(type, k) * rows);
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<float> x(k);
      for (float& v : x) v = dist(rng);
      uint8_t* row = bytes.data() + row_bytes(type, k) * r;
      quantize_row(type, x.data(), row, k);
      want.emplace_back(k);
      dequantize_row(type, row, want.back().data(), k);
    }
    QVERIFY(append_gemv_blocks(type, bytes.data(), rows, k, blocks));
  }
  QCOMPARE(blocks.rows, int64_t{8});
  QCOMPARE(blocks.k, k);
  QCOMPARE(blocks.format, type == WeightType::Q8_0 ? GemvWeights::kQ8 : GemvWeights::kQ4);
  QCOMPARE(blocks.bytes(), uint64_t{8} * (k / 32) * (type == WeightType::Q8_0 ? 36 : 20));
  for (int64_t r = 0; r < 8; ++r)
    for (int64_t i = 0; i < k; ++i) {
      const float got = gemv_block_value(blocks, r, i), expected = want[r][i];
      QVERIFY2(got == expected, qPrintable(QString("row %1, element %2: %3, dequantize_row %4")
                                               .arg(r)
                                               .arg(i)
                                               .arg(static_cast<double>(got), 0, 'g', 9)
                                               .arg(static_cast<double>(expected), 0, 'g', 9)));
    }
}

void KernelTest::gemv_blocks_refuse_what_has_no_quantized_form() {
  const int64_t k = 64;
  std::vector<float> x(k, 0.5f);
  std::vector<uint8_t> q4(row_bytes(WeightType::Q4_1, k)), q8(row_bytes(WeightType::Q8_0, k));
  quantize_row(WeightType::Q4_1, x.data(), q4.data(), k);
  quantize_row(WeightType::Q8_0, x.data(), q8.data(), k);
  std::vector<uint16_t> f16(k, fp32_to_fp16(0.5f));
  GemvBlocks blocks;
  QVERIFY(!append_gemv_blocks(WeightType::F16, f16.data(), 1, k, blocks));  // no block form
  QCOMPARE(blocks.format, GemvWeights::kBf16);
  QVERIFY(append_gemv_blocks(WeightType::Q4_1, q4.data(), 1, k, blocks));
  // A part of another type or width, stacked on it, is refused and leaves the matrix as it was.
  QVERIFY(!append_gemv_blocks(WeightType::Q8_0, q8.data(), 1, k, blocks));
  QVERIFY(!append_gemv_blocks(WeightType::Q4_1, q4.data(), 1, k / 2, blocks));
  QCOMPARE(blocks.rows, int64_t{1});
  QCOMPARE(blocks.q.size(), size_t{32});
  // Q5_0, Q5_1, the K-quants and IQ4 have no quantized form (the GPU keeps them in BF16): refused
  // alone and as a part stacked on a quantized matrix, which stays as it was.
  for (int t = static_cast<int>(WeightType::Q5_0); t <= static_cast<int>(WeightType::IQ4_XS); ++t) {
    const auto type = static_cast<WeightType>(t);
    const int64_t n = kQK_K;
    std::vector<float> v(n, 0.5f);
    std::vector<uint8_t> row(row_bytes(type, n));
    quantize_row(type, v.data(), row.data(), n);
    QCOMPARE(gemv_format(type), GemvWeights::kBf16);
    QVERIFY2(!gemv_blocks_representable(type, row.data(), 1, n), weight_type_name(type));
    GemvBlocks alone;
    QVERIFY2(!append_gemv_blocks(type, row.data(), 1, n, alone), weight_type_name(type));
    QCOMPARE(alone.format, GemvWeights::kBf16);
    QVERIFY(alone.q.empty() && alone.scales.empty());
    QVERIFY2(!append_gemv_blocks(type, row.data(), 1, n, blocks), weight_type_name(type));
    QCOMPARE(blocks.format, GemvWeights::kQ4);
    QCOMPARE(blocks.rows, int64_t{1});
    QCOMPARE(blocks.q.size(), size_t{32});
  }
  // A Q4_0 scale whose −8·d would overflow fp16.
  BlockQ4_0 huge{};
  huge.d = fp32_to_fp16(16384.0f);
  GemvBlocks other;
  QVERIFY(!append_gemv_blocks(WeightType::Q4_0, &huge, 1, 32, other));
  QCOMPARE(other.format, GemvWeights::kBf16);
  // What the GPU's memory count asks of a matrix is what the upload then does with it.
  QVERIFY(!gemv_blocks_representable(WeightType::Q4_0, &huge, 1, 32));
  QVERIFY(!gemv_blocks_representable(WeightType::F16, f16.data(), 1, k));
  QVERIFY(!gemv_blocks_representable(WeightType::Q4_1, q4.data(), 1, 48));  // not whole blocks
  QVERIFY(gemv_blocks_representable(WeightType::Q4_1, q4.data(), 1, k));
  huge.d = fp32_to_fp16(0.25f);
  QVERIFY(gemv_blocks_representable(WeightType::Q4_0, &huge, 1, 32));
  QVERIFY(append_gemv_blocks(WeightType::Q4_0, &huge, 1, 32, other));
}
