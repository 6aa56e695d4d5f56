// The decode GEMV (kernels/cuda/gemv.cuh) against plain double-precision loops on the host, for
// each epilogue, with and without the fused RMSNorm, at 1 … 8 rows and k both a multiple of the
// warp's 256-element stride and not (tails), over BF16 weights and over the file's Q4_0, Q4_1
// and Q8_0 blocks (gemv_blocks.h); overlapped launches against serial ones. Skips when no CUDA
// device exists.
//
// Tolerance. The weights (bf16, or blocks, whose values are exact in f32) enter the reference
// with their exact values, so the only error
// is the GPU's f32 arithmetic: products summed in f32 (per lane, then a 32-lane tree) and, with
// the norm, the row scale 1/√(mean(x²) + eps) and x·scale·w rounded in f32. Each sum is then
// within about (k/256 + 8)·2^-24·Σ|w·x| of the exact value; we allow 1e-5·Σ|w·x| + 1e-6·|y|.
// SwiGLU and RoPE carry that error through their formulas (bounds below); fp16 pool entries are
// allowed one more half-ulp (2^-11·|value|).

#include <QtTest/QtTest>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/quant_types.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/overlap_support.cuh"
#include "tests/gpu/cuda_test_support.h"

namespace {

using namespace tokenfab::kernels;
using namespace tokenfab::kernels::testing;

constexpr float kEps = 1e-5f;
constexpr double kSumRel = 1e-5;
constexpr double kValueRel = 1e-6;

// The exact product of one call: y[r, j] = Σ_i w[j, i]·x'[r, i] (x' = the normed row when a norm
// weight is given) and Σ|w·x'| for the bounds.
struct Reference {
  std::vector<double> y, magnitude;  // (m, n)
};

Reference reference(const std::vector<float>& x, int m, int64_t k, const std::vector<float>* norm,
                    const std::vector<float>& w, int64_t n) {
  Reference ref{std::vector<double>(static_cast<size_t>(m * n)),
                std::vector<double>(static_cast<size_t>(m * n))};
  std::vector<double> xr(static_cast<size_t>(k));
  for (int r = 0; r < m; ++r) {
    double ss = 0.0;
    for (int64_t i = 0; i < k; ++i) ss += double{x[r * k + i]} * x[r * k + i];
    const double scale = 1.0 / std::sqrt(ss / static_cast<double>(k) + kEps);
    for (int64_t i = 0; i < k; ++i)
      xr[i] = norm ? double{x[r * k + i]} * scale * (*norm)[i] : double{x[r * k + i]};
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0, mag = 0.0;
      for (int64_t i = 0; i < k; ++i) {
        const double prod = double{w[j * k + i]} * xr[i];
        sum += prod;
        mag += std::fabs(prod);
      }
      ref.y[r * n + j] = sum;
      ref.magnitude[r * n + j] = mag;
    }
  }
  return ref;
}

double bound(const Reference& ref, int64_t i) {
  return kSumRel * ref.magnitude[i] + kValueRel * std::fabs(ref.y[i]);
}

QByteArray message(const char* what, int r, int64_t j, double got, double want, double allowed) {
  return QStringLiteral("%1: row %2 col %3: gpu %4, reference %5, allowed ±%6")
      .arg(what)
      .arg(r)
      .arg(j)
      .arg(got, 0, 'g', 9)
      .arg(want, 0, 'g', 9)
      .arg(allowed, 0, 'g', 3)
      .toUtf8();
}

// Random bf16 weights (n, k): bits for the GPU, exact values for the reference.
void random_weights(std::mt19937& rng, int64_t n, int64_t k, std::vector<uint16_t>& bits,
                    std::vector<float>& values) {
  const std::vector<float> raw = random_floats(rng, static_cast<size_t>(n * k), -1.0f, 1.0f);
  bits.resize(raw.size());
  values.resize(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    bits[i] = fp32_to_bf16(raw[i]);
    values[i] = bf16_to_fp32(bits[i]);
  }
}

