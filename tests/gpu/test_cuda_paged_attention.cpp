// The CUDA paged decode attention (kernels/cuda/paged_decode_attention.cuh) against the CPU's
// kernels::paged_attention on one random pool, for a batch that mixes decode rows (contexts of
// 1 key up to several splits, split boundaries included), a causal prefill chunk and a draft tree,
// over several GQA shapes. Skips when no CUDA device exists.
//
// Tolerance: every output is a softmax-weighted mean of V rows with |v| ≤ 1. The CPU sums the
// weighted V rows in f32 position by position, the GPU per warp, per split, then across splits;
// f32 summation of n terms of total weight 1 differs by at most n·2^-24 between two orders, and
// the exponentials (std::exp vs CUDA's expf, ≤ 2 ulp) and the dot products (≤ 256 f32 terms) add
// about 1e-6. Allowed per element: 4e-6 + n_keys·2^-24. Rows with few keys are held to about
// 1e-5, so a wrong or missing key (which moves an output by ~1/n_keys) cannot pass there.
// Both prompt kernels (PrefillAttentionKernel: tiled, and key by key as on the last GPU run) are
// held to the same bound (one online softmax per row over its keys in order, the weighted V rows
// summed in order, so their sums are within the same n·2^-24), and so to twice that of each
// other (tiled_prefill_attention_matches_the_key_by_key_kernel: the tiled kernel, not yet run on
// a GPU, against the one that was).
// A layer's sliding window and score soft-cap (the families' layers; windowed_and_capped_…) are
// held to the same bound: the soft-cap's tanh (CUDA's tanhf and the CPU's std::tanh, each within
// a few ulp) moves a score by about 1e-6 of the cap, far below it after the exponential.

#include <QtTest/QtTest>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/quant_types.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/paged_decode_attention.cuh"
#include "kernels/cuda/paged_prefill_attention.cuh"
#include "kernels/cuda/paged_rows.h"
#include "tests/gpu/cuda_test_support.h"

