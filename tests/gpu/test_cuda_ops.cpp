// Each CUDA op against its CPU reference op on random inputs of model-like shapes (odd row
// counts; n = 32, 576, 1536, 4096 — SmolLM2 uses 576 and 1536). Skips when no CUDA device exists.

#include <QtTest/QtTest>

#include <cuda_runtime.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/quant_types.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/dequantize.cuh"
#include "kernels/cuda/rms_norm.cuh"
#include "kernels/cuda/silu_mul.cuh"

namespace {

using namespace tokenfab::kernels;

// Tolerances. rms_norm: the GPU sums squares in f32 in a different order than the CPU's f64 sum,
// which moves the row scale by a few ulp — relative 1e-5 per element. silu_mul: CUDA's expf is
// within 2 ulp of the true exp and everything else is IEEE-rounded — relative 1e-5 per element.
// dequantize: the same IEEE operations in the same order — bit-exact (NaN payloads aside).
constexpr float kRmsNormRel = 1e-5f;
constexpr float kSiluMulRel = 1e-5f;
constexpr float kEps = 1e-5f;

// Device memory for `count` values of T, freed when the buffer goes out of scope.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count) : count_(count) {
    TOKENFAB_CUDA_CHECK(cudaMalloc(&data_, bytes()));
  }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return data_; }
  size_t bytes() const { return count_ * sizeof(T); }
  void upload(const std::vector<T>& host) {
    TOKENFAB_CUDA_CHECK(cudaMemcpy(data_, host.data(), bytes(), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    TOKENFAB_CUDA_CHECK(cudaMemcpy(host.data(), data_, bytes(), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* data_ = nullptr;
  size_t count_;
};

std::vector<float> random_floats(std::mt19937& rng, size_t count, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(count);
  for (float& x : v) x = dist(rng);
  return v;
}

// Index of the first element outside |got - want| <= rel·|want|, or -1 when all are within.
int64_t first_relative_mismatch(const std::vector<float>& got, const std::vector<float>& want,
                                float rel) {
  for (size_t i = 0; i < want.size(); ++i)
    if (!(std::fabs(got[i] - want[i]) <= rel * std::fabs(want[i]))) return static_cast<int64_t>(i);
  return -1;
}

// Index of the first element whose bits differ (two NaNs count as equal), or -1.
int64_t first_bit_mismatch(const std::vector<float>& got, const std::vector<float>& want) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(got[i]) && std::isnan(want[i])) continue;
    if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want[i]))
      return static_cast<int64_t>(i);
  }
  return -1;
}

QByteArray mismatch_message(const char* what, int64_t index, int64_t n, const std::vector<float>& got,
                            const std::vector<float>& want) {
  return QStringLiteral("%1: row %2 col %3: gpu %4, cpu %5")
      .arg(what)
      .arg(index / n)
      .arg(index % n)
      .arg(static_cast<double>(got[index]), 0, 'g', 9)
      .arg(static_cast<double>(want[index]), 0, 'g', 9)
      .toUtf8();
}

// Shapes (rows, n) every op runs on; odd row counts so no kernel can rely on pairs of rows.
void add_shape_rows() {
  QTest::addColumn<qint64>("rows");
  QTest::addColumn<qint64>("n");
  const qint64 shapes[][2] = {{1, 32}, {7, 32}, {3, 576}, {33, 576}, {5, 1536}, {1, 4096}, {9, 4096}};
  for (const auto& s : shapes)
    QTest::addRow("%lldx%lld", static_cast<long long>(s[0]), static_cast<long long>(s[1]))
        << s[0] << s[1];
}

}  // namespace

class TestCudaOps : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void cleanupTestCase();
  void rms_norm_matches_cpu_data() { add_shape_rows(); }
  void rms_norm_matches_cpu();
  void silu_mul_matches_cpu_data() { add_shape_rows(); }
  void silu_mul_matches_cpu();
  void dequantize_matches_cpu_exactly_data();
  void dequantize_matches_cpu_exactly();
  void dequantize_rejects_bad_arguments();

 private:
  cudaStream_t stream_ = nullptr;
};

void TestCudaOps::initTestCase() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess)
    QSKIP(qPrintable(QStringLiteral("no CUDA device: cudaGetDeviceCount failed: %1")
                         .arg(QString::fromUtf8(cudaGetErrorString(err)))));
  if (count == 0) QSKIP("no CUDA device: cudaGetDeviceCount returned 0");
  // The ops run on a stream of their own, as the backend will use them.
  TOKENFAB_CUDA_CHECK(cudaStreamCreate(&stream_));
}

void TestCudaOps::cleanupTestCase() {
  if (stream_) cudaStreamDestroy(stream_);
}