// Random weights (n, k) of one layout, with their exact values for the reference: "bf16" bits,
// or "q4_0", "q4_1" or "q8_0" blocks (random rows quantized) in the block GEMV's layout.
struct TestWeights {
  std::vector<float> values;  // (n, k)
  std::vector<uint16_t> bf16;
  GemvBlocks blocks;
};

TestWeights random_test_weights(std::mt19937& rng, const QString& layout, int64_t n, int64_t k) {
  TestWeights t;
  if (layout == "bf16") {
    random_weights(rng, n, k, t.bf16, t.values);
    return t;
  }
  const WeightType type = layout == "q4_0"   ? WeightType::Q4_0
                          : layout == "q4_1" ? WeightType::Q4_1
                                             : WeightType::Q8_0;
  const std::vector<float> raw = random_floats(rng, static_cast<size_t>(n * k), -1.0f, 1.0f);
  std::vector<uint8_t> bytes(row_bytes(type, static_cast<uint64_t>(k)) * static_cast<uint64_t>(n));
  for (int64_t r = 0; r < n; ++r)
    quantize_row(type, raw.data() + r * k, bytes.data() + row_bytes(type, k) * r, k);
  if (!append_gemv_blocks(type, bytes.data(), n, k, t.blocks))
    throw std::runtime_error("append_gemv_blocks refused " + layout.toStdString());
  t.values.resize(raw.size());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < k; ++i) t.values[r * k + i] = gemv_block_value(t.blocks, r, i);
  t.bf16.assign(1, 0);  // unused: the product reads the blocks
  return t;
}

// TestWeights on the device; use_in points a product's args at them.
struct DeviceWeights {
  explicit DeviceWeights(const TestWeights& t)
      : bf16(t.bf16.size()),
        q(std::max<size_t>(t.blocks.q.size(), 1)),
        scales(std::max<size_t>(t.blocks.scales.size(), 1)),
        format(t.blocks.format) {
    bf16.upload(t.bf16);
    if (format != GemvWeights::kBf16) {
      q.upload(t.blocks.q);
      scales.upload(t.blocks.scales);
    }
  }
  void use_in(GemvArgs& a) const { use_gemv_blocks(a, format, q.get(), scales.get()); }

  DeviceBuffer<uint16_t> bf16;
  DeviceBuffer<uint8_t> q;
  DeviceBuffer<uint32_t> scales;
  GemvWeights format;
};

class TestCudaGemv : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void cleanupTestCase();
  void store_and_add_match_loops_data();
  void store_and_add_match_loops();
  void swiglu_matches_loops_data();
  void swiglu_matches_loops();
  void rope_kv_matches_loops_data();
  void rope_kv_matches_loops();
  void overlapped_chain_matches_serial_data();
  void overlapped_chain_matches_serial();
  void rows_do_not_depend_on_the_row_count_data();
  void rows_do_not_depend_on_the_row_count();
  void refuses_unsupported_shapes();

 private:
  cudaStream_t stream_ = nullptr;
};

void TestCudaGemv::initTestCase() {
  if (const QString why = no_cuda_device(); !why.isEmpty()) QSKIP(qPrintable(why));
  TOKENFAB_CUDA_CHECK(cudaStreamCreate(&stream_));
}

void TestCudaGemv::cleanupTestCase() {
  if (stream_) cudaStreamDestroy(stream_);
}

