// Paged attention over a pool whose block tables are shuffled (no sequence's blocks in order, and
// a prefix block run shared between sequences): paged_attention_reference against a plain
// double-precision loop over the block tables, and paged_attention (on 1, 2 and 3 threads) against
// the reference; paged_attention's rows are bitwise the same however the batch around them, its
// chunking or the thread count changes. Blocks no sequence owns and the rows past
// a sequence's end in its own last block hold NaN, so a read outside the table poisons the output;
// the padding after each out row must stay untouched. The grouped row kernel (all query heads of
// a kv head at once) equals the one-head kernel bit for bit.

#include <QtTest>
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/quant_types.h"

using namespace tokenfab::kernels;

namespace {

constexpr double kF32Eps = 0x1p-24;  // unit roundoff of f32
constexpr uint16_t kNanHalf = 0x7E00;
constexpr uint32_t kUntouched = 0x7FC0DEADu;  // out padding: never written
constexpr int kSharedPrefix = 16;  // positions shared by every sequence at least this long

struct Batch {
  int head_dim, block_size, n_head, n_kv_head;
  std::vector<uint16_t> k, v;                // (n_blocks, n_kv_head, block_size, head_dim)
  std::vector<std::vector<int32_t>> tables;  // per sequence
  std::vector<PagedSequence> seqs;
  std::vector<float> q;  // (rows, q_stride)
  int64_t q_stride, out_stride, rows;
  float scale;
  int64_t window = 0;  // the layer's sliding window (0: none) and score soft-cap (0: none)
  float softcap = 0;
  PagedKv kv() const {
    return {k.data(), v.data(), block_size, n_kv_head, head_dim, window, softcap};
  }
};

// Sequences (pos0, n_tokens): decodes at pos0 0, 1, 15, 16, 100 (and 300 without prefill);
// prefill chunks at pos0 0 and 37 of 5..40 tokens. The batch order is shuffled.
Batch make_batch(int head_dim, int block_size, int n_head, int n_kv_head, bool with_prefill,
                 unsigned seed, int64_t window = 0, float softcap = 0) {
  std::mt19937 rng(seed);
  std::vector<std::pair<int64_t, int64_t>> shapes = {{0, 1}, {1, 1}, {15, 1}, {16, 1}, {100, 1}};
  std::uniform_int_distribution<int64_t> chunk(5, 40);
  if (with_prefill) {
    shapes.push_back({0, chunk(rng)});
    shapes.push_back({37, chunk(rng)});
    shapes.push_back({37, chunk(rng)});
  } else {
    shapes.push_back({300, 1});
  }
  std::shuffle(shapes.begin(), shapes.end(), rng);

  Batch b{head_dim,
          block_size,
          n_head,
          n_kv_head,
          {},
          {},
          {},
          {},
          {},
          0,
          0,
          0,
          1.0f / std::sqrt(static_cast<float>(head_dim)),
          window,
          softcap};
  const int64_t shared_blocks = kSharedPrefix / block_size;
  int64_t n_blocks = shared_blocks + 3;  // three spare blocks nobody owns
  for (auto [pos0, n] : shapes) n_blocks += (pos0 + n + block_size - 1) / block_size;
  std::vector<int32_t> ids(n_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  const int64_t block_halves = int64_t{n_kv_head} * block_size * head_dim;
  b.k.assign(n_blocks * block_halves, kNanHalf);
  b.v.assign(n_blocks * block_halves, kNanHalf);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  // Writes random rows [0, rows) of every kv head of block `id`; the rest stay NaN.
  auto fill_block = [&](int32_t id, int64_t rows) {
    for (int g = 0; g < n_kv_head; ++g)
      for (int64_t i = 0; i < rows * head_dim; ++i) {
        const int64_t at = id * block_halves + g * block_size * head_dim + i;
        b.k[at] = fp32_to_fp16(unit(rng));
        b.v[at] = fp32_to_fp16(unit(rng));
      }
  };
  size_t next_id = 0;
  std::vector<int32_t> shared(ids.begin(), ids.begin() + shared_blocks);
  for (int32_t id : shared) fill_block(id, block_size);
  next_id = shared.size();
  for (auto [pos0, n] : shapes) {
    const int64_t n_rows = pos0 + n, n_table = (n_rows + block_size - 1) / block_size;
    std::vector<int32_t> table;
    if (n_rows >= kSharedPrefix) table = shared;
    while (static_cast<int64_t>(table.size()) < n_table) {
      const int32_t id = ids[next_id++];
      fill_block(id, std::min<int64_t>(block_size, n_rows - table.size() * block_size));
      table.push_back(id);
    }
    b.tables.push_back(std::move(table));
    b.seqs.push_back({nullptr, n, pos0, b.rows});
    b.rows += n;
  }
  for (size_t i = 0; i < b.seqs.size(); ++i) b.seqs[i].blocks = b.tables[i].data();
  b.q_stride = int64_t{n_head} * head_dim + 8;
  b.out_stride = int64_t{n_head} * head_dim + 5;
  // |q| ≤ 4 against |k| ≤ 1 spreads the scores over several units: peaked weights, not flat.
  std::uniform_real_distribution<float> qdist(-4.0f, 4.0f);
  b.q.resize(b.rows * b.q_stride);
  for (float& x : b.q) x = qdist(rng);
  return b;
}

// The definition in double, read through the block tables. tol: per (row, head), the error an f32
// implementation may make (|v| ≤ 1, so output errors are weight errors); the bound of
// tests/kernels/test_kernels_attention.cpp: scores 3·(head_dim + 2)·u·scale·Σ|q·k|, softmax
// (8 + (max − min score))·u, weighted sum (n_pos + 2)·u.
struct Expected {
  std::vector<double> out;  // (rows, n_head, head_dim)
  std::vector<double> tol;  // (rows, n_head)
};

Expected double_attention(const Batch& b) {
  Expected e;
  e.out.assign(b.rows * b.n_head * b.head_dim, 0.0);
  e.tol.assign(b.rows * b.n_head, 0.0);
  const int group = b.n_head / b.n_kv_head;
  for (const PagedSequence& s : b.seqs) {
    for (int64_t t = 0; t < s.n_tokens; ++t) {
      const int64_t row = s.q_row + t, n = s.pos0 + t + 1;
      // A window hides positions before `first`: they take no weight.
      const int64_t first = b.window > 0 && n > b.window ? n - b.window : 0;
      for (int h = 0; h < b.n_head; ++h) {
        auto at = [&](int64_t p) {  // half index of row p of kv head h / group
          return ((int64_t{s.blocks[p / b.block_size]} * b.n_kv_head + h / group) * b.block_size +
                  p % b.block_size) *
                 b.head_dim;
        };
        const float* q = b.q.data() + row * b.q_stride + h * b.head_dim;
        std::vector<double> w(n);
        double mag_max = 0, smax = -INFINITY, smin = INFINITY;
        for (int64_t p = 0; p < n; ++p) {
          double dot = 0, mag = 0;
          for (int d = 0; d < b.head_dim; ++d) {
            const double kd = fp16_to_fp32(b.k[at(p) + d]);
            dot += q[d] * kd;
            mag += std::fabs(q[d] * kd);
          }
          w[p] = dot * b.scale;
          if (b.softcap > 0) w[p] = b.softcap * std::tanh(w[p] / b.softcap);
          if (p < first) w[p] = -INFINITY;
          mag_max = std::max(mag_max, mag * b.scale);
          smax = std::max(smax, w[p]);
          if (p >= first) smin = std::min(smin, w[p]);
        }
        double sum = 0;
        for (double& x : w) sum += (x = std::exp(x - smax));
        double* out = e.out.data() + (row * b.n_head + h) * b.head_dim;
        for (int64_t p = 0; p < n; ++p)
          for (int d = 0; d < b.head_dim; ++d) out[d] += w[p] / sum * fp16_to_fp32(b.v[at(p) + d]);
        // A soft-cap adds the rounding of its division, tanh and product (a few units of
        // cap · u) to each score; it shrinks the scores' own errors.
        e.tol[row * b.n_head + h] = 3 * (b.head_dim + 2) * kF32Eps * mag_max +
                                    4 * b.softcap * kF32Eps +
                                    (8 + (smax - smin) + static_cast<double>(n + 2)) * kF32Eps;
      }
    }
  }
  return e;
}

std::vector<float> fresh_out(const Batch& b) {
  return std::vector<float>(b.rows * b.out_stride, std::bit_cast<float>(kUntouched));
}

// Empty when every out element is within limit[row · n_head + head] of want (dense (rows, n_head,
// head_dim)) and the row padding is untouched; otherwise the first offence.
QString compare(const Batch& b, const std::vector<float>& got, const std::vector<double>& want,
                const std::vector<double>& limits) {
  for (int64_t r = 0; r < b.rows; ++r) {
    for (int h = 0; h < b.n_head; ++h) {
      const double limit = limits[r * b.n_head + h];
      for (int d = 0; d < b.head_dim; ++d) {
        const double g = got[r * b.out_stride + h * b.head_dim + d];
        const double w = want[(r * b.n_head + h) * b.head_dim + d];
        if (!(std::fabs(g - w) <= limit))
          return QString("row %1 head %2 dim %3: got %4, want %5 (limit %6)")
              .arg(r)
              .arg(h)
              .arg(d)
              .arg(g, 0, 'g', 9)
              .arg(w, 0, 'g', 9)
              .arg(limit, 0, 'g', 3);
      }
    }
    for (int64_t i = int64_t{b.n_head} * b.head_dim; i < b.out_stride; ++i)
      if (std::bit_cast<uint32_t>(got[r * b.out_stride + i]) != kUntouched)
        return QString("row %1: padding written at %2").arg(r).arg(i);
  }
  return {};
}

std::vector<float> run_reference(const Batch& b) {
  std::vector<float> out = fresh_out(b);
  paged_attention_reference(b.kv(), b.seqs, b.q.data(), b.q_stride, out.data(), b.out_stride,
                            b.n_head, b.scale);
  return out;
}

}  // namespace

class PagedTest : public QObject {
  Q_OBJECT
 private slots:
  void reference_matches_double_data() { add_rows(); }
  void reference_matches_double();
  void paged_matches_reference_data() { add_rows(); }
  void paged_matches_reference();
  void rows_are_batch_invariant_data() { add_rows(); }
  void rows_are_batch_invariant();
  void tree_rows_equal_their_path_on_a_chain_data() { add_rows(); }
  void tree_rows_equal_their_path_on_a_chain();
  void grouped_heads_equal_one_head_at_a_time();