namespace {

using namespace tokenfab::kernels;
using namespace tokenfab::kernels::testing;

constexpr double kAttentionAbs = 4e-6;

// One sequence of the batch: its tokens, first position and (for a tree) parents.
struct SequenceShape {
  int64_t n_tokens;
  int64_t pos0;
  std::vector<int32_t> parent;  // empty: causal rows
};

// Decode rows around the split size (kPagedDecodeSplitKeys = 256): 1, 5, 256, 257 and 3001 keys;
// a causal chunk of 5 tokens after 37; a 7-row draft tree after 300 positions.
std::vector<SequenceShape> batch_shapes() {
  return {{1, 0, {}},
          {1, 4, {}},
          {1, 255, {}},
          {1, 256, {}},
          {1, 3000, {}},
          {5, 37, {}},
          {7, 300, {-1, 0, 0, 1, 1, 2, 5}}};
}

// A random pool for `shapes`: each sequence's blocks drawn from one shuffled list, so tables
// interleave; K and V fp16 in [-1, 1]; q rows in [-2, 2] with 3 floats of padding per row.
struct RandomBatch {
  std::vector<int64_t> n_seq_blocks;  // per sequence
  std::vector<int32_t> order;         // the block tables, back to back
  std::vector<uint16_t> k, v;         // (n_blocks, n_kv_head, block_size, head_dim)
  std::vector<float> q;               // (n_rows, stride)
  int64_t n_rows = 0, stride = 0;
};

RandomBatch random_batch(const std::vector<SequenceShape>& shapes, int n_head, int n_kv_head,
                         int head_dim, int block_size, std::mt19937& rng) {
  RandomBatch b;
  int64_t n_blocks = 0;
  for (const SequenceShape& s : shapes) {
    b.n_seq_blocks.push_back((s.pos0 + s.n_tokens + block_size - 1) / block_size);
    n_blocks += b.n_seq_blocks.back();
    b.n_rows += s.n_tokens;
  }
  b.order.resize(static_cast<size_t>(n_blocks));
  std::iota(b.order.begin(), b.order.end(), 0);
  std::shuffle(b.order.begin(), b.order.end(), rng);
  const int64_t pool_halves = n_blocks * n_kv_head * block_size * head_dim;
  for (std::vector<uint16_t>* pool_part : {&b.k, &b.v}) {
    const std::vector<float> values = random_floats(rng, pool_halves, -1.0f, 1.0f);
    pool_part->resize(static_cast<size_t>(pool_halves));
    std::transform(values.begin(), values.end(), pool_part->begin(), fp32_to_fp16);
  }
  b.stride = int64_t{n_head} * head_dim + 3;
  b.q = random_floats(rng, b.n_rows * b.stride, -2.0f, 2.0f);
  return b;
}

// The batch's pool and block tables in device memory.
struct DeviceBatch {
  explicit DeviceBatch(const RandomBatch& b)
      : k(b.k.size()), v(b.v.size()), tables(b.order.size()) {
    k.upload(b.k);
    v.upload(b.v);
    tables.upload(b.order);
  }
  DeviceBuffer<uint16_t> k, v;
  DeviceBuffer<int32_t> tables;
};

// The decode attention's scratch in device memory, its counters zeroed.
struct Workspace {
  Workspace(int64_t floats, int64_t counters) : partials(floats), counts(counters) {
    TOKENFAB_CUDA_CHECK(cudaMemset(counts.get(), 0, counts.bytes()));
  }
  PagedDecodeWorkspace view() const {
    return {partials.get(), static_cast<int64_t>(partials.size()), counts.get(),
            static_cast<int64_t>(counts.size())};
  }
  DeviceBuffer<float> partials;
  DeviceBuffer<int32_t> counts;
};

// What a bf16 output over a buffer of 0xffff should hold: kernels::fp32_to_bf16 of each output
// value, the first `width` columns of each row of `stride`, and the padding after them untouched.
std::vector<uint16_t> rounded_to_bf16(const std::vector<float>& values, int64_t stride,
                                      int64_t width) {
  std::vector<uint16_t> out(values.size());
  for (size_t i = 0; i < values.size(); ++i)
    out[i] = static_cast<int64_t>(i) % stride < width ? fp32_to_bf16(values[i]) : 0xffff;
  return out;
}

// kernels::paged_attention over the batch's pool: the reference output, (n_rows, stride); with a
// sliding window and a score soft-cap when they are > 0.
std::vector<float> cpu_attention(const RandomBatch& b, const std::vector<SequenceShape>& shapes,
                                 int n_head, int n_kv_head, int head_dim, int block_size,
                                 int32_t window = 0, float softcap = 0.0f) {
  std::vector<PagedSequence> seqs;
  int64_t block0 = 0, q_row = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const SequenceShape& s = shapes[i];
    const int32_t* parent = s.parent.empty() ? nullptr : s.parent.data();
    seqs.push_back({b.order.data() + block0, s.n_tokens, s.pos0, q_row, parent});
    block0 += b.n_seq_blocks[i];
    q_row += s.n_tokens;
  }
  std::vector<float> want(b.q.size(), 0.0f);
  const PagedKv kv{b.k.data(), b.v.data(), block_size, n_kv_head, head_dim, window, softcap};
  ThreadPool pool(1);
  PagedAttentionScratch scratch;
  paged_attention(kv, seqs, b.q.data(), b.stride, want.data(), b.stride, n_head,
                  1.0f / std::sqrt(static_cast<float>(head_dim)), pool, scratch);
  return want;
}

// The GQA shapes every attention test runs: SmolLM2-135M (9/3 × 64), Llama-8B (32/8 × 128),
// multi-head without GQA, one kv head for all, the largest head, a head_dim that is no multiple of
// 32, and one that is no multiple of 8 (the kernels' element-at-a-time path).
struct HeadShape {
  const char* name;
  int n_head, n_kv_head, head_dim, block_size;
};
constexpr HeadShape kHeadShapes[] = {
    {"9/3 x64 bs16", 9, 3, 64, 16},   {"32/8 x128 bs16", 32, 8, 128, 16},
    {"4/4 x128 bs32", 4, 4, 128, 32}, {"6/1 x96 bs8", 6, 1, 96, 8},
    {"2/1 x256 bs16", 2, 1, 256, 16}, {"3/3 x40 bs4", 3, 3, 40, 4},
    {"4/2 x36 bs16", 4, 2, 36, 16}};