void TestCudaGemv::store_and_add_match_loops_data() {
  QTest::addColumn<QString>("layout");
  QTest::addColumn<int>("m");
  QTest::addColumn<qint64>("n");
  QTest::addColumn<qint64>("k");
  QTest::addColumn<bool>("norm");
  QTest::addColumn<bool>("add");
  // SmolLM2's o-projection and LM-head widths, an odd n (a pair with one row), Llama-8B's k,
  // and k = 4120 (load groups plus a tail).
  const QString bf16 = QStringLiteral("bf16");
  QTest::newRow("m1 576x576 add") << bf16 << 1 << qint64{576} << qint64{576} << false << true;
  QTest::newRow("m1 1001x576 norm") << bf16 << 1 << qint64{1001} << qint64{576} << true << false;
  QTest::newRow("m2 640x4096") << bf16 << 2 << qint64{640} << qint64{4096} << false << false;
  QTest::newRow("m3 576x1536 add") << bf16 << 3 << qint64{576} << qint64{1536} << false << true;
  QTest::newRow("m5 250x4120 norm add") << bf16 << 5 << qint64{250} << qint64{4120} << true << true;
  QTest::newRow("m8 4097x576 norm") << bf16 << 8 << qint64{4097} << qint64{576} << true << false;
  // Wide matrices (4,096 output pairs or more: two pairs per warp), even and odd.
  QTest::newRow("m2 8200x264 norm") << bf16 << 2 << qint64{8200} << qint64{264} << true << false;
  QTest::newRow("m1 8193x64 add") << bf16 << 1 << qint64{8193} << qint64{64} << false << true;
  // The file's blocks (k a multiple of 32): narrow and wide, and at 3 rows (two blocks in flight
  // per lane) k = 4096, two rounds of loads.
  for (const char* layout : {"q4_0", "q4_1", "q8_0"}) {
    const QString l = QString::fromLatin1(layout);
    QTest::newRow(qPrintable(l + " m1 576x576 add"))
        << l << 1 << qint64{576} << qint64{576} << false << true;
    QTest::newRow(qPrintable(l + " m1 1001x576 norm"))
        << l << 1 << qint64{1001} << qint64{576} << true << false;
    QTest::newRow(qPrintable(l + " m3 576x4096 add"))
        << l << 3 << qint64{576} << qint64{4096} << false << true;
    QTest::newRow(qPrintable(l + " m8 8193x64 norm"))
        << l << 8 << qint64{8193} << qint64{64} << true << false;
    // Wide block matrices at one and two rows, as the LM head of a decode step or a short chain.
    QTest::newRow(qPrintable(l + " m1 8200x576 norm"))
        << l << 1 << qint64{8200} << qint64{576} << true << false;
    QTest::newRow(qPrintable(l + " m2 8193x576 add"))
        << l << 2 << qint64{8193} << qint64{576} << false << true;
  }
}

void TestCudaGemv::store_and_add_match_loops() {
  QFETCH(QString, layout);
  QFETCH(int, m);
  QFETCH(qint64, n);
  QFETCH(qint64, k);
  QFETCH(bool, norm);
  QFETCH(bool, add);
  std::mt19937 rng(static_cast<uint32_t>(m * 31 + n * 7 + k + norm * 3 + add + layout.size()));
  const std::vector<float> x = random_floats(rng, static_cast<size_t>(m * k), -2.0f, 2.0f);
  const std::vector<float> g = random_floats(rng, static_cast<size_t>(k), 0.25f, 2.0f);
  const std::vector<float> out0 = random_floats(rng, static_cast<size_t>(m * n), -4.0f, 4.0f);
  const TestWeights w = random_test_weights(rng, layout, n, k);
  const Reference ref = reference(x, m, k, norm ? &g : nullptr, w.values, n);

  DeviceBuffer<float> dx(x.size()), dg(g.size()), dout(out0.size());
  const DeviceWeights dw(w);
  dx.upload(x);
  dg.upload(g);
  dout.upload(out0);
  GemvArgs a = gemv_product(dx.get(), k, m, dw.bf16.get(), n, k,
                            add ? GemvEpilogue::kAdd : GemvEpilogue::kStore, dout.get(), n);
  dw.use_in(a);
  a.norm = norm ? dg.get() : nullptr;
  a.eps = kEps;
  launch_gemv(a, stream_);
  TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const std::vector<float> got = dout.download();
  for (int r = 0; r < m; ++r)
    for (int64_t j = 0; j < n; ++j) {
      const int64_t i = r * n + j;
      const double want = ref.y[i] + (add ? double{out0[i]} : 0.0);
      const double allowed = bound(ref, i) + (add ? kValueRel * std::fabs(double{out0[i]}) : 0.0);
      QVERIFY2(std::fabs(got[i] - want) <= allowed,
               message(add ? "add" : "store", r, j, got[i], want, allowed).constData());
    }
}

