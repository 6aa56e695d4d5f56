// How one GPU's SMs divide between its decode and prefill partitions (plan_sm_split,
// core/device/cuda_partition.h): decode's request rounded up to the driver's granularity, prefill
// the rest, or no split with the reason. Pure arithmetic: needs neither the CUDA headers nor a
// GPU, so it is labelled unit and runs in every build. The granularities are cuda.h's guidelines
// (compute capability 8.x: at least 4 SMs, multiples of 2; 9.0+: at least 8, multiples of 8);
// 132 SMs is an H100 SXM's or an H200's count, 108 an A100's.

#include <QtTest>
#include <algorithm>

#include "core/device/cuda_partition.h"

using tokenfab::plan_sm_split;
using tokenfab::SmSplit;

class CudaPartitionTest : public QObject {
  Q_OBJECT
 private slots:
  void rounds_decode_up_to_the_granularity_data() {
    QTest::addColumn<int>("total");
    QTest::addColumn<int>("asked");
    QTest::addColumn<int>("min_partition");
    QTest::addColumn<int>("alignment");
    QTest::addColumn<int>("decode");
    QTest::addColumn<int>("prefill");
    QTest::newRow("hopper half") << 132 << 66 << 8 << 8 << 72 << 60;
    QTest::newRow("hopper aligned") << 132 << 64 << 8 << 8 << 64 << 68;
    QTest::newRow("hopper under the minimum") << 132 << 3 << 8 << 8 << 8 << 124;
    QTest::newRow("prefill at the minimum") << 128 << 120 << 8 << 8 << 120 << 8;
    QTest::newRow("ampere odd") << 108 << 11 << 4 << 2 << 12 << 96;
    QTest::newRow("ampere under the minimum") << 108 << 1 << 4 << 2 << 4 << 104;
    QTest::newRow("minimum off the alignment") << 100 << 9 << 6 << 4 << 12 << 88;
    QTest::newRow("no granularity reported") << 10 << 3 << 0 << 0 << 3 << 7;
  }

  void rounds_decode_up_to_the_granularity() {
    QFETCH(int, total);
    QFETCH(int, asked);
    QFETCH(int, min_partition);
    QFETCH(int, alignment);
    QFETCH(int, decode);
    QFETCH(int, prefill);
    const SmSplit s = plan_sm_split(total, asked, min_partition, alignment);
    QVERIFY2(s.split(), s.why_not.c_str());
    QCOMPARE(s.decode, decode);
    QCOMPARE(s.prefill, prefill);
    QVERIFY(s.why_not.empty());
  }

  void says_why_there_is_no_split_data() {
    QTest::addColumn<int>("total");
    QTest::addColumn<int>("asked");
    QTest::addColumn<int>("min_partition");
    QTest::addColumn<int>("alignment");
    QTest::addColumn<QString>("reason");
    QTest::newRow("none asked") << 132 << 0 << 8 << 8 << "no SM split requested";
    QTest::newRow("negative") << 132 << -4 << 8 << 8 << "no SM split requested";
    QTest::newRow("whole GPU") << 132 << 132 << 8 << 8 << "leave none for prefill";
    QTest::newRow("more than the GPU") << 132 << 200 << 8 << 8 << "leave none for prefill";
    // 125 rounds up to 128, leaving 4 < 8 for prefill.
    QTest::newRow("prefill under the minimum") << 132 << 125 << 8 << 8 << "leaving 4 of 132";
  }

  void says_why_there_is_no_split() {
    QFETCH(int, total);
    QFETCH(int, asked);
    QFETCH(int, min_partition);
    QFETCH(int, alignment);
    QFETCH(QString, reason);
    const SmSplit s = plan_sm_split(total, asked, min_partition, alignment);
    QVERIFY(!s.split());
    QCOMPARE(s.decode, 0);
    QCOMPARE(s.prefill, 0);
    QVERIFY2(QString::fromStdString(s.why_not).contains(reason), s.why_not.c_str());
  }

  // Over every small GPU and granularity: a split gives decode the least multiple of the
  // alignment that reaches both the request and the minimum, prefill the rest and at least the
  // minimum; no split happens only when that would fail.
  void split_is_the_least_granular_cover() {
    for (int total = 1; total <= 40; ++total)
      for (int min_partition = 1; min_partition <= 9; ++min_partition)
        for (int alignment = 1; alignment <= 8; ++alignment)
          for (int asked = -1; asked <= total + 1; ++asked) {
            const SmSplit s = plan_sm_split(total, asked, min_partition, alignment);
            int least = alignment;
            while (least < std::max(asked, min_partition)) least += alignment;
            const bool possible = asked > 0 && asked < total && total - least >= min_partition;
            QCOMPARE(s.split(), possible);
            QCOMPARE(s.why_not.empty(), possible);
            if (!possible) continue;
            QCOMPARE(s.decode, least);
            QCOMPARE(s.decode + s.prefill, total);
            QVERIFY(s.prefill >= min_partition);
          }
  }
};

QTEST_APPLESS_MAIN(CudaPartitionTest)
#include "test_cuda_partition.moc"
