// Each CUDA op against its CPU reference op on random inputs of model-like shapes (odd row
// counts; n = 32, 576, 1536, 4096 — SmolLM2 uses 576 and 1536 — and multiples of 256 for the
// K-quants and IQ4_XS). Skips when no CUDA device exists.
// Paged attention has its own file (test_cuda_paged_attention.cpp).

#include <QtTest/QtTest>

#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/quant_types.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cuda/add_inplace.cuh"
#include "kernels/cuda/argmax.cuh"
#include "kernels/cuda/candidates.cuh"
#include "kernels/cuda/cublas_gemm.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/dequantize.cuh"
#include "kernels/cuda/draft_residual.cuh"
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/f32_to_bf16.cuh"
#include "kernels/cuda/gather_rows.cuh"
#include "kernels/cuda/glu_rows.cuh"
#include "kernels/cuda/kv_blocks_pack.cuh"
#include "kernels/cuda/kv_store.cuh"
#include "kernels/cuda/prepare_qk.cuh"
#include "kernels/cuda/rms_norm.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/row_logsumexp.cuh"
#include "kernels/cuda/silu_mul.cuh"
#include "kernels/cuda/softcap.cuh"
#include "tests/gpu/cuda_test_support.h"

namespace {

using namespace tokenfab::kernels;
using namespace tokenfab::kernels::testing;

// Tolerances. rms_norm: the GPU sums squares in f32 in a different order than the CPU's f64 sum,
// which moves the row scale by a few ulp — relative 1e-5 per element. silu_mul: CUDA's expf is
// within 2 ulp of the true exp and everything else is IEEE-rounded — relative 1e-5 per element.
// dequantize: the same IEEE operations in the same order — bit-exact (NaN payloads aside).
// Draft residual blocks: see their test. embedding, add_inplace, gather, argmax, sampling
// candidates, KV pack/unpack, f32 → bf16, KV store: the same IEEE operations (or plain copies and
// comparisons) — bit-exact. rope: both sides compute the angle's cos/sin in double and round to
// f32, but CUDA's double pow/sin/cos are within 2 ulp of the true value where glibc's are within 1,
// so a table entry can land one f32 ulp (≤ 2^-24 for |c| < 1) away at a rounding boundary; the
// rotation's two products and sum are then rounded as on the CPU, which puts the output within a
// few ulp of |a| + |b| — allowed: 1e-6·(|a| + |b|). GEMM: products of bf16 values are exact in f32,
// but cuBLAS sums the k products in f32 in its own order (tensor-core partial sums) where the CPU
// loop sums in double; f32 summation of k terms is off by at most k·2^-24·Σ|a·b|, so each element
// is allowed 2·max(k, 16)·2^-24·Σ_i |a_i·b_i|.
constexpr float kRmsNormRel = 1e-5f;
constexpr float kSiluMulRel = 1e-5f;
constexpr float kRopeRel = 1e-6f;
constexpr double kGemmUlps = 2.0;
constexpr float kEps = 1e-5f;

// The byte offsets of a block's fp16 scales (d, and m or dmin where the format has one; −1 where
// it has not), as kernels::describe_bad_block reads them.
struct ScaleOffsets {
  int d = 0;
  int second = -1;
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
      return {0, -1};  // Q4_0, Q8_0, Q5_0, IQ4_NL, IQ4_XS: d first
  }
}

// A random finite fp16: random bits, drawn again while they are inf or NaN; one in eight is ±0,
// so that the order of the decoders' last subtraction shows in the sign of a zero.
uint16_t random_finite_half(std::mt19937& rng) {
  std::uniform_int_distribution<int> bits(0, 0xffff), eighth(0, 7);
  if (eighth(rng) == 0) return static_cast<uint16_t>(bits(rng) & 0x8000);
  for (;;) {
    const auto h = static_cast<uint16_t>(bits(rng));
    if ((h & 0x7c00) != 0x7c00) return h;
  }
}

// `rows` rows of n elements of a block type as random valid blocks: random bytes (every level,
// sub-block scale and min) with finite fp16 scales over the whole fp16 range (subnormals and
// signed zeros included).
std::vector<uint8_t> random_blocks(std::mt19937& rng, WeightType type, int64_t rows, int64_t n) {
  const size_t stride = row_bytes(type, static_cast<uint64_t>(n));
  std::vector<uint8_t> src(stride * rows);
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : src) b = static_cast<uint8_t>(byte(rng));
  const ScaleOffsets at = scale_offsets(type);
  for (size_t block = 0; block < src.size(); block += block_bytes(type))
    for (const int offset : {at.d, at.second}) {
      if (offset < 0) continue;
      const uint16_t h = random_finite_half(rng);
      std::memcpy(src.data() + block + offset, &h, sizeof h);
    }
  return src;
}

// The types with the legacy (32-element) blocks that the GPU had first.
bool legacy_type(WeightType type) {
  return type == WeightType::F32 || type == WeightType::F16 || type == WeightType::BF16 ||
         type == WeightType::Q4_0 || type == WeightType::Q4_1 || type == WeightType::Q8_0;
}

// A random matrix (rows, n) of `type`. Q4_0, Q4_1, Q8_0: quantized rows of different magnitudes
// so the block scales span a wide range; 16-bit types: random bit patterns (subnormals,
// infinities and NaNs too); the others (Q5_0 … IQ4_XS): random_blocks.
std::vector<uint8_t> random_weight_rows(std::mt19937& rng, WeightType type, int64_t rows,
                                        int64_t n) {
  const size_t stride = row_bytes(type, static_cast<uint64_t>(n));
  std::vector<uint8_t> src(stride * rows);
  if (type == WeightType::F16 || type == WeightType::BF16) {
    std::uniform_int_distribution<int> bits(0, 0xffff);
    for (size_t i = 0; i + 1 < src.size(); i += 2) {
      const auto v = static_cast<uint16_t>(bits(rng));
      std::memcpy(src.data() + i, &v, sizeof v);
    }
    return src;
  }
  if (!legacy_type(type)) return random_blocks(rng, type, rows, n);
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = std::ldexp(1.0f, static_cast<int>(r % 13) - 6);
    const std::vector<float> x = random_floats(rng, n, -scale, scale);
    quantize_row(type, x.data(), src.data() + r * stride, n);
  }
  return src;
}

// Every weight type, in enum order.
std::vector<WeightType> all_weight_types() {
  std::vector<WeightType> types;
  for (int t = 0; t <= static_cast<int>(WeightType::IQ4_XS); ++t)
    types.push_back(static_cast<WeightType>(t));
  return types;
}

// Shapes (rows, n) every op runs on; odd row counts so no kernel can rely on pairs of rows.
void add_shape_rows() {
  QTest::addColumn<qint64>("rows");
  QTest::addColumn<qint64>("n");
  const qint64 shapes[][2] = {{1, 32},   {7, 32},   {3, 576}, {33, 576},
                              {5, 1536}, {1, 4096}, {9, 4096}};
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
  void embedding_matches_cpu_exactly_data();
  void embedding_matches_cpu_exactly();
  void rope_matches_cpu_data();
  void rope_matches_cpu();
  void add_inplace_matches_cpu_exactly_data() { add_shape_rows(); }
  void add_inplace_matches_cpu_exactly();
  void argmax_matches_cpu_data();
  void argmax_matches_cpu();
  void draft_residual_matches_cpu_data();
  void draft_residual_matches_cpu();
  void gather_rows_match_cpu_exactly();
  void row_logsumexp_matches_cpu();
  void filter_candidates_matches_cpu_exactly_data();
  void filter_candidates_matches_cpu_exactly();
  void kv_pack_unpack_round_trip_data();
  void kv_pack_unpack_round_trip();
  void gemm_bf16_matches_cpu_loop_data();
  void gemm_bf16_matches_cpu_loop();
  void gemm_accumulate_equals_gemm_then_add_data();
  void gemm_accumulate_equals_gemm_then_add();
  void f32_to_bf16_matches_cpu_exactly_data() { add_shape_rows(); }
  void f32_to_bf16_matches_cpu_exactly();
  void rope_kv_store_matches_cpu_exactly_data();
  void rope_kv_store_matches_cpu_exactly();
  void kv_store_after_rope_equals_the_rope_launch_store_data() {
    rope_kv_store_matches_cpu_exactly_data();
  }
  void kv_store_after_rope_equals_the_rope_launch_store();
  void bf16_outputs_equal_the_f32_ops_rounded_data() { add_shape_rows(); }
  void bf16_outputs_equal_the_f32_ops_rounded();
  void prepare_qk_matches_cpu_data();
  void prepare_qk_matches_cpu();
  void glu_rows_match_cpu_data();
  void glu_rows_match_cpu();
  void softcap_matches_cpu_data() { add_shape_rows(); }
  void softcap_matches_cpu();

 private:
  cudaStream_t stream_ = nullptr;
};