void TestCudaGemv::swiglu_matches_loops_data() {
  QTest::addColumn<QString>("layout");
  QTest::addColumn<int>("m");
  QTest::addColumn<qint64>("n_ff");
  QTest::addColumn<qint64>("k");
  QTest::newRow("m1 SmolLM2 1536x576") << "bf16" << 1 << qint64{1536} << qint64{576};
  QTest::newRow("m4 300x1024") << "bf16" << 4 << qint64{300} << qint64{1024};
  QTest::newRow("m7 77x264") << "bf16" << 7 << qint64{77} << qint64{264};
  QTest::newRow("q4_1 m1 SmolLM2 1536x576") << "q4_1" << 1 << qint64{1536} << qint64{576};
  QTest::newRow("q4_0 m4 300x1024") << "q4_0" << 4 << qint64{300} << qint64{1024};
  QTest::newRow("q8_0 m7 77x576") << "q8_0" << 7 << qint64{77} << qint64{576};
}

void TestCudaGemv::swiglu_matches_loops() {
  QFETCH(QString, layout);
  QFETCH(int, m);
  QFETCH(qint64, n_ff);
  QFETCH(qint64, k);
  const int64_t n = 2 * n_ff;  // [gate | up]
  std::mt19937 rng(static_cast<uint32_t>(m * 131 + n_ff + k + layout.size()));
  const std::vector<float> x = random_floats(rng, static_cast<size_t>(m * k), -2.0f, 2.0f);
  const std::vector<float> g = random_floats(rng, static_cast<size_t>(k), 0.25f, 2.0f);
  const TestWeights w = random_test_weights(rng, layout, n, k);
  const Reference ref = reference(x, m, k, &g, w.values, n);

  DeviceBuffer<float> dx(x.size()), dg(g.size()), dout(static_cast<size_t>(m * n_ff));
  const DeviceWeights dw(w);
  dx.upload(x);
  dg.upload(g);
  GemvArgs a =
      gemv_product(dx.get(), k, m, dw.bf16.get(), n, k, GemvEpilogue::kSwiGlu, dout.get(), n_ff);
  dw.use_in(a);
  a.norm = dg.get();
  a.eps = kEps;
  launch_gemv(a, stream_);
  TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const std::vector<float> got = dout.download();
  for (int r = 0; r < m; ++r)
    for (int64_t j = 0; j < n_ff; ++j) {
      const double gate = ref.y[r * n + j], up = ref.y[r * n + n_ff + j];
      const double silu = gate / (1.0 + std::exp(-gate));
      const double want = silu * up;
      // |d silu / d gate| ≤ 1.1: the gate's error enters times 1.1·|up|, the up's times |silu|.
      const double allowed = 1.1 * std::fabs(up) * bound(ref, r * n + j) +
                             std::fabs(silu) * bound(ref, r * n + n_ff + j) +
                             4 * kValueRel * std::fabs(want);
      const float v = got[static_cast<size_t>(r * n_ff + j)];
      QVERIFY2(std::fabs(v - want) <= allowed,
               message("swiglu", r, j, v, want, allowed).constData());
    }
}