void add_head_shape_columns() {
  QTest::addColumn<int>("n_head");
  QTest::addColumn<int>("n_kv_head");
  QTest::addColumn<int>("head_dim");
  QTest::addColumn<int>("block_size");
}

// Causal chunks of several lengths, from position 0 and after earlier context, tiles ending
// inside and on chunk boundaries.
std::vector<SequenceShape> prefill_shapes() {
  return {{37, 0, {}}, {4, 5, {}}, {16, 0, {}}, {17, 33, {}}, {100, 300, {}}, {64, 0, {}}};
}

// One prompt-attention call over a random batch of prefill_shapes(): its chunks on the device, the
// CPU's output, and launch(), which runs a kernel into an f32 or a bf16 output.
struct PrefillBatch {
  PrefillBatch(int n_head_, int n_kv_head, int head_dim, int block_size, std::mt19937& rng,
               int32_t window = 0, float softcap = 0.0f)
      : shapes(prefill_shapes()),
        b(random_batch(shapes, n_head_, n_kv_head, head_dim, block_size, rng)),
        d(b),
        dq(b.q.size()),
        dchunks(shapes.size()),
        kv{d.k.get(), d.v.get(), block_size, n_kv_head, head_dim, window, softcap},
        n_head(n_head_),
        scale(1.0f / std::sqrt(static_cast<float>(head_dim))) {
    std::vector<CudaPrefillChunk> chunks;
    int64_t block0 = 0, q_row = 0;
    for (size_t i = 0; i < shapes.size(); ++i) {
      const SequenceShape& s = shapes[i];
      chunks.push_back({d.tables.get() + block0, q_row, static_cast<int32_t>(s.n_tokens),
                        static_cast<int32_t>(s.pos0)});
      q_row0.push_back(q_row);
      max_tokens = std::max(max_tokens, static_cast<int32_t>(s.n_tokens));
      block0 += b.n_seq_blocks[i];
      q_row += s.n_tokens;
    }
    dchunks.upload(chunks);
    dq.upload(b.q);
    want = cpu_attention(b, shapes, n_head, n_kv_head, head_dim, block_size, window, softcap);
  }
  // The kernel's output, (n_rows, stride), columns past the heads 0; with `out16` the same call
  // into that bf16 buffer instead.
  std::vector<float> launch(PrefillAttentionKernel kernel, cudaStream_t stream,
                            DeviceBuffer<uint16_t>* out16 = nullptr) const {
    DeviceBuffer<float> dout(b.q.size());
    TOKENFAB_CUDA_CHECK(cudaMemset(dout.get(), 0, dout.bytes()));
    launch_paged_prefill_attention(
        kv, dchunks.get(), static_cast<int64_t>(shapes.size()), max_tokens, dq.get(), b.stride,
        out16 != nullptr ? nullptr : dout.get(), b.stride, n_head, scale, stream, false,
        out16 != nullptr ? out16->get() : nullptr, kernel);
    TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream));
    return dout.download();
  }
  // The allowed |gpu − cpu| of chunk si's token t (the header's bound).
  double bound(size_t si, int64_t t) const {
    return kAttentionAbs + (shapes[si].pos0 + t + 1) * std::ldexp(1.0, -24);
  }

  std::vector<SequenceShape> shapes;
  RandomBatch b;
  DeviceBatch d;
  DeviceBuffer<float> dq;
  DeviceBuffer<CudaPrefillChunk> dchunks;
  CudaPagedKv kv;
  int n_head;
  float scale;
  int32_t max_tokens = 0;
  std::vector<int64_t> q_row0;  // per chunk
  std::vector<float> want;      // the CPU's output
};

}  // namespace

class TestCudaPagedAttention : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void cleanupTestCase();
  void decode_attention_matches_cpu_data();
  void decode_attention_matches_cpu();
  void decode_attention_rejects_bad_shapes();
  void prefill_attention_matches_cpu_data();
  void prefill_attention_matches_cpu();
  void tiled_prefill_attention_matches_the_key_by_key_kernel_data() {
    decode_attention_matches_cpu_data();
  }
  void tiled_prefill_attention_matches_the_key_by_key_kernel();
  void windowed_and_capped_attention_matches_cpu_data();
  void windowed_and_capped_attention_matches_cpu();

 private:
  cudaStream_t stream_ = nullptr;
};