void TestCudaOps::initTestCase() {
  if (const QString why = no_cuda_device(); !why.isEmpty()) QSKIP(qPrintable(why));
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
  for (int64_t r = 0; r < rows; ++r)
    rms_norm(x.data() + r * n, w.data(), want.data() + r * n, n, kEps);

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
  // Each type on the shapes whose n is whole blocks of it (the K-quants and IQ4_XS: 256).
  const qint64 shapes[][2] = {{1, 32},   {7, 32},   {1, 256},  {7, 256}, {3, 576},
                              {33, 576}, {5, 1536}, {9, 4096}, {3, 2816}};
  for (WeightType type : all_weight_types())
    for (const auto& s : shapes)
      if (s[1] % block_elements(type) == 0)
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
  const std::vector<uint8_t> src =
      random_weight_rows(rng, wtype, rows, n);  // (rows) of stride bytes
  std::vector<float> want(rows * n);            // (rows, n)
  for (int64_t r = 0; r < rows; ++r) {
    QCOMPARE(describe_bad_block(wtype, src.data() + r * stride, n), std::string());
    dequantize_row(wtype, src.data() + r * stride, want.data() + r * n, n);
  }

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
  DeviceBuffer<float> dy(256);
  DeviceBuffer<int32_t> tokens(1);
  const int past_last = static_cast<int>(WeightType::IQ4_XS) + 1;
  for (const int type : {99, past_last, -1}) {
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument,
                             launch_dequantize_rows(type, dy.get(), dy.get(), 1, 32, stream_));
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument, launch_embedding(type, dy.get(), tokens.get(),
                                                                     dy.get(), 1, 32, stream_));
  }
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument,
                           launch_dequantize_rows(static_cast<int>(WeightType::Q4_0), dy.get(),
                                                  dy.get(), 1, 48, stream_));
  // Rows of the super-block types are whole super-blocks of 256.
  for (const WeightType type : all_weight_types()) {
    if (block_elements(type) != kQK_K) continue;
    QVERIFY_THROWS_EXCEPTION(
        std::invalid_argument,
        launch_dequantize_rows(static_cast<int>(type), dy.get(), dy.get(), 1, 32, stream_));
    QVERIFY_THROWS_EXCEPTION(std::invalid_argument,
                             launch_embedding(static_cast<int>(type), dy.get(), tokens.get(),
                                              dy.get(), 1, 128, stream_));
  }
  TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void TestCudaOps::embedding_matches_cpu_exactly_data() {
  QTest::addColumn<int>("type");
  QTest::addColumn<qint64>("n_vocab");
  QTest::addColumn<qint64>("n_embd");
  QTest::addColumn<qint64>("n_tokens");
  // Each type on the shapes whose n_embd is whole blocks of it (the K-quants and IQ4_XS: 256).
  const qint64 shapes[][3] = {{1, 32, 1},     {37, 64, 5},   {1, 256, 1},   {37, 256, 5},
                              {101, 576, 33}, {61, 768, 17}, {53, 1536, 7}, {7, 4096, 300}};
  for (WeightType type : all_weight_types())
    for (const auto& s : shapes)
      if (s[1] % block_elements(type) == 0)
        QTest::addRow("%s vocab %lld embd %lld tokens %lld", weight_type_name(type),
                      static_cast<long long>(s[0]), static_cast<long long>(s[1]),
                      static_cast<long long>(s[2]))
            << static_cast<int>(type) << s[0] << s[1] << s[2];
}

void TestCudaOps::embedding_matches_cpu_exactly() {
  QFETCH(int, type);
  QFETCH(qint64, n_vocab);
  QFETCH(qint64, n_embd);
  QFETCH(qint64, n_tokens);
  const auto wtype = static_cast<WeightType>(type);
  std::mt19937 rng(static_cast<uint32_t>(type * 7 + n_vocab * 131 + n_embd + n_tokens));
  const size_t stride = row_bytes(wtype, static_cast<uint64_t>(n_embd));
  const std::vector<uint8_t> table = random_weight_rows(rng, wtype, n_vocab, n_embd);
  // tokens: (n_tokens), random ids with repeats, the first and last ids always among them.
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(n_vocab - 1));
  std::vector<int32_t> tokens(n_tokens);
  for (int32_t& t : tokens) t = id(rng);
  tokens.front() = static_cast<int32_t>(n_vocab - 1);
  tokens.back() = 0;
  std::vector<float> want(n_tokens * n_embd);  // (n_tokens, n_embd)
  for (int64_t t = 0; t < n_tokens; ++t)
    dequantize_row(wtype, table.data() + tokens[t] * stride, want.data() + t * n_embd, n_embd);

  DeviceBuffer<uint8_t> dtable(table.size());
  DeviceBuffer<int32_t> dtokens(tokens.size());
  DeviceBuffer<float> dy(want.size());
  dtable.upload(table);
  dtokens.upload(tokens);
  launch_embedding(type, dtable.get(), dtokens.get(), dy.get(), n_tokens, n_embd, stream_);
  TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const std::vector<float> got = dy.download();
  const int64_t bad = first_bit_mismatch(got, want);
  QVERIFY2(bad < 0, mismatch_message("embedding", bad, n_embd, got, want).constData());

  // With a family's embedding scale (Gemma's √n_embd): each decoded value times the scale, the
  // f32 product LlamaModel::embed forms, bit for bit.
  const float scale = std::sqrt(static_cast<float>(n_embd));
  std::vector<float> scaled = want;
  for (float& v : scaled) v *= scale;
  launch_embedding(type, dtable.get(), dtokens.get(), dy.get(), n_tokens, n_embd, stream_, scale);
  TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const std::vector<float> got_scaled = dy.download();
  const int64_t bad_scaled = first_bit_mismatch(got_scaled, scaled);
  QVERIFY2(
      bad_scaled < 0,
      mismatch_message("scaled embedding", bad_scaled, n_embd, got_scaled, scaled).constData());
}

void TestCudaOps::rope_matches_cpu_data() {
  QTest::addColumn<qint64>("rows");
  QTest::addColumn<int>("n_heads");
  QTest::addColumn<int>("head_dim");
  QTest::addColumn<int>("rot_dim");
  QTest::addColumn<float>("base");
  // SmolLM2-135M's q (9 × 64) and k (3 × 64), Llama-8B's (32 × 128), a partial rotation, and
  // an odd head count.
  QTest::newRow("1 row 9x64") << qint64{1} << 9 << 64 << 64 << 100000.0f;
  QTest::newRow("7 rows 3x64") << qint64{7} << 3 << 64 << 64 << 100000.0f;
  QTest::newRow("5 rows 32x128") << qint64{5} << 32 << 128 << 128 << 500000.0f;
  QTest::newRow("3 rows 2x96 rot 64") << qint64{3} << 2 << 96 << 64 << 10000.0f;
  QTest::newRow("33 rows 15x64") << qint64{33} << 15 << 64 << 64 << 10000.0f;
}

void TestCudaOps::rope_matches_cpu() {
  QFETCH(qint64, rows);
  QFETCH(int, n_heads);
  QFETCH(int, head_dim);
  QFETCH(int, rot_dim);
  QFETCH(float, base);
  std::mt19937 rng(static_cast<uint32_t>(rows * 17 + n_heads * 3 + head_dim + rot_dim));
  // x: rows of (n_heads, head_dim) with 5 floats of padding after each, which must stay as they
  // are.
  const int64_t row_floats = int64_t{n_heads} * head_dim;
  const int64_t row_stride = row_floats + 5;
  const std::vector<float> x = random_floats(rng, rows * row_stride, -4.0f, 4.0f);
  // positions: (rows), 0 and long-context ones among them.
  std::uniform_int_distribution<int32_t> pos(0, 40000);
  std::vector<int32_t> positions(rows);
  for (int32_t& p : positions) p = pos(rng);
  positions.front() = 0;
  std::vector<float> want = x;
  std::vector<float> cos_t(rot_dim / 2), sin_t(rot_dim / 2);
  for (int64_t r = 0; r < rows; ++r) {
    rope_table(positions[r], rot_dim, base, cos_t.data(), sin_t.data());
    rope(want.data() + r * row_stride, n_heads, head_dim, rot_dim, cos_t.data(), sin_t.data());
  }

  DeviceBuffer<float> dx(x.size());
  DeviceBuffer<int32_t> dpos(positions.size());
  dx.upload(x);
  dpos.upload(positions);
  launch_rope(dx.get(), dpos.get(), rows, row_stride, n_heads, head_dim, rot_dim, base, stream_);
  TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const std::vector<float> got = dx.download();
  for (int64_t i = 0; i < static_cast<int64_t>(want.size()); ++i) {
    const int64_t col = i % row_stride;
    // Padding and the unrotated tail of each head are left as they are, bit for bit; a rotated
    // element is compared against the size of the pair (a, b) it came from.
    const bool rotated = col < row_floats && col % head_dim < rot_dim;
    const int64_t pair = i - col % 2;
    const float bound = rotated ? kRopeRel * (std::fabs(x[pair]) + std::fabs(x[pair + 1])) : 0.0f;
    QVERIFY2(std::fabs(got[i] - want[i]) <= bound,
             mismatch_message("rope", i, row_stride, got, want).constData());
  }
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument,
                           launch_rope(dx.get(), dpos.get(), rows, row_stride, n_heads, head_dim,
                                       head_dim + 2, base, stream_));
}