void TestCudaGemv::rope_kv_matches_loops_data() {
  QTest::addColumn<QString>("layout");
  QTest::addColumn<int>("m");
  QTest::addColumn<int>("n_head");
  QTest::addColumn<int>("n_kv_head");
  QTest::addColumn<int>("head_dim");
  QTest::addColumn<int>("rot_dim");
  QTest::addColumn<int>("block_size");
  // SmolLM2-135M (9/3 × 64 on k = 576), a partial rotation, and Llama-8B-like heads (32/8 × 128,
  // k = 512 to keep the loops short).
  // With the file's blocks too: the embedded model's QKV matrix is Q4_1.
  const QString bf16 = QStringLiteral("bf16");
  QTest::newRow("m1 9/3x64") << bf16 << 1 << 9 << 3 << 64 << 64 << 16;
  QTest::newRow("m3 4/2x32 rot16") << bf16 << 3 << 4 << 2 << 32 << 16 << 4;
  QTest::newRow("m8 32/8x128") << bf16 << 8 << 32 << 8 << 128 << 128 << 16;
  QTest::newRow("q4_1 m1 9/3x64") << QStringLiteral("q4_1") << 1 << 9 << 3 << 64 << 64 << 16;
  QTest::newRow("q4_0 m5 9/3x64") << QStringLiteral("q4_0") << 5 << 9 << 3 << 64 << 64 << 16;
  QTest::newRow("q8_0 m3 4/2x32 rot16") << QStringLiteral("q8_0") << 3 << 4 << 2 << 32 << 16 << 4;
}

