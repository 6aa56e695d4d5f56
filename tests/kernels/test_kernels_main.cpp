// The suite's main, and what the CPU offers (AVX2 tests skip without it).

#include <QtTest>

#include "kernels/cpu/cpu_features.h"
#include "tests/kernels/kernel_test.h"

void KernelTest::initTestCase() {
  const auto& f = tokenfab::kernels::cpu_features();
  qInfo("cpu features: avx2=%d avx512=%d avx512_vnni=%d", f.avx2, f.avx512, f.avx512_vnni);
}

QTEST_MAIN(KernelTest)