void TestCudaPagedAttention::initTestCase() {
  if (const QString why = no_cuda_device(); !why.isEmpty()) QSKIP(qPrintable(why));
  TOKENFAB_CUDA_CHECK(cudaStreamCreate(&stream_));
}

void TestCudaPagedAttention::cleanupTestCase() {
  if (stream_) cudaStreamDestroy(stream_);
}

void TestCudaPagedAttention::decode_attention_matches_cpu_data() {
  add_head_shape_columns();
  for (const HeadShape& h : kHeadShapes)
    QTest::newRow(h.name) << h.n_head << h.n_kv_head << h.head_dim << h.block_size;
}

// Every head shape with each prompt kernel.
void TestCudaPagedAttention::prefill_attention_matches_cpu_data() {
  add_head_shape_columns();
  QTest::addColumn<int>("kernel");  // PrefillAttentionKernel
  for (const HeadShape& h : kHeadShapes) {
    QTest::addRow("%s, key by key", h.name) << h.n_head << h.n_kv_head << h.head_dim << h.block_size
                                            << static_cast<int>(PrefillAttentionKernel::kKeyByKey);
    QTest::addRow("%s, tiled", h.name) << h.n_head << h.n_kv_head << h.head_dim << h.block_size
                                       << static_cast<int>(PrefillAttentionKernel::kTiled);
  }
}