void TestCudaGemv::rope_kv_matches_loops() {
  QFETCH(QString, layout);
  QFETCH(int, m);
  QFETCH(int, n_head);
  QFETCH(int, n_kv_head);
  QFETCH(int, head_dim);
  QFETCH(int, rot_dim);
  QFETCH(int, block_size);
  const int q_dim = n_head * head_dim, kv_dim = n_kv_head * head_dim;
  const int64_t n = q_dim + 2 * kv_dim;
  const int64_t k = n_head == 9 ? 576 : 512;
  const float rope_base = 10000.0f;
  std::mt19937 rng(static_cast<uint32_t>(m * 17 + n_head * 5 + head_dim + rot_dim + layout.size()));
  const std::vector<float> x = random_floats(rng, static_cast<size_t>(m * k), -2.0f, 2.0f);
  const std::vector<float> g = random_floats(rng, static_cast<size_t>(k), 0.25f, 2.0f);
  const TestWeights w = random_test_weights(rng, layout, n, k);
  const Reference ref = reference(x, m, k, &g, w.values, n);
  // Positions far apart (large angles too) and distinct slots in a pool of 4 blocks per row.
  const int32_t n_blocks = 4 * m;
  std::vector<int32_t> positions(static_cast<size_t>(m)), kv_slots(static_cast<size_t>(m));
  std::vector<int32_t> all_slots(static_cast<size_t>(n_blocks * block_size));
  std::iota(all_slots.begin(), all_slots.end(), 0);
  std::shuffle(all_slots.begin(), all_slots.end(), rng);
  for (int r = 0; r < m; ++r) {
    positions[static_cast<size_t>(r)] = std::uniform_int_distribution<int32_t>(0, 30000)(rng);
    kv_slots[static_cast<size_t>(r)] = all_slots[static_cast<size_t>(r)];
  }
  const size_t pool_halves = static_cast<size_t>(n_blocks) * n_kv_head * block_size * head_dim;
  const uint16_t kUntouched = 0x7e00;  // a NaN: every entry the call must not write keeps it
  std::vector<uint16_t> pool0(pool_halves, kUntouched);

  DeviceBuffer<float> dx(x.size()), dg(g.size()), dout(static_cast<size_t>(m * n));
  DeviceBuffer<uint16_t> dk(pool_halves), dv(pool_halves);
  const DeviceWeights dw(w);
  // Each row's angles as the device computes them for this epilogue: the CPU's rope_table.
  std::vector<float> angles(static_cast<size_t>(m * rot_dim));
  for (int r = 0; r < m; ++r) {
    float* row = angles.data() + static_cast<size_t>(r * rot_dim);
    rope_table(positions[static_cast<size_t>(r)], rot_dim, rope_base, row, row + rot_dim / 2);
  }
  DeviceBuffer<float> dangles(std::max<size_t>(angles.size(), 1));
  DeviceBuffer<int32_t> dslots(kv_slots.size());
  dx.upload(x);
  dg.upload(g);
  dk.upload(pool0);
  dv.upload(pool0);
  if (!angles.empty()) dangles.upload(angles);
  dslots.upload(kv_slots);
  GemvArgs a =
      gemv_product(dx.get(), k, m, dw.bf16.get(), n, k, GemvEpilogue::kRopeKv, dout.get(), n);
  dw.use_in(a);
  a.norm = dg.get();
  a.eps = kEps;
  a.rope = dangles.get();
  a.kv_slots = dslots.get();
  a.q_dim = q_dim;
  a.kv_dim = kv_dim;
  a.head_dim = head_dim;
  a.rot_dim = rot_dim;
  a.n_kv_head = n_kv_head;
  a.block_size = block_size;
  a.k_pool = dk.get();
  a.v_pool = dv.get();
  launch_gemv(a, stream_);
  TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const std::vector<float> got = dout.download();
  const std::vector<uint16_t> k_pool = dk.download(), v_pool = dv.download();

  size_t written = 0;
  for (int r = 0; r < m; ++r) {
    for (int64_t j = 0; j < n; j += 2) {
      const int64_t i0 = r * n + j, i1 = i0 + 1;
      double want0 = ref.y[i0], want1 = ref.y[i1];
      const double err0 = bound(ref, i0), err1 = bound(ref, i1);
      const bool is_v = j >= q_dim + kv_dim;
      const int64_t section = j < q_dim ? 0 : (is_v ? q_dim + kv_dim : q_dim);
      const int d = static_cast<int>((j - section) % head_dim);
      double allowed0 = err0, allowed1 = err1;
      if (!is_v && d < rot_dim) {  // the rotation, as the CPU's rope (theta in double)
        const double theta = positions[static_cast<size_t>(r)] *
                             std::pow(double{rope_base}, -2.0 * (d / 2) / rot_dim);
        const double c = std::cos(theta), s = std::sin(theta);
        const double a0 = want0, b0 = want1;
        want0 = a0 * c - b0 * s;
        want1 = a0 * s + b0 * c;
        allowed0 = allowed1 = err0 + err1 + kValueRel * (std::fabs(a0) + std::fabs(b0));
      }
      QVERIFY2(std::fabs(got[i0] - want0) <= allowed0,
               message("rope/kv out", r, j, got[i0], want0, allowed0).constData());
      QVERIFY2(std::fabs(got[i1] - want1) <= allowed1,
               message("rope/kv out", r, j + 1, got[i1], want1, allowed1).constData());
      if (j < q_dim) continue;
      // k and v: into the pool at the row's slot, as fp16.
      const int64_t c = j - section;
      const int64_t slot = kv_slots[static_cast<size_t>(r)];
      const int64_t dst =
          ((slot / block_size * n_kv_head + c / head_dim) * block_size + slot % block_size) *
              head_dim +
          d;
      const std::vector<uint16_t>& pool = is_v ? v_pool : k_pool;
      for (int e = 0; e < 2; ++e) {
        const double want = e == 0 ? want0 : want1;
        const double allowed =
            (e == 0 ? allowed0 : allowed1) + std::ldexp(std::fabs(want), -11) + 1e-7;
        const float v = fp16_to_fp32(pool[static_cast<size_t>(dst + e)]);
        QVERIFY2(std::fabs(v - want) <= allowed,
                 message(is_v ? "v pool" : "k pool", r, j + e, v, want, allowed).constData());
      }
      written += 2;
    }
  }
  size_t untouched = 0;
  for (size_t i = 0; i < pool_halves; ++i)
    untouched += (k_pool[i] == kUntouched) + (v_pool[i] == kUntouched);
  QCOMPARE(untouched, 2 * pool_halves - written);
}

