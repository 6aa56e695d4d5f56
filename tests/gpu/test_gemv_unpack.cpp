// The block GEMV's unpacking (kernels/cuda/gemv_unpack.cuh) run on the host, against the layout's
// own element values (gemv_block_value, which equal kernels::dequantize_row's): every weight of
// random Q4_0, Q4_1 and Q8_0 blocks, as the GPU's chunks see them — the quants as little-endian
// words, eight weights per call. Needs the CUDA headers (built only with TOKENFAB_CUDA) but no
// GPU, so it is labelled unit and runs in CI.

#include <QtTest>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/quantize.h"
#include "kernels/cuda/gemv_blocks.h"
#include "kernels/cuda/gemv_unpack.cuh"

using namespace tokenfab::kernels;

Q_DECLARE_METATYPE(tokenfab::kernels::WeightType)

class GemvUnpackTest : public QObject {
  Q_OBJECT
 private slots:
  void unpacks_every_weight_data() {
    QTest::addColumn<WeightType>("type");
    QTest::newRow("q4_0") << WeightType::Q4_0;
    QTest::newRow("q4_1") << WeightType::Q4_1;
    QTest::newRow("q8_0") << WeightType::Q8_0;
  }

  void unpacks_every_weight() {
    QFETCH(WeightType, type);
    const int64_t rows = 4, k = 128;
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
    std::vector<float> x(static_cast<size_t>(rows * k));
    for (float& v : x) v = dist(rng);
    std::vector<uint8_t> bytes(row_bytes(type, k) * rows);
    for (int64_t r = 0; r < rows; ++r)
      quantize_row(type, x.data() + r * k, bytes.data() + row_bytes(type, k) * r, k);
    GemvBlocks blocks;
    QVERIFY(append_gemv_blocks(type, bytes.data(), rows, k, blocks));
    const bool q4 = blocks.format == GemvWeights::kQ4;
    const int quant_bytes = q4 ? 16 : 32;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = 0; b < k / 32; ++b) {
        const int64_t block = r * (k / 32) + b;
        uint32_t words[8] = {};
        std::memcpy(words, blocks.q.data() + block * quant_bytes, static_cast<size_t>(quant_bytes));
        const uint32_t pair = blocks.scales[static_cast<size_t>(block)];
        for (int g = 0; g < 4; ++g) {
          float w[8];
          if (q4) {
            const uint32_t q[4] = {words[0], words[1], words[2], words[3]};
            gemv_detail::q4_block_weights(q, pair, g, w);
          } else {
            gemv_detail::q8_block_weights(words, pair, g, w);
          }
          for (int t = 0; t < 8; ++t) {
            const int64_t i = b * 32 + 8 * g + t;
            const float want = gemv_block_value(blocks, r, i);
            QVERIFY2(std::memcmp(&w[t], &want, sizeof(float)) == 0,
                     qPrintable(QString("row %1, element %2: unpacked %3, the layout's value %4")
                                    .arg(r)
                                    .arg(i)
                                    .arg(static_cast<double>(w[t]), 0, 'g', 9)
                                    .arg(static_cast<double>(want), 0, 'g', 9)));
          }
        }
      }
  }
};

QTEST_APPLESS_MAIN(GemvUnpackTest)
#include "test_gemv_unpack.moc"