void TestCudaPagedAttention::decode_attention_matches_cpu() {
  QFETCH(int, n_head);
  QFETCH(int, n_kv_head);
  QFETCH(int, head_dim);
  QFETCH(int, block_size);
  std::mt19937 rng(static_cast<uint32_t>(n_head * 1009 + n_kv_head * 101 + head_dim + block_size));
  const std::vector<SequenceShape> shapes = batch_shapes();
  const RandomBatch b = random_batch(shapes, n_head, n_kv_head, head_dim, block_size, rng);
  const std::vector<int64_t>& n_seq_blocks = b.n_seq_blocks;
  const std::vector<float>& q = b.q;
  const int64_t n_rows = b.n_rows, stride = b.stride;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const DeviceBatch d(b);
  const DeviceBuffer<uint16_t>&dk = d.k, &dv = d.v;
  const DeviceBuffer<int32_t>& dtables = d.tables;
  // The sequences over the device's copy of the block tables.
  std::vector<PagedSequence> gpu_seqs;
  int64_t block0 = 0, q_row = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const SequenceShape& s = shapes[i];
    const int32_t* parent = s.parent.empty() ? nullptr : s.parent.data();
    gpu_seqs.push_back({dtables.get() + block0, s.n_tokens, s.pos0, q_row, parent});
    block0 += n_seq_blocks[i];
    q_row += s.n_tokens;
  }
  const std::vector<float> want = cpu_attention(b, shapes, n_head, n_kv_head, head_dim, block_size);

  const CudaPagedRows rows = flatten_paged_rows(gpu_seqs);
  QCOMPARE(static_cast<int64_t>(rows.rows.size()), n_rows);
  DeviceBuffer<CudaPagedRow> drows(rows.rows.size());
  DeviceBuffer<int32_t> dpaths(rows.paths.size());
  drows.upload(rows.rows);
  dpaths.upload(rows.paths);
  DeviceBuffer<float> dq(q.size()), dout(q.size());
  dq.upload(q);
  TOKENFAB_CUDA_CHECK(cudaMemset(dout.get(), 0, dout.bytes()));
  const Workspace ws(paged_decode_workspace_floats(n_rows, n_head, head_dim, rows.max_keys),
                     n_rows * n_head);
  const CudaPagedKv gpu_kv{dk.get(), dv.get(), block_size, n_kv_head, head_dim};
  launch_paged_decode_attention(gpu_kv, drows.get(), n_rows, dpaths.get(), rows.max_keys, dq.get(),
                                stride, dout.get(), stride, n_head, scale, ws.view(), stream_);
  TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const std::vector<float> got = dout.download();
  // A second call on the same workspace gives the same bits: the first left its split counters
  // at zero for it.
  launch_paged_decode_attention(gpu_kv, drows.get(), n_rows, dpaths.get(), rows.max_keys, dq.get(),
                                stride, dout.get(), stride, n_head, scale, ws.view(), stream_);
  TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const std::vector<float> again = dout.download();
  const int64_t changed = first_bit_mismatch(again, got);
  QVERIFY2(changed < 0,
           qPrintable(QStringLiteral("a second call changed element %1").arg(changed)));
  // A call of another shape on the same workspace (the last three rows: long contexts of several
  // splits, a chunk, a tree) gives the bits a fresh workspace gives, and so does the whole batch
  // after it: the split counters keep their places whatever the partials' layout.
  const int64_t tail = 3;
  DeviceBuffer<float> dpart(q.size()), dfresh(q.size());
  TOKENFAB_CUDA_CHECK(cudaMemset(dpart.get(), 0, dpart.bytes()));
  TOKENFAB_CUDA_CHECK(cudaMemset(dfresh.get(), 0, dfresh.bytes()));
  const Workspace fresh(paged_decode_workspace_floats(tail, n_head, head_dim, rows.max_keys),
                        tail * n_head);
  for (auto [out_buffer, workspace] : {std::pair{&dpart, &ws}, std::pair{&dfresh, &fresh}})
    launch_paged_decode_attention(gpu_kv, drows.get() + (n_rows - tail), tail, dpaths.get(),
                                  rows.max_keys, dq.get(), stride, out_buffer->get(), stride,
                                  n_head, scale, workspace->view(), stream_);
  launch_paged_decode_attention(gpu_kv, drows.get(), n_rows, dpaths.get(), rows.max_keys, dq.get(),
                                stride, dout.get(), stride, n_head, scale, ws.view(), stream_);
  TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  QVERIFY2(dpart.download() == dfresh.download(),
           "fewer rows on a used workspace differ from a fresh workspace");
  QVERIFY2(first_bit_mismatch(dout.download(), got) < 0,
           "the whole batch after a call of another shape differs");
  // With a bf16 output (a GEMM's input): the same values rounded, bit for bit.
  DeviceBuffer<uint16_t> dout16(q.size());
  TOKENFAB_CUDA_CHECK(cudaMemset(dout16.get(), 0xff, dout16.bytes()));
  launch_paged_decode_attention(gpu_kv, drows.get(), n_rows, dpaths.get(), rows.max_keys, dq.get(),
                                stride, nullptr, stride, n_head, scale, ws.view(), stream_, false,
                                dout16.get());
  TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  QVERIFY(dout16.download() == rounded_to_bf16(got, stride, int64_t{n_head} * head_dim));

  for (int64_t r = 0; r < n_rows; ++r) {
    const CudaPagedRow& row = rows.rows[r];
    const double bound = kAttentionAbs + (row.n_ctx + row.path_len) * std::ldexp(1.0, -24);
    for (int64_t c = 0; c < stride; ++c) {
      const int64_t i = row.q_row * stride + c;
      QVERIFY2(std::fabs(double{got[i]} - want[i]) <= bound,
               qPrintable(QStringLiteral("row %1 (%2 keys) col %3: gpu %4, cpu %5")
                              .arg(r)
                              .arg(row.n_ctx + row.path_len)
                              .arg(c)
                              .arg(static_cast<double>(got[i]), 0, 'g', 9)
                              .arg(static_cast<double>(want[i]), 0, 'g', 9)));
    }
  }
}