void TestCudaOps::add_inplace_matches_cpu_exactly() {
  QFETCH(qint64, rows);
  QFETCH(qint64, n);
  std::mt19937 rng(static_cast<uint32_t>(rows * 65537 + n));
  const std::vector<float> y = random_floats(rng, rows * n, -100.0f, 100.0f);  // (rows, n)
  const std::vector<float> x = random_floats(rng, rows * n, -1.0f, 1.0f);      // (rows, n)
  std::vector<float> want = y;
  add_inplace(want.data(), x.data(), rows * n);

  DeviceBuffer<float> dy(y.size()), dx(x.size());
  dy.upload(y);
  dx.upload(x);
  launch_add_inplace(dy.get(), dx.get(), rows * n, stream_);
  TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const std::vector<float> got = dy.download();
  const int64_t bad = first_bit_mismatch(got, want);
  QVERIFY2(bad < 0, mismatch_message("add_inplace", bad, n, got, want).constData());
}

void TestCudaOps::argmax_matches_cpu_data() {
  QTest::addColumn<qint64>("rows");
  QTest::addColumn<qint64>("n");
  // SmolLM2's vocabulary (49152), Llama-3's (128256), an odd one, and tiny rows.
  const qint64 shapes[][2] = {{1, 1}, {7, 5}, {3, 49152}, {9, 49157}, {2, 128256}};
  for (const auto& s : shapes)
    QTest::addRow("%lldx%lld", static_cast<long long>(s[0]), static_cast<long long>(s[1]))
        << s[0] << s[1];
}

void TestCudaOps::argmax_matches_cpu() {
  QFETCH(qint64, rows);
  QFETCH(qint64, n);
  std::mt19937 rng(static_cast<uint32_t>(rows * 31 + n));
  // x: (rows, n) logits. Row r gets a case by r % 4: 0 plain random; 1 the maximum repeated at
  // several random places (the lowest must win); 2 NaNs scattered, one at the front; 3 every value
  // NaN except a −inf at the end (all NaN when n == 1: the answer is then 0).
  std::vector<float> x = random_floats(rng, rows * n, -30.0f, 30.0f);
  std::uniform_int_distribution<int64_t> col(0, n - 1);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x.data() + r * n;
    switch (r % 4) {
      case 1:
        for (int i = 0; i < 4; ++i) row[col(rng)] = 31.0f;
        break;
      case 2:
        row[0] = std::nanf("");
        for (int i = 0; i < 8; ++i) row[col(rng)] = std::nanf("");
        break;
      case 3:
        for (int64_t i = 0; i < n; ++i) row[i] = std::nanf("");
        if (n > 1) row[n - 1] = -std::numeric_limits<float>::infinity();
        break;
      default:
        break;
    }
  }
  std::vector<int32_t> want(rows);
  for (int64_t r = 0; r < rows; ++r)
    want[r] = static_cast<int32_t>(argmax_scalar(x.data() + r * n, n));

  DeviceBuffer<float> dx(x.size());
  DeviceBuffer<int32_t> dout(rows);
  dx.upload(x);
  launch_argmax_rows(dx.get(), dout.get(), rows, n, stream_);
  TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const std::vector<int32_t> got = dout.download();
  for (int64_t r = 0; r < rows; ++r)
    QVERIFY2(got[r] == want[r],
             qPrintable(
                 QStringLiteral("argmax row %1: gpu %2, cpu %3").arg(r).arg(got[r]).arg(want[r])));
}

void TestCudaOps::draft_residual_matches_cpu_data() {
  QTest::addColumn<bool>("mtp");
  QTest::newRow("medusa levels: W h") << false;
  QTest::newRow("mtp steps: W [h; e]") << true;
}

// Three heads' blocks over four hidden states in one launch, each output row with its own W, b
// and source row (and, for mtp, its own embedding row e), against a double loop. Tolerance: the
// dot product is summed in f32 in another order (error ≤ d_in·2^-24·Σ|w·x|), SiLU's slope is
// below 1.1 and CUDA's expf is within 2 ulp: each element is allowed
// 1e-5·(1 + |h_o| + Σ_i |w_oi·x_i|).
void TestCudaOps::draft_residual_matches_cpu() {
  QFETCH(bool, mtp);
  const int64_t d = 576;  // SmolLM2's n_embd
  const int64_t d_in = mtp ? 2 * d : d;
  const int64_t n_h = 4, blocks = 3;
  std::mt19937 rng(mtp ? 43 : 42);
  const std::vector<float> h = random_floats(rng, n_h * d, -3.0f, 3.0f);
  const std::vector<float> w = random_floats(rng, blocks * d * d_in, -0.08f, 0.08f);
  const std::vector<float> b = random_floats(rng, blocks * d, -0.5f, 0.5f);
  // Output rows: (block, source row) pairs, blocks and sources mixed.
  const std::vector<std::pair<int, int32_t>> rows = {{0, 0}, {1, 0}, {2, 0}, {0, 3},
                                                     {2, 1}, {1, 2}, {0, 2}};
  const auto n_rows = static_cast<int64_t>(rows.size());
  const std::vector<float> e = random_floats(rng, n_rows * d, -1.0f, 1.0f);
  DeviceBuffer<float> dh(h.size()), dw(w.size()), db(b.size()), de(e.size()), dz(n_rows * d);
  dh.upload(h);
  dw.upload(w);
  db.upload(b);
  de.upload(e);
  std::vector<const float*> wp, bp;
  std::vector<int32_t> src;
  for (const auto& [block, row] : rows) {
    wp.push_back(dw.get() + block * d * d_in);
    bp.push_back(db.get() + block * d);
    src.push_back(row);
  }
  DeviceBuffer<const float*> dwp(wp.size()), dbp(bp.size());
  DeviceBuffer<int32_t> dsrc(src.size());
  dwp.upload(wp);
  dbp.upload(bp);
  dsrc.upload(src);
  launch_draft_residual(dwp.get(), dbp.get(), dh.get(), dsrc.get(), mtp ? de.get() : nullptr,
                        dz.get(), n_rows, d, stream_);
  TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const std::vector<float> z = dz.download();
  for (int64_t j = 0; j < n_rows; ++j) {
    const auto [block, row] = rows[static_cast<size_t>(j)];
    const float* hr = h.data() + row * d;
    auto x = [&](int64_t i) { return i < d ? hr[i] : e[j * d + i - d]; };
    for (int64_t o = 0; o < d; ++o) {
      const float* wo = w.data() + (block * d + o) * d_in;
      double dot = 0.0, magnitude = 0.0;
      for (int64_t i = 0; i < d_in; ++i) {
        dot += static_cast<double>(wo[i]) * x(i);
        magnitude += std::abs(static_cast<double>(wo[i]) * x(i));
      }
      const double u = dot + b[block * d + o];
      const double want = hr[o] + u / (1.0 + std::exp(-u));
      const double got = z[j * d + o];
      const double tol = 1e-5 * (1.0 + std::abs(hr[o]) + magnitude);
      QVERIFY2(std::abs(got - want) <= tol,
               qPrintable(QStringLiteral("row %1 output %2: gpu %3, cpu %4 (tolerance %5)")
                              .arg(j)
                              .arg(o)
                              .arg(got, 0, 'g', 9)
                              .arg(want, 0, 'g', 9)
                              .arg(tol)));
    }
  }
}

// Rows of a bf16 table and entries of an id table gathered by index: plain copies, bit-exact.
void TestCudaOps::gather_rows_match_cpu_exactly() {
  std::mt19937 rng(7);
  const int64_t table_rows = 1000, cols = 576, n = 37;
  std::vector<uint16_t> table(table_rows * cols);
  std::uniform_int_distribution<int> bits(0, 0xffff);
  for (uint16_t& v : table) v = static_cast<uint16_t>(bits(rng));
  std::vector<int32_t> ids(n), values(table_rows);
  std::uniform_int_distribution<int32_t> row(0, static_cast<int32_t>(table_rows) - 1);
  for (int32_t& i : ids) i = row(rng);
  for (int32_t& v : values) v = row(rng) * 7 + 3;
  DeviceBuffer<uint16_t> dtable(table.size()), dout(n * cols);
  DeviceBuffer<int32_t> dids(ids.size()), dvalues(values.size()), dgathered(n);
  dtable.upload(table);
  dids.upload(ids);
  dvalues.upload(values);
  launch_gather_rows_u16(dtable.get(), cols, dids.get(), n, dout.get(), stream_);
  launch_gather_i32(dvalues.get(), dids.get(), n, dgathered.get(), stream_);
  TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const std::vector<uint16_t> out = dout.download();
  const std::vector<int32_t> gathered = dgathered.download();
  for (int64_t i = 0; i < n; ++i) {
    QVERIFY(std::equal(out.begin() + i * cols, out.begin() + (i + 1) * cols,
                       table.begin() + ids[i] * cols));
    QCOMPARE(gathered[i], values[ids[i]]);
  }
}