void TestCudaOps::rms_norm_matches_cpu() {
  QFETCH(qint64, rows);
  QFETCH(qint64, n);
  std::mt19937 rng(static_cast<uint32_t>(rows * 7919 + n));
  // x: (rows, n); w: (n).
  const std::vector<float> x = random_floats(rng, rows * n, -3.0f, 3.0f);
  const std::vector<float> w = random_floats(rng, n, 0.25f, 2.0f);
  std::vector<float> want(rows * n);  // (rows, n)
  for (int64_t r = 0; r < rows; ++r) rms_norm(x.data() + r * n, w.data(), want.data() + r * n, n, kEps);

  DeviceBuffer<float> dx(x.size()), dw(w.size()), dy(want.size());
  dx.upload(x);
  dw.upload(w);
  launch_rms_norm(dx.get(), dw.get(), dy.get(), rows, n, kEps, stream_);
  TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const std::vector<float> got = dy.download();
  const int64_t bad = first_relative_mismatch(got, want, kRmsNormRel);
  QVERIFY2(bad < 0, mismatch_message("rms_norm", bad, n, got, want).constData());

  // In place (y == x) gives the same values.
  launch_rms_norm(dx.get(), dw.get(), dx.get(), rows, n, kEps, stream_);
  TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const std::vector<float> in_place = dx.download();
  const int64_t bad_in_place = first_bit_mismatch(in_place, got);
  QVERIFY2(bad_in_place < 0,
           mismatch_message("rms_norm in place", bad_in_place, n, in_place, got).constData());
}

void TestCudaOps::silu_mul_matches_cpu() {
  QFETCH(qint64, rows);
  QFETCH(qint64, n);
  std::mt19937 rng(static_cast<uint32_t>(rows * 104729 + n));
  // gate, up: (rows, n), flattened; the gate range reaches where exp(-gate) is large and tiny.
  const std::vector<float> gate = random_floats(rng, rows * n, -12.0f, 12.0f);
  const std::vector<float> up = random_floats(rng, rows * n, -3.0f, 3.0f);
  std::vector<float> want = gate;
  silu_mul_scalar(want.data(), up.data(), rows * n);  // the reference, not the AVX2 variant

  DeviceBuffer<float> dgate(gate.size()), dup(up.size());
  dgate.upload(gate);
  dup.upload(up);
  launch_silu_mul(dgate.get(), dup.get(), rows * n, stream_);
  TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const std::vector<float> got = dgate.download();
  const int64_t bad = first_relative_mismatch(got, want, kSiluMulRel);
  QVERIFY2(bad < 0, mismatch_message("silu_mul", bad, n, got, want).constData());
}

void TestCudaOps::dequantize_matches_cpu_exactly_data() {
  QTest::addColumn<int>("type");
  QTest::addColumn<qint64>("rows");
  QTest::addColumn<qint64>("n");
  const WeightType types[] = {WeightType::F32,  WeightType::F16,  WeightType::BF16,
                              WeightType::Q4_0, WeightType::Q4_1, WeightType::Q8_0};
  const qint64 shapes[][2] = {{1, 32}, {7, 32}, {3, 576}, {33, 576}, {5, 1536}, {9, 4096}};
  for (WeightType type : types)
    for (const auto& s : shapes)
      QTest::addRow("%s %lldx%lld", weight_type_name(type), static_cast<long long>(s[0]),
                    static_cast<long long>(s[1]))
          << static_cast<int>(type) << s[0] << s[1];
}

void TestCudaOps::dequantize_matches_cpu_exactly() {
  QFETCH(int, type);
  QFETCH(qint64, rows);
  QFETCH(qint64, n);
  const auto wtype = static_cast<WeightType>(type);
  std::mt19937 rng(static_cast<uint32_t>(type * 31337 + rows * 101 + n));
  const size_t stride = row_bytes(wtype, static_cast<uint64_t>(n));
  std::vector<uint8_t> src(stride * rows);  // rows of n elements of `type`, back to back

  if (wtype == WeightType::F16 || wtype == WeightType::BF16) {
    // Every 16-bit pattern is a value: random bits reach subnormals, infinities and NaNs.
    std::uniform_int_distribution<int> bits(0, 0xffff);
    for (size_t i = 0; i + 1 < src.size(); i += 2) {
      const auto v = static_cast<uint16_t>(bits(rng));
      std::memcpy(src.data() + i, &v, sizeof v);
    }
  } else {
    // Rows of different magnitudes, so the block scales span a wide range.
    for (int64_t r = 0; r < rows; ++r) {
      const float scale = std::ldexp(1.0f, static_cast<int>(r % 13) - 6);
      const std::vector<float> x = random_floats(rng, n, -scale, scale);
      quantize_row(wtype, x.data(), src.data() + r * stride, n);
    }
  }
  std::vector<float> want(rows * n);  // (rows, n)
  for (int64_t r = 0; r < rows; ++r) dequantize_row(wtype, src.data() + r * stride, want.data() + r * n, n);

  DeviceBuffer<uint8_t> dsrc(src.size());
  DeviceBuffer<float> dy(want.size());
  dsrc.upload(src);
  launch_dequantize_rows(type, dsrc.get(), dy.get(), rows, n, stream_);
  TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const std::vector<float> got = dy.download();
  const int64_t bad = first_bit_mismatch(got, want);
  QVERIFY2(bad < 0, mismatch_message("dequantize", bad, n, got, want).constData());
}

void TestCudaOps::dequantize_rejects_bad_arguments() {
  DeviceBuffer<float> dy(64);
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument,
                           launch_dequantize_rows(99, dy.get(), dy.get(), 1, 32, stream_));
  QVERIFY_THROWS_EXCEPTION(
      std::invalid_argument,
      launch_dequantize_rows(static_cast<int>(WeightType::Q4_0), dy.get(), dy.get(), 1, 48, stream_));
}

QTEST_APPLESS_MAIN(TestCudaOps)
#include "test_cuda_ops.moc"