void TestCudaGemv::overlapped_chain_matches_serial_data() {
  QTest::addColumn<int>("m");
  QTest::newRow("m1") << 1;
  QTest::newRow("m3") << 3;
  QTest::newRow("m8") << 8;
}

// Eight feed-forward blocks of the embedded model's shape back to back on one stream, each
// product reading what the one before it wrote (h = SwiGLU(W1·norm(x)), then x += W2·h), launched
// with `overlap` and without: the same kernels in the same order, so the same bits, and so no
// product read its input before the kernel writing it had finished.
void TestCudaGemv::overlapped_chain_matches_serial() {
  QFETCH(int, m);
  int device = 0;
  TOKENFAB_CUDA_CHECK(cudaGetDevice(&device));
  if (!overlap_launches_supported(device))
    QSKIP("overlapping launches need compute capability 9.0 or later and kernels built for it");
  const int64_t k = 576, n_ff = 1536;
  constexpr int kBlocks = 8;
  std::mt19937 rng(static_cast<uint32_t>(31 + m));
  const std::vector<float> x0 = random_floats(rng, static_cast<size_t>(m * k), -2.0f, 2.0f);
  const std::vector<float> g = random_floats(rng, static_cast<size_t>(k), 0.25f, 2.0f);
  std::vector<uint16_t> w1_bits, w2_bits;
  std::vector<float> w1, w2;
  random_weights(rng, 2 * n_ff, k, w1_bits, w1);
  random_weights(rng, k, n_ff, w2_bits, w2);
  DeviceBuffer<float> dx(x0.size()), dg(g.size()), dh(static_cast<size_t>(m * n_ff));
  DeviceBuffer<uint16_t> dw1(w1_bits.size()), dw2(w2_bits.size());
  dg.upload(g);
  dw1.upload(w1_bits);
  dw2.upload(w2_bits);
  auto run = [&](bool overlap) {
    dx.upload(x0);
    for (int b = 0; b < kBlocks; ++b) {
      GemvArgs up = gemv_product(dx.get(), k, m, dw1.get(), 2 * n_ff, k, GemvEpilogue::kSwiGlu,
                                 dh.get(), n_ff);
      up.norm = dg.get();
      up.eps = kEps;
      up.overlap = overlap;
      launch_gemv(up, stream_);
      GemvArgs down =
          gemv_product(dh.get(), n_ff, m, dw2.get(), k, n_ff, GemvEpilogue::kAdd, dx.get(), k);
      down.overlap = overlap;
      launch_gemv(down, stream_);
    }
    TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return dx.download();
  };
  const std::vector<float> serial = run(false);
  const std::vector<float> overlapped = run(true);
  QVERIFY(std::all_of(serial.begin(), serial.end(), [](float v) { return std::isfinite(v); }));
  QVERIFY(serial != x0);
  QVERIFY(overlapped == serial);
}

void TestCudaGemv::rows_do_not_depend_on_the_row_count_data() {
  QTest::addColumn<qint64>("n");
  QTest::addColumn<qint64>("k");
  QTest::addColumn<bool>("split_k");
  // Narrow with long rows (split over four warps, and not), narrow with short rows, wide.
  QTest::newRow("576x1536 split") << qint64{576} << qint64{1536} << true;
  QTest::newRow("576x1536 whole rows") << qint64{576} << qint64{1536} << false;
  QTest::newRow("960x576") << qint64{960} << qint64{576} << true;
  QTest::newRow("8200x1024") << qint64{8200} << qint64{1024} << true;
}