void TestCudaPagedAttention::decode_attention_rejects_bad_shapes() {
  const CudaPagedKv too_wide{nullptr, nullptr, 16, 1, kPagedDecodeMaxHeadDim + 32};
  const PagedDecodeWorkspace none;
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument,
                           launch_paged_decode_attention(too_wide, nullptr, 1, nullptr, 1, nullptr,
                                                         0, nullptr, 0, 2, 1.0f, none, stream_));
  const CudaPagedKv kv{nullptr, nullptr, 16, 3, 64};
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument,  // 8 query heads over 3 kv heads
                           launch_paged_decode_attention(kv, nullptr, 1, nullptr, 1, nullptr, 0,
                                                         nullptr, 0, 8, 1.0f, none, stream_));
  const Workspace short_partials(10, 9), few_counters(100000, 8);
  QVERIFY_THROWS_EXCEPTION(
      std::invalid_argument,  // partials too short
      launch_paged_decode_attention(kv, nullptr, 1, nullptr, 300, nullptr, 0, nullptr, 0, 9, 1.0f,
                                    short_partials.view(), stream_));
  QVERIFY_THROWS_EXCEPTION(
      std::invalid_argument,  // a counter short of one per (row, head)
      launch_paged_decode_attention(kv, nullptr, 1, nullptr, 300, nullptr, 0, nullptr, 0, 9, 1.0f,
                                    few_counters.view(), stream_));
  const int32_t parent[] = {-1, 1};  // row 1 names itself
  const PagedSequence bad_tree{nullptr, 2, 0, 0, parent};
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument, flatten_paged_rows({&bad_tree, 1}));
}

// The prompt kernel of the row against the CPU on prefill_shapes(), in f32 and in bf16.
void TestCudaPagedAttention::prefill_attention_matches_cpu() {
  QFETCH(int, n_head);
  QFETCH(int, n_kv_head);
  QFETCH(int, head_dim);
  QFETCH(int, block_size);
  QFETCH(int, kernel);
  std::mt19937 rng(static_cast<uint32_t>(n_head * 7 + n_kv_head * 13 + head_dim + block_size));
  const PrefillBatch p(n_head, n_kv_head, head_dim, block_size, rng);
  const auto which = static_cast<PrefillAttentionKernel>(kernel);
  const int64_t stride = p.b.stride;
  const std::vector<float> got = p.launch(which, stream_);
  // With a bf16 output (a GEMM's input): the same values rounded, bit for bit.
  DeviceBuffer<uint16_t> dout16(p.b.q.size());
  TOKENFAB_CUDA_CHECK(cudaMemset(dout16.get(), 0xff, dout16.bytes()));
  p.launch(which, stream_, &dout16);
  QVERIFY(dout16.download() == rounded_to_bf16(got, stride, int64_t{n_head} * head_dim));
  for (size_t si = 0; si < p.shapes.size(); ++si) {
    for (int64_t t = 0; t < p.shapes[si].n_tokens; ++t) {
      const int64_t row = p.q_row0[si] + t;
      for (int64_t c = 0; c < stride; ++c) {
        const int64_t i = row * stride + c;
        QVERIFY2(std::fabs(double{got[i]} - p.want[i]) <= p.bound(si, t),
                 qPrintable(QStringLiteral("chunk %1 token %2 col %3: gpu %4, cpu %5")
                                .arg(si)
                                .arg(t)
                                .arg(c)
                                .arg(static_cast<double>(got[i]), 0, 'g', 9)
                                .arg(static_cast<double>(p.want[i]), 0, 'g', 9)));
      }
    }
  }
}