// Each row's log-sum-exp against a double loop, on rows of a few to 49,152 values with NaNs and
// -inf (skipped / adding nothing), a row of NaNs only and one of -inf only (-inf), and one with a
// +inf (+inf). Tolerance: each exp is within 2 ulp and the f32 sum of n terms in (0, 1] (the
// largest is 1) is off by at most n·2^-24 of itself, so log(sum) is off by about n·6e-8; the
// final log and add are within a few ulp of the result: n·1.2e-7 + 4e-7·|lse| + 1e-6.
void TestCudaOps::row_logsumexp_matches_cpu() {
  std::mt19937 rng(9);
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (const int64_t n : {int64_t{3}, int64_t{1000}, int64_t{49152}}) {
    const int64_t rows = 7;
    std::vector<float> x = random_floats(rng, rows * n, -20.0f, 20.0f);
    x[1 * n] = std::nanf("");
    x[2 * n + n - 1] = -kInf;
    for (int64_t i = 0; i < n; ++i) x[4 * n + i] = std::nanf("");
    for (int64_t i = 0; i < n; ++i) x[5 * n + i] = -kInf;
    x[6 * n + n / 2] = kInf;
    DeviceBuffer<float> dx(x.size()), dout(rows);
    dx.upload(x);
    launch_row_logsumexp(dx.get(), rows, n, dout.get(), stream_);
    TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const std::vector<float> got = dout.download();
    for (int64_t r = 0; r < rows; ++r) {
      double top = -std::numeric_limits<double>::infinity(), sum = 0.0;
      for (int64_t i = 0; i < n; ++i)
        if (!std::isnan(x[r * n + i])) top = std::max(top, static_cast<double>(x[r * n + i]));
      if (std::isinf(top)) {
        QCOMPARE(got[r], static_cast<float>(top));
        continue;
      }
      for (int64_t i = 0; i < n; ++i)
        if (!std::isnan(x[r * n + i])) sum += std::exp(static_cast<double>(x[r * n + i]) - top);
      const double want = top + std::log(sum);
      const double tol = static_cast<double>(n) * 1.2e-7 + 4e-7 * std::abs(want) + 1e-6;
      QVERIFY2(std::abs(got[r] - want) <= tol,
               qPrintable(QStringLiteral("n %1 row %2: gpu %3, cpu %4 (tolerance %5)")
                              .arg(n)
                              .arg(r)
                              .arg(got[r])
                              .arg(want)
                              .arg(tol)));
    }
  }
}

void TestCudaOps::filter_candidates_matches_cpu_exactly_data() {
  QTest::addColumn<qint64>("n");
  QTest::addColumn<int>("width");
  // SmolLM2's vocabulary with the default top_k's width and the full one, Llama-3's, odd sizes.
  QTest::addRow("49152x40") << qint64{49152} << 40;
  QTest::addRow("49152x1024") << qint64{49152} << kMaxCandidates;
  QTest::addRow("128256x1024") << qint64{128256} << kMaxCandidates;
  QTest::addRow("1537x300") << qint64{1537} << 300;
  QTest::addRow("5x1") << qint64{5} << 1;
}

// Every row under a different filter (greedy; top-k of 1, 7, 40, 600 and off; min-p off, loose
// and tight; temperatures 0.2 to 3), on logits with ties (a 1/16 grid), -0, NaN, -inf and rows
// that must go whole (+inf, all NaN); the GPU's counts, order, logits and ids must equal the
// reference's.
void TestCudaOps::filter_candidates_matches_cpu_exactly() {
  QFETCH(qint64, n);
  QFETCH(int, width);
  std::mt19937 rng(static_cast<uint32_t>(n * 7 + width));
  const int64_t rows = 48;
  std::vector<float> x = random_floats(rng, rows * n, -12.0f, 12.0f);
  std::uniform_int_distribution<int64_t> col(0, n - 1);
  std::vector<CandidateFilter> filters(rows);
  const int32_t top_ks[] = {0, 1, 7, 40, 600};
  const float min_ps[] = {0.0f, 0.001f, 0.2f};
  const float temperatures[] = {0.2f, 1.0f, 3.0f};
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x.data() + r * n;
    const float spread = 0.5f + static_cast<float>(r % 5);  // flat rows to peaked ones
    for (int64_t i = 0; i < n; ++i) row[i] = std::round(row[i] * spread * 16.0f) / 16.0f;
    for (int i = 0; i < 6; ++i) {
      row[col(rng)] = -0.0f;
      row[col(rng)] = std::nanf("");
      row[col(rng)] = -std::numeric_limits<float>::infinity();
    }
    if (r % 16 == 14) row[col(rng)] = std::numeric_limits<float>::infinity();
    if (r % 16 == 15)
      for (int64_t i = 0; i < n; ++i) row[i] = std::nanf("");
    CandidateFilter& f = filters[r];
    f.greedy = r % 11 == 3 ? 1 : 0;
    f.top_k = top_ks[r % 5];
    const float min_p = min_ps[(r / 5) % 3];
    f.min_z = min_p > 0.0f ? std::log(min_p) - 1e-3f : -std::numeric_limits<float>::infinity();
    f.inv_temperature = 1.0f / temperatures[(r / 15) % 3];
  }
  DeviceBuffer<float> dx(x.size());
  DeviceBuffer<CandidateFilter> dfilters(rows);
  DeviceBuffer<int32_t> dargmax(rows), dcounts(rows), dids(rows * width);
  DeviceBuffer<float> dlogits(rows * width);
  dx.upload(x);
  dfilters.upload(filters);
  launch_argmax_rows(dx.get(), dargmax.get(), rows, n, stream_);
  launch_filter_candidates(dx.get(), rows, n, dfilters.get(), dargmax.get(), width, dlogits.get(),
                           dids.get(), dcounts.get(), stream_);
  TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const std::vector<int32_t> counts = dcounts.download();
  const std::vector<int32_t> ids = dids.download();
  const std::vector<float> logits = dlogits.download();
  int filtered = 0;
  std::vector<float> want_logits;
  std::vector<int32_t> want_ids;
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t want =
        filter_candidates(x.data() + r * n, n, filters[r], width, want_logits, want_ids);
    QVERIFY2(
        counts[r] == want,
        qPrintable(QStringLiteral("row %1: gpu count %2, cpu %3").arg(r).arg(counts[r]).arg(want)));
    filtered += want > 0;
    for (int32_t i = 0; i < want; ++i) {
      const size_t at = static_cast<size_t>(r * width + i);
      const bool same_logit =
          std::bit_cast<uint32_t>(logits[at]) == std::bit_cast<uint32_t>(want_logits[i]) ||
          (std::isnan(logits[at]) && std::isnan(want_logits[i]));
      QVERIFY2(ids[at] == want_ids[i] && same_logit,
               qPrintable(QStringLiteral("row %1 candidate %2: gpu (%3, %4), cpu (%5, %6)")
                              .arg(r)
                              .arg(i)
                              .arg(ids[at])
                              .arg(logits[at])
                              .arg(want_ids[i])
                              .arg(want_logits[i])));
    }
  }
  QVERIFY2(filtered >= rows / 3, qPrintable(QStringLiteral("only %1 rows filtered").arg(filtered)));
}

void TestCudaOps::kv_pack_unpack_round_trip_data() {
  QTest::addColumn<int>("n_kv_head");
  QTest::addColumn<int>("block_size");
  QTest::addColumn<int>("head_dim");
  QTest::addColumn<int>("n_ids");
  // SmolLM2's layer (3 kv heads × 16 × 64: 16-byte copies), Llama-8B's (8 × 16 × 128), and an odd
  // head_dim that forces the 2-byte copy path.
  QTest::newRow("3x16x64, 5 blocks") << 3 << 16 << 64 << 5;
  QTest::newRow("8x16x128, 37 blocks") << 8 << 16 << 128 << 37;
  QTest::newRow("1x7x5, 3 blocks") << 1 << 7 << 5 << 3;
}