 private:
  static void add_rows();
};

void PagedTest::add_rows() {
  QTest::addColumn<int>("head_dim");
  QTest::addColumn<int>("block_size");
  QTest::addColumn<int>("n_head");
  QTest::addColumn<int>("n_kv_head");
  QTest::addColumn<bool>("with_prefill");
  QTest::addColumn<int>("window");
  QTest::addColumn<float>("softcap");
  const int heads[][2] = {{9, 3}, {4, 4}, {8, 1}};
  // head_dim 64 with both block sizes; 128 (the other AVX2 specialisation in use) with one.
  const int shapes[][2] = {{64, 4}, {64, 16}, {128, 16}};
  for (const auto& db : shapes)
    for (const auto& hk : heads)
      for (bool prefill : {true, false})
        QTest::addRow("d%d_bs%d_h%d_kv%d_%s", db[0], db[1], hk[0], hk[1],
                      prefill ? "mixed" : "decode")
            << db[0] << db[1] << hk[0] << hk[1] << prefill << 0 << 0.0f;
  // Sliding windows (gemma) — 13 positions, not a multiple of any block size, and 7 with a
  // soft-cap of 3 that the scores of |q| ≤ 4 reach (gemma2) — and head_dim 256 (gemma3).
  for (const auto& db : shapes)
    for (bool prefill : {true, false}) {
      QTest::addRow("d%d_bs%d_h9_kv3_%s_window13", db[0], db[1], prefill ? "mixed" : "decode")
          << db[0] << db[1] << 9 << 3 << prefill << 13 << 0.0f;
      QTest::addRow("d%d_bs%d_h8_kv1_%s_window7_cap3", db[0], db[1], prefill ? "mixed" : "decode")
          << db[0] << db[1] << 8 << 1 << prefill << 7 << 3.0f;
    }
  QTest::addRow("d256_bs16_h4_kv1_mixed_window13") << 256 << 16 << 4 << 1 << true << 13 << 0.0f;
}

void PagedTest::reference_matches_double() {
  QFETCH(int, head_dim);
  QFETCH(int, block_size);
  QFETCH(int, n_head);
  QFETCH(int, n_kv_head);
  QFETCH(bool, with_prefill);
  QFETCH(int, window);
  QFETCH(float, softcap);
  const Batch b = make_batch(head_dim, block_size, n_head, n_kv_head, with_prefill,
                             7u * block_size + n_head + head_dim, window, softcap);
  const Expected e = double_attention(b);
  const QString err = compare(b, run_reference(b), e.out, e.tol);
  QVERIFY2(err.isEmpty(), qPrintable(err));
}

// Within 1e-5 absolute, i.e. 1e-5 of the output scale (each output is a convex combination of
// |v| ≤ 1). Both sides round differently (split-K merge, f32 copies, the AVX2 polynomial exp);
// the largest difference seen over these cases is 7.5e-7, while a dropped position, a wrong block
// or a wrong partial fold moves outputs by more than 1e-3. One scratch serves every call: it grows
// for the first and is reused after, and a repeated call gives identical bits.
void PagedTest::paged_matches_reference() {
  QFETCH(int, head_dim);
  QFETCH(int, block_size);
  QFETCH(int, n_head);
  QFETCH(int, n_kv_head);
  QFETCH(bool, with_prefill);
  QFETCH(int, window);
  QFETCH(float, softcap);
  const Batch b = make_batch(head_dim, block_size, n_head, n_kv_head, with_prefill,
                             7u * block_size + n_head + head_dim, window, softcap);
  const std::vector<float> ref = run_reference(b);
  const std::vector<double> limits(b.rows * b.n_head, 1e-5);
  std::vector<double> want;
  for (int64_t r = 0; r < b.rows; ++r)
    want.insert(want.end(), ref.begin() + r * b.out_stride,
                ref.begin() + r * b.out_stride + int64_t{b.n_head} * b.head_dim);
  PagedAttentionScratch scratch;
  for (int n_threads : {1, 2, 3}) {
    ThreadPool pool(n_threads);
    std::vector<float> first;
    for (int call = 0; call < 2; ++call) {
      std::vector<float> out = fresh_out(b);
      paged_attention(b.kv(), b.seqs, b.q.data(), b.q_stride, out.data(), b.out_stride, b.n_head,
                      b.scale, pool, scratch);
      const QString err = compare(b, out, want, limits);
      QVERIFY2(err.isEmpty(), qPrintable(QString("%1 threads: %2").arg(n_threads).arg(err)));
      if (call == 0) first = out;
      QVERIFY2(std::memcmp(first.data(), out.data(), out.size() * sizeof(float)) == 0,
               "a repeated call changed the result");
    }
  }
}

// The engine's modes (alone, batched, chunked, disaggregated) give identical greedy outputs only
// if a row's attention output is a function of its query and its context alone. Checked bit for
// bit against the batched 1-thread result: other thread counts; each sequence alone; every
// prefill chunk cut in two at each position; every prefill row recomputed as a one-token decode.
void PagedTest::rows_are_batch_invariant() {
  QFETCH(int, head_dim);
  QFETCH(int, block_size);
  QFETCH(int, n_head);
  QFETCH(int, n_kv_head);
  QFETCH(bool, with_prefill);
  QFETCH(int, window);
  QFETCH(float, softcap);
  const Batch b = make_batch(head_dim, block_size, n_head, n_kv_head, with_prefill,
                             11u * block_size + n_head + head_dim, window, softcap);
  PagedAttentionScratch scratch;
  auto run = [&](std::span<const PagedSequence> seqs, int n_threads) {
    ThreadPool pool(n_threads);
    std::vector<float> out = fresh_out(b);
    paged_attention(b.kv(), seqs, b.q.data(), b.q_stride, out.data(), b.out_stride, b.n_head,
                    b.scale, pool, scratch);
    return out;
  };
  const int64_t row_floats = int64_t{b.n_head} * b.head_dim;
  auto same_rows = [&](const std::vector<float>& got, const std::vector<float>& want, int64_t r0,
                       int64_t n) {
    return std::memcmp(
               got.data() + r0 * b.out_stride, want.data() + r0 * b.out_stride,
               static_cast<size_t>(((n - 1) * b.out_stride + row_floats)) * sizeof(float)) == 0;
  };
  const std::vector<float> base = run(b.seqs, 1);
  for (int n_threads : {2, 3})
    QVERIFY2(same_rows(run(b.seqs, n_threads), base, 0, b.rows),
             qPrintable(QString("%1 threads changed some row").arg(n_threads)));
  for (size_t i = 0; i < b.seqs.size(); ++i) {
    const PagedSequence& s = b.seqs[i];
    QVERIFY2(same_rows(run({&s, 1}, 2), base, s.q_row, s.n_tokens),
             qPrintable(QString("sequence %1 alone differs from the batch").arg(i)));
    for (int64_t cut = 1; cut < s.n_tokens; ++cut) {
      const PagedSequence halves[2] = {{s.blocks, cut, s.pos0, s.q_row},
                                       {s.blocks, s.n_tokens - cut, s.pos0 + cut, s.q_row + cut}};
      QVERIFY2(same_rows(run(halves, 2), base, s.q_row, s.n_tokens),
               qPrintable(QString("sequence %1 cut at %2 differs").arg(i).arg(cut)));
      const PagedSequence decode{s.blocks, 1, s.pos0 + cut, s.q_row + cut};
      QVERIFY2(same_rows(run({&decode, 1}, 2), base, s.q_row + cut, 1),
               qPrintable(QString("sequence %1 row %2 as a decode differs").arg(i).arg(cut)));
    }
  }
}

// Speculative verification of a draft tree: every row of a tree sequence (random parents) gives,
// bit for bit, what its token gives as a one-row decode on a chain made of the same context and
// its ancestors' K/V rows in depth order — in a batch with causal sequences, on 2 threads.
void PagedTest::tree_rows_equal_their_path_on_a_chain() {
  QFETCH(int, head_dim);
  QFETCH(int, block_size);
  QFETCH(int, n_head);
  QFETCH(int, n_kv_head);
  QFETCH(bool, with_prefill);
  QFETCH(int, window);
  QFETCH(float, softcap);
  Q_UNUSED(with_prefill);  // a tree needs multi-row sequences: always a mixed batch
  Batch b = make_batch(head_dim, block_size, n_head, n_kv_head, true,
                       13u * block_size + n_head + head_dim, window, softcap);
  size_t tree_seq = 0;
  for (size_t i = 0; i < b.seqs.size(); ++i)
    if (b.seqs[i].n_tokens > b.seqs[tree_seq].n_tokens) tree_seq = i;
  PagedSequence& s = b.seqs[tree_seq];
  std::mt19937 rng(block_size * 31 + head_dim);
  std::vector<int32_t> parent(static_cast<size_t>(s.n_tokens), -1);
  for (int64_t t = 1; t < s.n_tokens; ++t)
    parent[t] = std::uniform_int_distribution<int32_t>(0, static_cast<int32_t>(t - 1))(rng);
  s.parent = parent.data();

  PagedAttentionScratch scratch;
  ThreadPool pool(2);
  std::vector<float> tree_out = fresh_out(b);
  paged_attention(b.kv(), b.seqs, b.q.data(), b.q_stride, tree_out.data(), b.out_stride, b.n_head,
                  b.scale, pool, scratch);

  const int64_t block_halves = int64_t{n_kv_head} * block_size * head_dim;
  for (int64_t t = 0; t < s.n_tokens; ++t) {
    std::vector<int64_t> path;  // rows root … t
    for (int64_t r = t; r >= 0; r = parent[r]) path.insert(path.begin(), r);
    QCOMPARE(paged_row_depth(s, t), static_cast<int64_t>(path.size()) - 1);
    // The chain: fresh blocks after the pool's, holding positions [0, pos0 + depth].
    const int64_t n_pos = s.pos0 + static_cast<int64_t>(path.size());
    const int64_t n_new = (n_pos + block_size - 1) / block_size;
    const int64_t first_new = static_cast<int64_t>(b.k.size()) / block_halves;
    std::vector<uint16_t> k = b.k, v = b.v;
    k.resize(k.size() + n_new * block_halves, kNanHalf);
    v.resize(v.size() + n_new * block_halves, kNanHalf);
    std::vector<int32_t> table;
    for (int64_t i = 0; i < n_new; ++i) table.push_back(static_cast<int32_t>(first_new + i));
    auto at = [&](const int32_t* blocks, int g, int64_t p) {
      return ((int64_t{blocks[p / block_size]} * n_kv_head + g) * block_size + p % block_size) *
             head_dim;
    };
    for (int g = 0; g < n_kv_head; ++g)
      for (int64_t p = 0; p < n_pos; ++p) {
        const int64_t src = p < s.pos0 ? p : s.pos0 + path[p - s.pos0];
        std::copy_n(b.k.begin() + at(s.blocks, g, src), head_dim,
                    k.begin() + at(table.data(), g, p));
        std::copy_n(b.v.begin() + at(s.blocks, g, src), head_dim,
                    v.begin() + at(table.data(), g, p));
      }
    const PagedKv chain_kv{k.data(), v.data(), block_size, n_kv_head, head_dim, b.window,
                           b.softcap};
    const PagedSequence decode{table.data(), 1, n_pos - 1, s.q_row + t};
    std::vector<float> chain_out = fresh_out(b);
    paged_attention(chain_kv, {&decode, 1}, b.q.data(), b.q_stride, chain_out.data(), b.out_stride,
                    b.n_head, b.scale, pool, scratch);
    const int64_t row = s.q_row + t;
    QVERIFY2(
        std::memcmp(tree_out.data() + row * b.out_stride, chain_out.data() + row * b.out_stride,
                    sizeof(float) * n_head * head_dim) == 0,
        qPrintable(
            QString("tree row %1 (depth %2) differs from its chain").arg(t).arg(path.size() - 1)));
  }
}

// attend_rows_grouped_f32_avx2 (the G query heads of one kv head at once, the paged kernel's
// fast path) against attend_rows_f32_avx2 for one head at a time: bit for bit, for every AVX2
// head size, group sizes with and without a specialisation (1–4 and 5), and context lengths
// around the kernels' 4-position groups and 4-vector chunks.
void PagedTest::grouped_heads_equal_one_head_at_a_time() {
  if (!cpu_features().avx2) QSKIP("this CPU has no AVX2 (or TOKENFAB_FORCE_SCALAR=1)");
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int head_dim : {32, 64, 96, 128, 256}) {
    for (int group : {1, 2, 3, 4, 5}) {
      for (int64_t n_pos : {1, 2, 3, 4, 5, 7, 8, 17, 64, 131}) {
        std::vector<float> q(group * head_dim), k(n_pos * head_dim), v(n_pos * head_dim);
        for (std::vector<float>* buf : {&q, &k, &v})
          for (float& x : *buf) x = normal(rng);
        const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
        std::vector<float> scores(group * n_pos), grouped(group * head_dim), one(group * head_dim);
        attend_rows_grouped_f32_avx2(q.data(), k.data(), v.data(), n_pos, head_dim, group, scale,
                                     scores.data(), grouped.data());
        for (int g = 0; g < group; ++g)
          attend_rows_f32_avx2(q.data() + g * head_dim, k.data(), v.data(), n_pos, head_dim, scale,
                               scores.data(), one.data() + g * head_dim);
        QVERIFY2(std::memcmp(grouped.data(), one.data(), one.size() * sizeof(float)) == 0,
                 qPrintable(QString("head_dim %1, group %2, %3 positions: the grouped heads differ")
                                .arg(head_dim)
                                .arg(group)
                                .arg(n_pos)));
      }
    }
  }
}

QTEST_APPLESS_MAIN(PagedTest)
#include "test_paged.moc"