// CudaOptions::tiled_prompt_attention: the tiled kernel (not yet run on a GPU) against the
// key-by-key kernel of the last GPU run on the same chunks, element by element within twice the
// CPU bound (each is held to the CPU within it; a wrong, missing or extra key moves an output by
// about 1/n_keys, well outside it). Their bf16 outputs may differ only where their f32 ones do.
void TestCudaPagedAttention::tiled_prefill_attention_matches_the_key_by_key_kernel() {
  QFETCH(int, n_head);
  QFETCH(int, n_kv_head);
  QFETCH(int, head_dim);
  QFETCH(int, block_size);
  std::mt19937 rng(static_cast<uint32_t>(n_head * 5 + n_kv_head * 17 + head_dim + block_size));
  const PrefillBatch p(n_head, n_kv_head, head_dim, block_size, rng);
  const int64_t stride = p.b.stride;
  const std::vector<float> tiled = p.launch(PrefillAttentionKernel::kTiled, stream_);
  const std::vector<float> by_key = p.launch(PrefillAttentionKernel::kKeyByKey, stream_);
  int64_t same = 0, compared = 0;
  for (size_t si = 0; si < p.shapes.size(); ++si) {
    for (int64_t t = 0; t < p.shapes[si].n_tokens; ++t) {
      const int64_t row = p.q_row0[si] + t;
      for (int64_t c = 0; c < stride; ++c) {
        const int64_t i = row * stride + c;
        ++compared;
        same += std::memcmp(&tiled[i], &by_key[i], sizeof(float)) == 0;
        QVERIFY2(std::fabs(double{tiled[i]} - by_key[i]) <= 2 * p.bound(si, t),
                 qPrintable(QStringLiteral("chunk %1 token %2 col %3: tiled %4, key by key %5")
                                .arg(si)
                                .arg(t)
                                .arg(c)
                                .arg(static_cast<double>(tiled[i]), 0, 'g', 9)
                                .arg(static_cast<double>(by_key[i]), 0, 'g', 9)));
      }
    }
  }
  qInfo("%lld of %lld outputs the same bits", static_cast<long long>(same),
        static_cast<long long>(compared));
  DeviceBuffer<uint16_t> tiled16(p.b.q.size()), by_key16(p.b.q.size());
  TOKENFAB_CUDA_CHECK(cudaMemset(tiled16.get(), 0xff, tiled16.bytes()));
  TOKENFAB_CUDA_CHECK(cudaMemset(by_key16.get(), 0xff, by_key16.bytes()));
  p.launch(PrefillAttentionKernel::kTiled, stream_, &tiled16);
  p.launch(PrefillAttentionKernel::kKeyByKey, stream_, &by_key16);
  const std::vector<uint16_t> t16 = tiled16.download(), k16 = by_key16.download();
  for (size_t i = 0; i < t16.size(); ++i)
    if (std::memcmp(&tiled[i], &by_key[i], sizeof(float)) == 0) QCOMPARE(t16[i], k16[i]);
}

// Gemma's layers: a sliding window (a row at position p sees (p − window, p]) and a score
// soft-cap (c·tanh(s / c)), each alone and together, on two head shapes (Gemma 3's head of 256
// among them).
void TestCudaPagedAttention::windowed_and_capped_attention_matches_cpu_data() {
  add_head_shape_columns();
  QTest::addColumn<int>("window");
  QTest::addColumn<float>("softcap");
  const HeadShape shapes[] = {{"9/3 x64 bs16", 9, 3, 64, 16}, {"4/1 x256 bs16", 4, 1, 256, 16}};
  // Windows shorter than a block, than a split, and longer than a split (several splits kept);
  // soft-caps below the largest scores (|q·k|/√d reaches several units here).
  const std::pair<int, float> limits[] = {{8, 0.0f}, {0, 2.0f}, {100, 3.0f}, {300, 0.0f}};
  for (const HeadShape& h : shapes)
    for (const auto& [window, softcap] : limits)
      QTest::addRow("%s, window %d, soft-cap %g", h.name, window, static_cast<double>(softcap))
          << h.n_head << h.n_kv_head << h.head_dim << h.block_size << window << softcap;
}