void TestCudaOps::kv_pack_unpack_round_trip() {
  QFETCH(int, n_kv_head);
  QFETCH(int, block_size);
  QFETCH(int, head_dim);
  QFETCH(int, n_ids);
  const int n_blocks = 2 * n_ids + 3;
  const int64_t block_halves = int64_t{n_kv_head} * block_size * head_dim;
  std::mt19937 rng(static_cast<uint32_t>(n_kv_head * 1000 + block_size * 10 + head_dim + n_ids));
  // k, v: (n_blocks, n_kv_head, block_size, head_dim) random bits.
  std::uniform_int_distribution<int> bits(0, 0xffff);
  std::vector<uint16_t> k(n_blocks * block_halves), v(k.size());
  for (uint16_t& h : k) h = static_cast<uint16_t>(bits(rng));
  for (uint16_t& h : v) h = static_cast<uint16_t>(bits(rng));
  // ids: n_ids distinct blocks in shuffled order.
  std::vector<int32_t> ids(n_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(n_ids);
  std::vector<uint16_t> want(n_ids * 2 * block_halves);  // (n_ids, 2, block_halves)
  for (int i = 0; i < n_ids; ++i) {
    std::copy_n(k.begin() + ids[i] * block_halves, block_halves,
                want.begin() + (2 * i) * block_halves);
    std::copy_n(v.begin() + ids[i] * block_halves, block_halves,
                want.begin() + (2 * i + 1) * block_halves);
  }

  DeviceBuffer<uint16_t> dk(k.size()), dv(v.size()), dpacked(want.size());
  DeviceBuffer<int32_t> dids(ids.size());
  dk.upload(k);
  dv.upload(v);
  dids.upload(ids);
  launch_kv_pack_blocks(dk.get(), dv.get(), dids.get(), n_ids, block_halves, dpacked.get(),
                        stream_);
  TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  QVERIFY2(dpacked.download() == want, "packed blocks differ from the listed blocks of the pool");

  // Scattered into a zeroed pool, the listed blocks come back and every other block stays zero.
  TOKENFAB_CUDA_CHECK(cudaMemset(dk.get(), 0, dk.bytes()));
  TOKENFAB_CUDA_CHECK(cudaMemset(dv.get(), 0, dv.bytes()));
  launch_kv_unpack_blocks(dpacked.get(), dids.get(), n_ids, block_halves, dk.get(), dv.get(),
                          stream_);
  TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::vector<uint16_t> want_k(k.size(), 0), want_v(v.size(), 0);
  for (int32_t id : ids) {
    std::copy_n(k.begin() + id * block_halves, block_halves, want_k.begin() + id * block_halves);
    std::copy_n(v.begin() + id * block_halves, block_halves, want_v.begin() + id * block_halves);
  }
  QVERIFY2(dk.download() == want_k, "unpacked K pool differs");
  QVERIFY2(dv.download() == want_v, "unpacked V pool differs");
}

// count random values in [-2, 2) as bf16 bits and their exact f32 values.
static void random_bf16(std::mt19937& rng, int64_t count, std::vector<uint16_t>& bits,
                        std::vector<float>& values) {
  const std::vector<float> x = random_floats(rng, static_cast<size_t>(count), -2.0f, 2.0f);
  bits.resize(static_cast<size_t>(count));
  values.resize(static_cast<size_t>(count));
  for (size_t i = 0; i < x.size(); ++i) {
    bits[i] = fp32_to_bf16(x[i]);
    values[i] = bf16_to_fp32(bits[i]);
  }
}

void TestCudaOps::gemm_bf16_matches_cpu_loop_data() {
  QTest::addColumn<qint64>("m");
  QTest::addColumn<qint64>("n");
  QTest::addColumn<qint64>("k");
  // Decode (m = 1) and prefill-like m; SmolLM2's projections (576 → 192/576/1536, 1536 → 576),
  // odd n, and a Llama-8B-width k.
  const qint64 shapes[][3] = {{1, 192, 576},  {1, 1536, 576}, {3, 576, 1536}, {17, 7, 64},
                              {64, 577, 576}, {5, 33, 4096},  {1, 1, 8}};
  for (const auto& s : shapes)
    QTest::addRow("%lldx%lldx%lld", static_cast<long long>(s[0]), static_cast<long long>(s[1]),
                  static_cast<long long>(s[2]))
        << s[0] << s[1] << s[2];
}

void TestCudaOps::gemm_bf16_matches_cpu_loop() {
  QFETCH(qint64, m);
  QFETCH(qint64, n);
  QFETCH(qint64, k);
  std::mt19937 rng(static_cast<uint32_t>(m * 7 + n * 131 + k));
  // a: (m, k), b: (n, k) as bf16 bits, and their exact f32 values.
  std::vector<uint16_t> a_bits, b_bits;
  std::vector<float> a, b;
  random_bf16(rng, m * k, a_bits, a);
  random_bf16(rng, n * k, b_bits, b);
  std::vector<float> want(m * n);    // (m, n)
  std::vector<double> bound(m * n);  // allowed |gpu − cpu| per element
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0, magnitude = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const double prod = double{a[i * k + p]} * b[j * k + p];
        sum += prod;
        magnitude += std::fabs(prod);
      }
      want[i * n + j] = static_cast<float>(sum);
      bound[i * n + j] = kGemmUlps * static_cast<double>(std::max<int64_t>(k, 16)) *
                         std::ldexp(1.0, -24) * magnitude;
    }
  }

  CublasGemm gemm;
  DeviceBuffer<uint16_t> da(a_bits.size()), db(b_bits.size());
  DeviceBuffer<float> dc(want.size());
  da.upload(a_bits);
  db.upload(b_bits);
  for (int call = 0; call < 2; ++call) {  // the second call reuses the shape's cached plan
    TOKENFAB_CUDA_CHECK(cudaMemset(dc.get(), 0xff, dc.bytes()));
    gemm.bf16_nt(da.get(), db.get(), dc.get(), m, n, k, stream_);
    TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const std::vector<float> got = dc.download();
    for (int64_t i = 0; i < m * n; ++i)
      QVERIFY2(std::fabs(double{got[i]} - want[i]) <= bound[i],
               mismatch_message("gemm", i, n, got, want).constData());
  }
  // Accumulating: c = c0 + a·bᵀ (a residual add in the epilogue), within the same bound plus the
  // one rounding of the sum.
  const std::vector<float> c0 = random_floats(rng, static_cast<size_t>(m * n), -4.0f, 4.0f);
  dc.upload(c0);
  gemm.bf16_nt(da.get(), db.get(), dc.get(), m, n, k, stream_, true);
  TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const std::vector<float> summed = dc.download();
  std::vector<float> want_sum(want.size());
  for (int64_t i = 0; i < m * n; ++i) {
    want_sum[i] = static_cast<float>(double{want[i]} + c0[i]);
    const double allowed =
        bound[i] + std::ldexp(std::fabs(double{want_sum[i]}), -23) + std::ldexp(1.0, -24);
    QVERIFY2(std::fabs(double{summed[i]} - want_sum[i]) <= allowed,
             mismatch_message("accumulating gemm", i, n, summed, want_sum).constData());
  }
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument,
                           gemm.bf16_nt(da.get(), db.get(), dc.get(), m, n, 12, stream_));
}

void TestCudaOps::gemm_accumulate_equals_gemm_then_add_data() {
  QTest::addColumn<qint64>("m");
  QTest::addColumn<qint64>("n");
  QTest::addColumn<qint64>("k");
  // The many-row steps' o and down products (SmolLM2: 576 → 576, 1536 → 576; Llama-8B: 4096 →
  // 4096, 14336 → 4096) at prompt-like and batch-like row counts.
  const qint64 shapes[][3] = {{9, 576, 576},    {152, 576, 576},  {33, 576, 1536},
                              {512, 576, 1536}, {17, 4096, 4096}, {17, 4096, 14336}};
  for (const auto& s : shapes)
    QTest::addRow("%lldx%lldx%lld", static_cast<long long>(s[0]), static_cast<long long>(s[1]),
                  static_cast<long long>(s[2]))
        << s[0] << s[1] << s[2];
}

// CudaOptions::fused_epilogues: the residual add inside the GEMM (c += a·bᵀ, cuBLASLt's beta = 1)
// against the product into a scratch buffer and launch_add_inplace after it (the last GPU run's
// many-row steps). Where cuBLASLt's algorithm forms the f32 sum of the k products and then adds c
// (one rounding), the two are the same bits; an algorithm that reduces split-k partials into c
// adds in another order. Each side is within kGemmUlps·max(k, 16)·2^-24 of the exact sum's
// magnitude, Σ|a·b| + |c| (the gemm test's bound, with c as one more term), so they may differ by
// twice that; a missing or doubled c, or a product of the wrong rows, is off by about |c| or
// Σ|a·b|/√k, far outside it. How many elements are the same bits is reported.
void TestCudaOps::gemm_accumulate_equals_gemm_then_add() {
  QFETCH(qint64, m);
  QFETCH(qint64, n);
  QFETCH(qint64, k);
  std::mt19937 rng(static_cast<uint32_t>(m * 3 + n * 17 + k));
  // a: (m, k), b: (n, k) as bf16 bits, and their exact f32 values; c0: (m, n) residual rows.
  std::vector<uint16_t> a_bits, b_bits;
  std::vector<float> a, b;
  random_bf16(rng, m * k, a_bits, a);
  random_bf16(rng, n * k, b_bits, b);
  const std::vector<float> c0 = random_floats(rng, static_cast<size_t>(m * n), -8.0f, 8.0f);
  std::vector<double> allowed(c0.size());  // (m, n): |fused − separate| allowed per element
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double magnitude = std::fabs(double{c0[i * n + j]});
      for (int64_t p = 0; p < k; ++p) magnitude += std::fabs(double{a[i * k + p]} * b[j * k + p]);
      allowed[i * n + j] = 2 * kGemmUlps * static_cast<double>(std::max<int64_t>(k, 16)) *
                           std::ldexp(1.0, -24) * magnitude;
    }
  }

  CublasGemm gemm;
  DeviceBuffer<uint16_t> da(a_bits.size()), db(b_bits.size());
  DeviceBuffer<float> dx(c0.size()), dproj(c0.size()), dy(c0.size());
  da.upload(a_bits);
  db.upload(b_bits);
  dx.upload(c0);
  dy.upload(c0);
  // The last GPU run's way, then the accumulating product, each run twice (the second call of a
  // shape reuses its plan; the same plan serves both ways).
  for (int call = 0; call < 2; ++call) {
    gemm.bf16_nt(da.get(), db.get(), dproj.get(), m, n, k, stream_);
    launch_add_inplace(dx.get(), dproj.get(), m * n, stream_);
    gemm.bf16_nt(da.get(), db.get(), dy.get(), m, n, k, stream_, true);
    TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const std::vector<float> separate = dx.download(), fused = dy.download();
    dx.upload(c0);
    dy.upload(c0);
    int64_t same = 0;
    for (int64_t e = 0; e < m * n; ++e) {
      same += std::bit_cast<uint32_t>(separate[e]) == std::bit_cast<uint32_t>(fused[e]);
      QVERIFY2(std::fabs(double{fused[e]} - separate[e]) <= allowed[e],
               mismatch_message("accumulating gemm against gemm + add", e, n, fused, separate)
                   .constData());
    }
    if (call == 0)
      qInfo("%lld of %lld elements the same bits", static_cast<long long>(same),
            static_cast<long long>(m * n));
  }
}