// A row's outputs are the same bits whether the call has 1 x row or 2 … 8: what keeps greedy
// speculation lossless on the GPU (a verified chain's rows against one-token steps), with the
// fused norm and a residual add.
void TestCudaGemv::rows_do_not_depend_on_the_row_count() {
  QFETCH(qint64, n);
  QFETCH(qint64, k);
  QFETCH(bool, split_k);
  QCOMPARE(gemv_split_k(GemvWeights::kBf16, (n + 1) / 2, k), n == 576 && k == 1536);
  std::mt19937 rng(static_cast<uint32_t>(n + k));
  const std::vector<float> x =
      random_floats(rng, static_cast<size_t>(kGemvMaxRows * k), -2.0f, 2.0f);
  const std::vector<float> g = random_floats(rng, static_cast<size_t>(k), 0.25f, 2.0f);
  const std::vector<float> base =
      random_floats(rng, static_cast<size_t>(kGemvMaxRows * n), -1.0f, 1.0f);
  std::vector<uint16_t> w_bits;
  std::vector<float> w;
  random_weights(rng, n, k, w_bits, w);
  DeviceBuffer<float> dx(x.size()), dg(g.size()), dout(base.size());
  DeviceBuffer<uint16_t> dw(w_bits.size());
  dx.upload(x);
  dg.upload(g);
  dw.upload(w_bits);
  // Rows [first, first + m) of x into the same rows of out.
  auto run = [&](int first, int m) {
    dout.upload(base);
    GemvArgs a = gemv_product(dx.get() + first * k, k, m, dw.get(), n, k, GemvEpilogue::kAdd,
                              dout.get() + first * n, n);
    a.norm = dg.get();
    a.eps = kEps;
    a.split_k = split_k;
    launch_gemv(a, stream_);
    TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return dout.download();
  };
  for (int m = 2; m <= kGemvMaxRows; ++m) {
    const std::vector<float> together = run(0, m);
    for (int r = 0; r < m; ++r) {
      const std::vector<float> alone = run(r, 1);
      QVERIFY2(
          std::equal(alone.begin() + r * n, alone.begin() + (r + 1) * n, together.begin() + r * n),
          qPrintable(QStringLiteral("row %1 of %2 differs from the row alone").arg(r).arg(m)));
    }
  }
}

void TestCudaGemv::refuses_unsupported_shapes() {
  DeviceBuffer<float> dx(64), dout(64);
  DeviceBuffer<uint16_t> dw(64);
  const GemvArgs a =
      gemv_product(dx.get(), 16, 1, dw.get(), 2, 16, GemvEpilogue::kStore, dout.get(), 2);
  QVERIFY(gemv_supports(a.x, a.x_stride, a.m, a.w, a.k));
  launch_gemv(a, stream_);  // the supported call itself
  TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  QVERIFY(!gemv_supports(a.x, 12, 1, a.w, 12));                 // k not a multiple of 8
  QVERIFY(!gemv_supports(a.x, 16, kGemvMaxRows + 1, a.w, 16));  // too many rows
  QVERIFY(!gemv_supports(a.x + 1, 16, 1, a.w, 16));             // x not 16-byte aligned
  QVERIFY(!gemv_supports(a.x, 16, 1, a.w + 1, 16));             // w not 16-byte aligned
  GemvArgs bad = a;
  bad.k = 12;
  bad.x_stride = 12;
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument, launch_gemv(bad, stream_));
  bad = a;
  bad.epilogue = GemvEpilogue::kSwiGlu;
  bad.n = 3;  // odd: no [gate | up] halves
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument, launch_gemv(bad, stream_));
  bad = a;
  bad.epilogue = GemvEpilogue::kRopeKv;  // no heads, positions, kv_slots or pools
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument, launch_gemv(bad, stream_));
  bad = a;
  bad.out_stride = 1;
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument, launch_gemv(bad, stream_));
}

}  // namespace

QTEST_APPLESS_MAIN(TestCudaGemv)
#include "test_cuda_gemv.moc"