// The decode kernel on batch_shapes() (decode rows, a chunk's rows, a draft tree) and both prompt
// kernels on prefill_shapes() (the tiled one declines windows and soft-caps: the key-by-key
// kernel runs) against the CPU with the same window and soft-cap.
void TestCudaPagedAttention::windowed_and_capped_attention_matches_cpu() {
  QFETCH(int, n_head);
  QFETCH(int, n_kv_head);
  QFETCH(int, head_dim);
  QFETCH(int, block_size);
  QFETCH(int, window);
  QFETCH(float, softcap);
  std::mt19937 rng(
      static_cast<uint32_t>(n_head * 31 + head_dim + window * 7 + static_cast<int>(softcap * 10)));
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  {  // decode rows
    const std::vector<SequenceShape> shapes = batch_shapes();
    const RandomBatch b = random_batch(shapes, n_head, n_kv_head, head_dim, block_size, rng);
    const DeviceBatch d(b);
    std::vector<PagedSequence> gpu_seqs;
    int64_t block0 = 0, q_row = 0;
    for (size_t i = 0; i < shapes.size(); ++i) {
      const SequenceShape& s = shapes[i];
      const int32_t* parent = s.parent.empty() ? nullptr : s.parent.data();
      gpu_seqs.push_back({d.tables.get() + block0, s.n_tokens, s.pos0, q_row, parent});
      block0 += b.n_seq_blocks[i];
      q_row += s.n_tokens;
    }
    const std::vector<float> want =
        cpu_attention(b, shapes, n_head, n_kv_head, head_dim, block_size, window, softcap);
    const CudaPagedRows rows = flatten_paged_rows(gpu_seqs);
    DeviceBuffer<CudaPagedRow> drows(rows.rows.size());
    DeviceBuffer<int32_t> dpaths(rows.paths.size());
    drows.upload(rows.rows);
    dpaths.upload(rows.paths);
    DeviceBuffer<float> dq(b.q.size()), dout(b.q.size());
    dq.upload(b.q);
    TOKENFAB_CUDA_CHECK(cudaMemset(dout.get(), 0, dout.bytes()));
    const Workspace ws(paged_decode_workspace_floats(b.n_rows, n_head, head_dim, rows.max_keys),
                       b.n_rows * n_head);
    const CudaPagedKv kv{d.k.get(), d.v.get(), block_size, n_kv_head, head_dim, window, softcap};
    launch_paged_decode_attention(kv, drows.get(), b.n_rows, dpaths.get(), rows.max_keys, dq.get(),
                                  b.stride, dout.get(), b.stride, n_head, scale, ws.view(),
                                  stream_);
    TOKENFAB_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const std::vector<float> got = dout.download();
    for (int64_t r = 0; r < b.n_rows; ++r) {
      const CudaPagedRow& row = rows.rows[static_cast<size_t>(r)];
      const double bound = kAttentionAbs + (row.n_ctx + row.path_len) * std::ldexp(1.0, -24);
      for (int64_t c = 0; c < b.stride; ++c) {
        const int64_t i = row.q_row * b.stride + c;
        QVERIFY2(std::fabs(double{got[i]} - want[i]) <= bound,
                 qPrintable(QStringLiteral("decode row %1 (%2 keys) col %3: gpu %4, cpu %5")
                                .arg(r)
                                .arg(row.n_ctx + row.path_len)
                                .arg(c)
                                .arg(static_cast<double>(got[i]), 0, 'g', 9)
                                .arg(static_cast<double>(want[i]), 0, 'g', 9)));
      }
    }
  }
  // Prompt chunks, through either kernel choice.
  const PrefillBatch p(n_head, n_kv_head, head_dim, block_size, rng, window, softcap);
  for (const PrefillAttentionKernel kernel :
       {PrefillAttentionKernel::kKeyByKey, PrefillAttentionKernel::kTiled}) {
    const std::vector<float> got = p.launch(kernel, stream_);
    for (size_t si = 0; si < p.shapes.size(); ++si) {
      for (int64_t t = 0; t < p.shapes[si].n_tokens; ++t) {
        const int64_t row = p.q_row0[si] + t;
        for (int64_t c = 0; c < p.b.stride; ++c) {
          const int64_t i = row * p.b.stride + c;
          QVERIFY2(
              std::fabs(double{got[i]} - p.want[i]) <= p.bound(si, t),
              qPrintable(QStringLiteral("%1 kernel: chunk %2 token %3 col %4: gpu %5, cpu %6")
                             .arg(kernel == PrefillAttentionKernel::kTiled ? "tiled" : "key-by-key")
                             .arg(si)
                             .arg(t)
                             .arg(c)
                             .arg(static_cast<double>(got[i]), 0, 'g', 9)
                             .arg(static_cast<double>(p.want[i]), 0, 'g', 9)));
        }
      }
    }
  }
  const CudaPagedKv negative{nullptr, nullptr, 16, 1, 64, -1, 0.0f};
  const PagedDecodeWorkspace none;
  QVERIFY_THROWS_EXCEPTION(std::invalid_argument,
                           launch_paged_decode_attention(negative, nullptr, 1, nullptr, 1, nullptr,
                                                         0, nullptr, 0, 1, 1.0f, none, stream_));
}

QTEST_APPLESS_MAIN(TestCudaPagedAttention)
#include "test_cuda_paged_attention.moc"