void TestCudaOps::f32_to_bf16_matches_cpu_exactly() {
  QFETCH(qint64, rows);
  QFETCH(qint64, n);
  std::mt19937 rng(static_cast<uint32_t>(rows * 131 + n));
  // Random bit patterns: every exponent, subnormals, infinities, NaNs and exact ties all occur.
  std::uniform_int_distribution<uint32_t> bits;
  std::vector<float> x(static_cast<size_t>(rows * n));
  for (float& v : x) v = std::bit_cast<float>(bits(rng));
  x[0] = std::bit_cast<float>(0x3f808000u);                    // a tie that rounds to even (down)
  if (x.size() > 1) x[1] = std::bit_cast<float>(0x3f818000u);  // a tie that rounds up
  std::vector<uint16_t> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = fp32_to_bf16(x[i]);

  DeviceBuffer<float> dx(x.size());
  DeviceBuffer<uint16_t> dy(x.size());
  dx.upload(x);
  launch_f32_to_bf16(dx.get(), dy.get(), rows * n, stream_);
  TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const std::vector<uint16_t> got = dy.download();
  for (size_t i = 0; i < x.size(); ++i)
    QVERIFY2(got[i] == want[i],
             qPrintable(QStringLiteral("element %1 (f32 bits %2): gpu %3, cpu %4")
                            .arg(i)
                            .arg(std::bit_cast<uint32_t>(x[i]), 8, 16)
                            .arg(static_cast<uint>(got[i]), 4, 16)
                            .arg(static_cast<uint>(want[i]), 4, 16)));
}

void TestCudaOps::rope_kv_store_matches_cpu_exactly_data() {
  QTest::addColumn<int>("n_kv_head");
  QTest::addColumn<int>("head_dim");
  QTest::addColumn<int>("block_size");
  QTest::addColumn<qint64>("rows");
  QTest::addColumn<bool>("rotate");
  QTest::newRow("smollm2 decode") << 3 << 64 << 16 << qint64{1} << true;
  QTest::newRow("smollm2 chunk") << 3 << 64 << 16 << qint64{37} << true;
  QTest::newRow("smollm2 chunk, store only") << 3 << 64 << 16 << qint64{37} << false;
  QTest::newRow("llama3 rows") << 8 << 128 << 16 << qint64{9} << true;
  QTest::newRow("odd block, store only") << 2 << 96 << 5 << qint64{23} << false;
}

// launch_rope's KV store (the many-row path's RoPE and store in one launch): each row's k heads,
// as rotated in the same launch (or as given, with rot_dim 0), and its v heads land in the row's
// slot of the fp16 pool exactly as the CPU stores them (kernels::fp32_to_fp16_row into
// KvStorage's layout), and nothing else of the pool changes.
void TestCudaOps::rope_kv_store_matches_cpu_exactly() {
  QFETCH(int, n_kv_head);
  QFETCH(int, head_dim);
  QFETCH(int, block_size);
  QFETCH(qint64, rows);
  QFETCH(bool, rotate);
  std::mt19937 rng(static_cast<uint32_t>(n_kv_head * 7 + head_dim + rows + rotate));
  const int64_t kv_dim = static_cast<int64_t>(n_kv_head) * head_dim;
  const int64_t stride = 3 * kv_dim + 8;  // [q | k | v] rows (q of kv_dim here) and padding
  const std::vector<float> qkv =
      random_floats(rng, static_cast<size_t>(rows * stride), -8.0f, 8.0f);
  std::uniform_int_distribution<int32_t> pos(0, 5000);
  std::vector<int32_t> positions(static_cast<size_t>(rows));
  for (int32_t& p : positions) p = pos(rng);
  const int32_t n_blocks = static_cast<int32_t>((rows + block_size - 1) / block_size) * 2 + 1;
  // Each row to its own slot, scattered over the pool in a random order.
  std::vector<int32_t> slot_of(static_cast<size_t>(n_blocks) * block_size);
  std::iota(slot_of.begin(), slot_of.end(), 0);
  std::shuffle(slot_of.begin(), slot_of.end(), rng);
  slot_of.resize(static_cast<size_t>(rows));
  const size_t pool_halves = static_cast<size_t>(n_blocks) * kv_dim * block_size;

  DeviceBuffer<float> dqkv(qkv.size());
  DeviceBuffer<int32_t> d_slot_of(slot_of.size()), dpos(positions.size());
  DeviceBuffer<uint16_t> dk(pool_halves), dv(pool_halves);
  dqkv.upload(qkv);
  d_slot_of.upload(slot_of);
  dpos.upload(positions);
  dk.upload(std::vector<uint16_t>(pool_halves, 0x7e00));  // slots no row takes keep this NaN
  dv.upload(std::vector<uint16_t>(pool_halves, 0x7e00));
  RopeKvStore store;
  store.k_offset = kv_dim;
  store.v_offset = 2 * kv_dim;
  store.kv_slots = d_slot_of.get();
  store.n_kv_head = n_kv_head;
  store.block_size = block_size;
  store.k_pool = dk.get();
  store.v_pool = dv.get();
  launch_rope(dqkv.get(), dpos.get(), rows, stride, 2 * n_kv_head, head_dim, rotate ? head_dim : 0,
              10000.0f, stream_, false, &store);
  TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  // The rows as the launch left them: rotated q and k (RoPE itself is checked above), v as given.
  const std::vector<float> after = dqkv.download();
  if (!rotate) QVERIFY(after == qkv);
  std::vector<uint16_t> want_k(pool_halves, 0x7e00), want_v(pool_halves, 0x7e00);
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t slot = slot_of[static_cast<size_t>(r)];
    for (int g = 0; g < n_kv_head; ++g) {
      const int64_t dst = ((static_cast<int64_t>(slot / block_size) * n_kv_head + g) * block_size +
                           slot % block_size) *
                          head_dim;
      fp32_to_fp16_row(after.data() + r * stride + kv_dim + g * head_dim, want_k.data() + dst,
                       head_dim);
      fp32_to_fp16_row(after.data() + r * stride + 2 * kv_dim + g * head_dim, want_v.data() + dst,
                       head_dim);
    }
  }
  QVERIFY2(dk.download() == want_k, "K pool differs from the CPU store");
  QVERIFY2(dv.download() == want_v, "V pool differs from the CPU store");
  RopeKvStore bad = store;
  bad.v_offset = stride - kv_dim + 1;  // past the row's end
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument,
                           launch_rope(dqkv.get(), dpos.get(), rows, stride, 2 * n_kv_head,
                                       head_dim, head_dim, 10000.0f, stream_, false, &bad));
}

// CudaOptions::fused_epilogues: the many-row steps' RoPE launch with its KV store against RoPE
// alone and then launch_kv_store_rows (the last GPU run's two launches) on the same rows: the same
// rotated rows and the same pools, bit for bit (the same f32 → fp16 rounding of the same values
// into the same slots); and the separate store's pools are what the CPU stores.
void TestCudaOps::kv_store_after_rope_equals_the_rope_launch_store() {
  QFETCH(int, n_kv_head);
  QFETCH(int, head_dim);
  QFETCH(int, block_size);
  QFETCH(qint64, rows);
  QFETCH(bool, rotate);
  std::mt19937 rng(static_cast<uint32_t>(n_kv_head * 11 + head_dim + rows + rotate));
  const int64_t kv_dim = static_cast<int64_t>(n_kv_head) * head_dim;
  const int64_t stride = 3 * kv_dim + 8;  // [q | k | v] rows (q of kv_dim here) and padding
  const std::vector<float> qkv =
      random_floats(rng, static_cast<size_t>(rows * stride), -8.0f, 8.0f);
  std::uniform_int_distribution<int32_t> pos(0, 5000);
  std::vector<int32_t> positions(static_cast<size_t>(rows));
  for (int32_t& p : positions) p = pos(rng);
  const int32_t n_blocks = static_cast<int32_t>((rows + block_size - 1) / block_size) * 2 + 1;
  std::vector<int32_t> slot_of(static_cast<size_t>(n_blocks) * block_size);
  std::iota(slot_of.begin(), slot_of.end(), 0);
  std::shuffle(slot_of.begin(), slot_of.end(), rng);
  slot_of.resize(static_cast<size_t>(rows));
  const size_t pool_halves = static_cast<size_t>(n_blocks) * kv_dim * block_size;
  const std::vector<uint16_t> untouched(pool_halves, 0x7e00);  // slots no row takes keep this NaN

  DeviceBuffer<int32_t> d_slot_of(slot_of.size()), dpos(positions.size());
  d_slot_of.upload(slot_of);
  dpos.upload(positions);
  // Both ways, each on its own copy of the rows and pools.
  struct Run {
    DeviceBuffer<float> qkv;
    DeviceBuffer<uint16_t> k, v;
  };
  Run fused{DeviceBuffer<float>(qkv.size()), DeviceBuffer<uint16_t>(pool_halves),
            DeviceBuffer<uint16_t>(pool_halves)};
  Run separate{DeviceBuffer<float>(qkv.size()), DeviceBuffer<uint16_t>(pool_halves),
               DeviceBuffer<uint16_t>(pool_halves)};
  for (Run* r : {&fused, &separate}) {
    r->qkv.upload(qkv);
    r->k.upload(untouched);
    r->v.upload(untouched);
  }
  const int rot_dim = rotate ? head_dim : 0;
  RopeKvStore store;
  store.k_offset = kv_dim;
  store.v_offset = 2 * kv_dim;
  store.kv_slots = d_slot_of.get();
  store.n_kv_head = n_kv_head;
  store.block_size = block_size;
  store.k_pool = fused.k.get();
  store.v_pool = fused.v.get();
  launch_rope(fused.qkv.get(), dpos.get(), rows, stride, 2 * n_kv_head, head_dim, rot_dim, 10000.0f,
              stream_, false, &store);
  launch_rope(separate.qkv.get(), dpos.get(), rows, stride, 2 * n_kv_head, head_dim, rot_dim,
              10000.0f, stream_);
  launch_kv_store_rows(separate.qkv.get() + kv_dim, separate.qkv.get() + 2 * kv_dim, stride,
                       d_slot_of.get(), rows, n_kv_head, head_dim, block_size, separate.k.get(),
                       separate.v.get(), stream_);
  TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const std::vector<float> after = separate.qkv.download();
  QVERIFY2(first_bit_mismatch(fused.qkv.download(), after) < 0, "the rotated rows differ");
  const std::vector<uint16_t> k_pool = separate.k.download(), v_pool = separate.v.download();
  QVERIFY2(fused.k.download() == k_pool, "K pools differ");
  QVERIFY2(fused.v.download() == v_pool, "V pools differ");
  std::vector<uint16_t> want_k = untouched, want_v = untouched;
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t slot = slot_of[static_cast<size_t>(r)];
    for (int g = 0; g < n_kv_head; ++g) {
      const int64_t dst = ((static_cast<int64_t>(slot / block_size) * n_kv_head + g) * block_size +
                           slot % block_size) *
                          head_dim;
      fp32_to_fp16_row(after.data() + r * stride + kv_dim + g * head_dim, want_k.data() + dst,
                       head_dim);
      fp32_to_fp16_row(after.data() + r * stride + 2 * kv_dim + g * head_dim, want_v.data() + dst,
                       head_dim);
    }
  }
  QVERIFY2(k_pool == want_k, "the separate store's K pool differs from the CPU store");
  QVERIFY2(v_pool == want_v, "the separate store's V pool differs from the CPU store");
  QVERIFY_THROWS_EXCEPTION(
      std::invalid_argument,
      launch_kv_store_rows(separate.qkv.get(), separate.qkv.get(), kv_dim - 1, d_slot_of.get(),
                           rows, n_kv_head, head_dim, block_size, separate.k.get(),
                           separate.v.get(), stream_));
}

// The fused bf16 outputs (rms_norm_bf16, silu_mul_rows_bf16) are the f32 ops (each tested
// against the CPU above) followed by kernels::fp32_to_bf16, bit for bit.
void TestCudaOps::bf16_outputs_equal_the_f32_ops_rounded() {
  QFETCH(qint64, rows);
  QFETCH(qint64, n);
  std::mt19937 rng(static_cast<uint32_t>(rows * 31 + n));
  const std::vector<float> x = random_floats(rng, rows * n, -3.0f, 3.0f);
  const std::vector<float> w = random_floats(rng, n, 0.5f, 1.5f);
  DeviceBuffer<float> dx(x.size()), dw(w.size()), dy(x.size());
  DeviceBuffer<uint16_t> dy16(x.size());
  dx.upload(x);
  dw.upload(w);
  launch_rms_norm(dx.get(), dw.get(), dy.get(), rows, n, kEps, stream_);
  launch_rms_norm_bf16(dx.get(), dw.get(), dy16.get(), rows, n, kEps, stream_);
  TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  // Index of the first element of `got` that is not `f32` rounded to bf16, or -1.
  auto first_unrounded = [](const std::vector<float>& f32, const std::vector<uint16_t>& got) {
    for (size_t i = 0; i < f32.size(); ++i)
      if (got[i] != fp32_to_bf16(f32[i])) return static_cast<int64_t>(i);
    return int64_t{-1};
  };
  int64_t bad = first_unrounded(dy.download(), dy16.download());
  QVERIFY2(bad < 0, qPrintable(QStringLiteral("rms_norm_bf16 element %1").arg(bad)));

  // silu_mul over [gate | up] rows against silu_mul over the separated halves.
  const std::vector<float> gu = random_floats(rng, rows * 2 * n, -6.0f, 6.0f);
  std::vector<float> gate(static_cast<size_t>(rows * n)), up(gate.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) {
      gate[r * n + i] = gu[r * 2 * n + i];
      up[r * n + i] = gu[r * 2 * n + n + i];
    }
  DeviceBuffer<float> dgu(gu.size()), dgate(gate.size()), dup(up.size());
  DeviceBuffer<uint16_t> dout(gate.size());
  dgu.upload(gu);
  dgate.upload(gate);
  dup.upload(up);
  launch_silu_mul(dgate.get(), dup.get(), rows * n, stream_);
  launch_silu_mul_rows_bf16(dgu.get(), rows, n, dout.get(), stream_);
  TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  bad = first_unrounded(dgate.download(), dout.download());
  QVERIFY2(bad < 0, qPrintable(QStringLiteral("silu_mul_rows_bf16 element %1").arg(bad)));
}

void TestCudaOps::prepare_qk_matches_cpu_data() {
  QTest::addColumn<int>("n_head");
  QTest::addColumn<int>("n_kv_head");
  QTest::addColumn<int>("head_dim");
  QTest::addColumn<int>("rot_dim");
  QTest::addColumn<bool>("halves");
  QTest::addColumn<bool>("bias");
  QTest::addColumn<bool>("norm");
  QTest::addColumn<bool>("factors");
  QTest::addColumn<qint64>("rows");
  // The families' Q/K preparations (TransformerPass::prepare_qk): Llama 3 (adjacent pairs, its
  // frequency factors), Qwen 2 (biases, halves), Qwen 3 (Q/K norms, a head of 96), Gemma 3
  // (norms, heads of 256), Phi-3 (halves, LongRoPE factors and an attention factor), a partial
  // rotation.
  QTest::newRow("llama3 factors") << 8 << 2 << 64 << 64 << false << false << false << true
                                  << qint64{5};
  QTest::newRow("qwen2 biases") << 7 << 1 << 64 << 64 << true << true << false << false
                                << qint64{9};
  QTest::newRow("qwen3 norms") << 4 << 2 << 96 << 96 << true << false << true << false << qint64{1};
  QTest::newRow("gemma3 head 256")
      << 2 << 1 << 256 << 256 << true << false << true << false << qint64{17};
  QTest::newRow("phi3 longrope") << 4 << 4 << 96 << 96 << true << false << false << true
                                 << qint64{3};
  QTest::newRow("partial rotation, all")
      << 3 << 1 << 128 << 64 << true << true << true << true << qint64{6};
}

// launch_prepare_qk against the CPU's own steps (add_inplace of the biases, rms_norm of each q
// and k head, rope_table_scaled and rope / rope_halves): rows within a few ulp of the CPU's
// (relative to the largest value of the head), and the pool's K and V rows exactly the fp16 of
// the launch's own rows (kernels::fp32_to_fp16_row), nothing else of the pool touched.
void TestCudaOps::prepare_qk_matches_cpu() {
  QFETCH(int, n_head);
  QFETCH(int, n_kv_head);
  QFETCH(int, head_dim);
  QFETCH(int, rot_dim);
  QFETCH(bool, halves);
  QFETCH(bool, bias);
  QFETCH(bool, norm);
  QFETCH(bool, factors);
  QFETCH(qint64, rows);
  std::mt19937 rng(static_cast<uint32_t>(n_head * 13 + head_dim * 7 + rot_dim + rows));
  const int64_t q_dim = int64_t{n_head} * head_dim, kv_dim = int64_t{n_kv_head} * head_dim;
  const int64_t width = q_dim + 2 * kv_dim;
  const int64_t stride = width + 4;  // and padding, which must stay as it is
  const std::vector<float> qkv =
      random_floats(rng, static_cast<size_t>(rows * stride), -3.0f, 3.0f);
  const std::vector<float> b = random_floats(rng, static_cast<size_t>(width), -0.5f, 0.5f);
  const std::vector<float> q_norm = random_floats(rng, static_cast<size_t>(head_dim), 0.5f, 1.5f);
  const std::vector<float> k_norm = random_floats(rng, static_cast<size_t>(head_dim), 0.5f, 1.5f);
  const std::vector<float> freq = random_floats(rng, static_cast<size_t>(rot_dim / 2), 1.0f, 8.0f);
  const float base = 500000.0f, pos_scale = factors ? 0.5f : 1.0f;
  const float attn_factor = factors ? 1.19f : 1.0f;
  std::uniform_int_distribution<int32_t> pos(0, 30000);
  std::vector<int32_t> positions(static_cast<size_t>(rows));
  for (int32_t& p : positions) p = pos(rng);
  positions.front() = 0;
  const int block_size = 16;
  const int32_t n_blocks = static_cast<int32_t>((rows + block_size - 1) / block_size) * 2 + 1;
  std::vector<int32_t> slot_of(static_cast<size_t>(n_blocks) * block_size);
  std::iota(slot_of.begin(), slot_of.end(), 0);
  std::shuffle(slot_of.begin(), slot_of.end(), rng);
  slot_of.resize(static_cast<size_t>(rows));
  const size_t pool_halves = static_cast<size_t>(n_blocks) * kv_dim * block_size;

  // The CPU: row by row as TransformerPass::prepare_qk does, and the table the device reads.
  std::vector<float> want = qkv;
  std::vector<float> table(static_cast<size_t>(rows * rot_dim));  // (rows, rot_dim): cos, sin
  const int half = rot_dim / 2;
  for (int64_t r = 0; r < rows; ++r) {
    float* row = want.data() + r * stride;
    if (bias) add_inplace(row, b.data(), width);
    if (norm) {
      for (int h = 0; h < n_head + n_kv_head; ++h) {
        float* x = row + int64_t{h} * head_dim;
        rms_norm(x, h < n_head ? q_norm.data() : k_norm.data(), x, head_dim, kEps);
      }
    }
    float* c = table.data() + r * rot_dim;
    rope_table_scaled(positions[static_cast<size_t>(r)], rot_dim, base, pos_scale,
                      factors ? freq.data() : nullptr, attn_factor, c, c + half);
    for (float* x : {row, row + q_dim}) {
      const int heads = x == row ? n_head : n_kv_head;
      if (halves) {
        rope_halves(x, heads, head_dim, rot_dim, c, c + half);
      } else {
        rope(x, heads, head_dim, rot_dim, c, c + half);
      }
    }
  }

  DeviceBuffer<float> dqkv(qkv.size()), db(b.size()), dqn(q_norm.size()), dkn(k_norm.size());
  DeviceBuffer<float> dtable(table.size());
  DeviceBuffer<int32_t> dslots(slot_of.size());
  DeviceBuffer<uint16_t> dk(pool_halves), dv(pool_halves);
  dqkv.upload(qkv);
  db.upload(b);
  dqn.upload(q_norm);
  dkn.upload(k_norm);
  dtable.upload(table);
  dslots.upload(slot_of);
  dk.upload(std::vector<uint16_t>(pool_halves, 0x7e00));  // slots no row takes keep this NaN
  dv.upload(std::vector<uint16_t>(pool_halves, 0x7e00));
  PrepareQkArgs a;
  a.qkv = dqkv.get();
  a.rows = rows;
  a.row_stride = stride;
  a.n_head = n_head;
  a.n_kv_head = n_kv_head;
  a.head_dim = head_dim;
  a.rot_dim = rot_dim;
  a.halves = halves;
  a.bias = bias ? db.get() : nullptr;
  a.q_norm = norm ? dqn.get() : nullptr;
  a.k_norm = norm ? dkn.get() : nullptr;
  a.eps = kEps;
  a.rope = dtable.get();
  a.kv_slots = dslots.get();
  a.block_size = block_size;
  a.k_pool = dk.get();
  a.v_pool = dv.get();
  launch_prepare_qk(a, stream_);
  TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const std::vector<float> got = dqkv.download();
  // Each head within 1e-5 of its largest magnitude (the norm's scale moves a few ulp as in
  // rms_norm_matches_cpu, the rotation as in rope_matches_cpu); padding untouched.
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < stride; ++c) {
      const int64_t i = r * stride + c;
      if (c >= width) {
        QCOMPARE(got[i], qkv[i]);
        continue;
      }
      const int64_t head0 = r * stride + c / head_dim * head_dim;
      float largest = 0.0f;
      for (int d = 0; d < head_dim; ++d) largest = std::max(largest, std::fabs(want[head0 + d]));
      QVERIFY2(std::fabs(got[i] - want[i]) <= 1e-5f * largest,
               mismatch_message("prepare_qk", i, stride, got, want).constData());
    }
  }
  std::vector<uint16_t> want_k(pool_halves, 0x7e00), want_v(pool_halves, 0x7e00);
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t slot = slot_of[static_cast<size_t>(r)];
    for (int g = 0; g < n_kv_head; ++g) {
      const int64_t dst = ((static_cast<int64_t>(slot / block_size) * n_kv_head + g) * block_size +
                           slot % block_size) *
                          head_dim;
      fp32_to_fp16_row(got.data() + r * stride + q_dim + g * head_dim, want_k.data() + dst,
                       head_dim);
      fp32_to_fp16_row(got.data() + r * stride + q_dim + kv_dim + g * head_dim, want_v.data() + dst,
                       head_dim);
    }
  }
  QVERIFY2(dk.download() == want_k, "K pool differs from the fp16 of the launch's k rows");
  QVERIFY2(dv.download() == want_v, "V pool differs from the fp16 of the launch's v rows");
  PrepareQkArgs odd = a;
  odd.rot_dim = rot_dim - 1;
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument, launch_prepare_qk(odd, stream_));
}

void TestCudaOps::glu_rows_match_cpu_data() {
  QTest::addColumn<qint64>("rows");
  QTest::addColumn<qint64>("n");
  QTest::addColumn<bool>("gelu");
  const qint64 shapes[][2] = {{1, 32}, {7, 576}, {33, 1536}, {3, 4096}};
  for (const bool gelu : {false, true})
    for (const auto& sh : shapes)
      QTest::addRow("%s %lldx%lld", gelu ? "gelu-tanh" : "silu", static_cast<long long>(sh[0]),
                    static_cast<long long>(sh[1]))
          << sh[0] << sh[1] << gelu;
}

// launch_glu_rows against kernels::gelu_tanh_mul and silu_mul_scalar on the rows' gate and up
// halves. SiLU: as silu_mul_matches_cpu. GELU: tanhf and std::tanh each within 2 ulp, so
// 1 + tanh(·) is within a few ulp of 1 of the CPU's: allowed 1e-5·|want| + 1e-6·|gate·up| (the
// second term where 1 + tanh is small, for gates below about −3).
void TestCudaOps::glu_rows_match_cpu() {
  QFETCH(qint64, rows);
  QFETCH(qint64, n);
  QFETCH(bool, gelu);
  std::mt19937 rng(static_cast<uint32_t>(rows * 31 + n + gelu));
  const std::vector<float> gu = random_floats(rng, static_cast<size_t>(rows * 2 * n), -6.0f, 6.0f);
  std::vector<float> gate(static_cast<size_t>(rows * n)), up(gate.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) {
      gate[r * n + i] = gu[r * 2 * n + i];
      up[r * n + i] = gu[r * 2 * n + n + i];
    }
  std::vector<float> want = gate;
  if (gelu) {
    gelu_tanh_mul(want.data(), up.data(), rows * n);
  } else {
    silu_mul_scalar(want.data(), up.data(), rows * n);
  }
  DeviceBuffer<float> dgu(gu.size()), dout(want.size());
  dgu.upload(gu);
  launch_glu_rows(dgu.get(), rows, n, gelu ? GluActivation::kGeluTanh : GluActivation::kSilu,
                  dout.get(), stream_);
  TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const std::vector<float> got = dout.download();
  for (size_t i = 0; i < want.size(); ++i) {
    const float bound = 1e-5f * std::fabs(want[i]) + 1e-6f * std::fabs(gate[i] * up[i]);
    QVERIFY2(std::fabs(got[i] - want[i]) <= bound,
             mismatch_message("glu_rows", static_cast<int64_t>(i), n, got, want).constData());
  }
}

// launch_softcap against kernels::softcap (cap 30, Gemma 2's final one), values from well inside
// the cap to far past it: tanhf and std::tanh within 2 ulp each, so 1e-6 relative.
void TestCudaOps::softcap_matches_cpu() {
  QFETCH(qint64, rows);
  QFETCH(qint64, n);
  std::mt19937 rng(static_cast<uint32_t>(rows * 17 + n));
  const float cap = 30.0f;
  const std::vector<float> x = random_floats(rng, static_cast<size_t>(rows * n), -200.0f, 200.0f);
  std::vector<float> want = x;
  softcap(want.data(), rows * n, cap);
  DeviceBuffer<float> dx(x.size());
  dx.upload(x);
  launch_softcap(dx.get(), rows * n, cap, stream_);
  TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const std::vector<float> got = dx.download();
  const int64_t bad = first_relative_mismatch(got, want, 1e-6f);
  QVERIFY2(bad < 0, mismatch_message("softcap", bad, n, got, want).constData());
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument, launch_softcap(dx.get(), 1, 0.0f, stream_));
}

QTEST_APPLESS_MAIN(TestCudaOps)
#include "test_cuda_ops.moc"
