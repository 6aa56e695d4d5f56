// Causal grouped-query attention over an fp16 K/V cache: attention_scalar against a plain
// double-precision reference, attention_avx2 against attention_scalar, and split-K decode
// (partials + merge) against the reference. Every case pads the strides and fills the padding,
// the K/V rows past the last position and the scratch buffers' tails with markers, so a read or
// write outside the layout attention.h describes shows up.

#include <QtTest>
#include <bit>
#include <cmath>
#include <cstring>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_features.h"
#include "tests/kernels/kernel_test.h"

using namespace tokenfab::kernels;
using tokenfab::kernels::test::kF32Eps;
using tokenfab::kernels::test::uniform_floats;
using tokenfab::kernels::test::uniform_halves;

namespace {

constexpr uint16_t kNanHalf = 0x7E00;         // K/V padding: any read of it poisons the output
constexpr uint32_t kUntouched = 0x7FC0DEADu;  // out padding and scratch tails: never written

// One problem in the layouts of attention.h: q (n_tokens, q_stride); K/V head-major, row (kv head
// g, position p) at g · kv_head_stride + p · kv_stride, with padding after each row, two NaN rows
// after each head's last position and more padding between heads.
struct AttentionCase {
  int head_dim, n_head, n_kv_head;
  int64_t pos0, n_tokens;
  std::vector<float> q;
  std::vector<uint16_t> k, v;
  AttentionArgs args;  // out left null; set per run
  int64_t n_pos() const { return pos0 + n_tokens; }
  int64_t n_items() const { return n_tokens * n_head; }
};

AttentionCase make_case(int head_dim, int n_head, int n_kv_head, int64_t pos0, int64_t n_tokens) {
  AttentionCase c{head_dim, n_head, n_kv_head, pos0, n_tokens, {}, {}, {}, {}};
  std::mt19937 rng(static_cast<unsigned>(head_dim * 1000 + n_head * 100 + pos0 + n_tokens));
  const int64_t q_stride = int64_t{n_head} * head_dim + 8;
  const int64_t kv_stride = head_dim + 8;
  const int64_t kv_head_stride = (c.n_pos() + 2) * kv_stride + 24;
  // |q| ≤ 4 against |k| ≤ 1 gives scores spread over several units: peaked, not flat, weights.
  c.q = uniform_floats(rng, n_tokens * q_stride, -4.0f, 4.0f);
  c.k.assign(n_kv_head * kv_head_stride, kNanHalf);
  c.v.assign(n_kv_head * kv_head_stride, kNanHalf);
  for (int g = 0; g < n_kv_head; ++g) {
    for (int64_t p = 0; p < c.n_pos(); ++p) {
      const std::vector<uint16_t> k = uniform_halves(rng, head_dim, -1.0f, 1.0f);
      const std::vector<uint16_t> v = uniform_halves(rng, head_dim, -1.0f, 1.0f);
      std::copy(k.begin(), k.end(), c.k.begin() + g * kv_head_stride + p * kv_stride);
      std::copy(v.begin(), v.end(), c.v.begin() + g * kv_head_stride + p * kv_stride);
    }
  }
  c.args = {c.q.data(), q_stride,
            c.k.data(), c.v.data(),
            kv_stride,  kv_head_stride,
            nullptr,    int64_t{n_head} * head_dim + 5,
            n_tokens,   pos0,
            n_head,     n_kv_head,
            head_dim,   1.0f / std::sqrt(static_cast<float>(head_dim))};
  return c;
}

// `floats` floats followed by a marked tail; tail_intact() says whether a kernel wrote past them.
struct GuardedBuffer {
  static constexpr size_t kTail = 16;
  explicit GuardedBuffer(int64_t floats)
      : size(static_cast<size_t>(floats)), data(size + kTail, std::bit_cast<float>(kUntouched)) {}
  bool tail_intact() const {
    for (size_t i = size; i < data.size(); ++i)
      if (std::bit_cast<uint32_t>(data[i]) != kUntouched) return false;
    return true;
  }
  size_t size;
  std::vector<float> data;
};

// The plain definition in double: token t (position pos0 + t) attends to positions 0..pos0 + t
// of kv head h / (n_head / n_kv_head). Also returns, per (token, head), the tolerance an f32
// implementation must meet (|v| ≤ 1 here, so output errors are errors in the weights):
//   scores: f32 dot of head_dim terms, ≤ (head_dim + 2)·u·scale·Σ|q·k|; a score error δ changes
//           each weight by a relative ≤ 2δ, on both sides of the comparison: 3δ with margin;
//   softmax: 8u plus u·|s − max| for rounding s − max (see softmax_matches_formula…);
//   weighted sum: (n_pos + 2)·u.
struct Expected {
  std::vector<double> out;  // (n_tokens, n_head, head_dim)
  std::vector<double> tol;  // (n_tokens, n_head)
};

Expected reference_attention(const AttentionCase& c) {
  const AttentionArgs& a = c.args;
  const int group = c.n_head / c.n_kv_head;
  Expected e;
  e.out.assign(c.n_items() * c.head_dim, 0.0);
  e.tol.resize(c.n_items());
  for (int64_t t = 0; t < c.n_tokens; ++t) {
    for (int h = 0; h < c.n_head; ++h) {
      const float* q = a.q + t * a.q_stride + h * c.head_dim;
      const int64_t kv_off = int64_t{h / group} * a.kv_head_stride;
      const int64_t n = c.pos0 + t + 1;
      std::vector<double> s(n);
      double dot_mag = 0, smax = -INFINITY, smin = INFINITY;
      for (int64_t p = 0; p < n; ++p) {
        double dot = 0, mag = 0;
        for (int d = 0; d < c.head_dim; ++d) {
          const double kd = fp16_to_fp32(a.k[p * a.kv_stride + kv_off + d]);
          dot += q[d] * kd;
          mag += std::fabs(q[d] * kd);
        }
        s[p] = dot * a.scale;
        dot_mag = std::max(dot_mag, mag * a.scale);
        smax = std::max(smax, s[p]);
        smin = std::min(smin, s[p]);
      }
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - smax));
      double* out = e.out.data() + (t * c.n_head + h) * c.head_dim;
      for (int64_t p = 0; p < n; ++p) {
        for (int d = 0; d < c.head_dim; ++d)
          out[d] += s[p] / sum * fp16_to_fp32(a.v[p * a.kv_stride + kv_off + d]);
      }
      e.tol[t * c.n_head + h] = 3 * (c.head_dim + 2) * kF32Eps * dot_mag +
                                (8 + (smax - smin) + static_cast<double>(n + 2)) * kF32Eps;
    }
  }
  return e;
}

using AttentionFn = void (*)(const AttentionArgs&, int64_t, int64_t, float*);

// Runs `fn` over all items in the pieces [0, cuts[0]), [cuts[0], cuts[1]), …, each with its own
// scratch of exactly attention_scratch_floats() floats, whose tail is checked. Returns the out
// buffer (n_tokens, out_stride), or an empty one when a scratch buffer was overrun.
std::vector<float> run_attention(const AttentionCase& c, AttentionFn fn,
                                 std::vector<int64_t> cuts) {
  AttentionArgs a = c.args;
  std::vector<float> out(c.n_tokens * a.out_stride, std::bit_cast<float>(kUntouched));
  a.out = out.data();
  cuts.push_back(c.n_items());
  int64_t begin = 0;
  for (int64_t end : cuts) {
    GuardedBuffer scratch(attention_scratch_floats(a));
    fn(a, begin, end, scratch.data.data());
    if (!scratch.tail_intact()) return {};
    begin = end;
  }
  return out;
}

// Decode (n_tokens = 1) through the split-K pair: every item of attention_decode_partial_* into
// a partials buffer, then attention_decode_merge. Scratch and partials sizes are exactly what
// attention.h asks for, each followed by a checked tail; empty result when either overran.
using DecodePartialFn = void (*)(const AttentionArgs&, int, int64_t, float*, float*);

std::vector<float> run_decode(const AttentionCase& c, DecodePartialFn fn, int n_splits) {
  AttentionArgs a = c.args;
  std::vector<float> out(a.out_stride, std::bit_cast<float>(kUntouched));
  a.out = out.data();
  GuardedBuffer partials(attention_decode_partial_floats(a, n_splits));
  for (int64_t item = 0; item < int64_t{c.n_kv_head} * n_splits; ++item) {
    GuardedBuffer scratch(attention_decode_scratch_floats(a, n_splits));
    fn(a, n_splits, item, partials.data.data(), scratch.data.data());
    if (!scratch.tail_intact() || !partials.tail_intact()) return {};
  }
  attention_decode_merge(a, n_splits, partials.data.data());
  return out;
}

// Two random cut points: three pieces, any of which may be empty.
std::vector<int64_t> random_cuts(int64_t n_items, std::mt19937& rng) {
  std::uniform_int_distribution<int64_t> dist(0, n_items);
  int64_t a = dist(rng), b = dist(rng);
  if (a > b) std::swap(a, b);
  return {a, b};
}

// Compares out (n_tokens, out_stride) with `want` (n_tokens, n_head · head_dim) within
// tol[t · n_head + h] · tol_scale + tol_add, and checks the out padding. Returns "" or the first
// failure.
QString compare_out(const AttentionCase& c, const std::vector<float>& out, const double* want,
                    const std::vector<double>& tol, double tol_scale, double tol_add) {
  if (out.empty()) return "a scratch or partials buffer was overrun";
  const int64_t row = int64_t{c.n_head} * c.head_dim;
  for (int64_t t = 0; t < c.n_tokens; ++t) {
    for (int64_t i = 0; i < c.args.out_stride; ++i) {
      const float got = out[t * c.args.out_stride + i];
      if (i >= row) {
        if (std::bit_cast<uint32_t>(got) != kUntouched)
          return QString("wrote out padding %1").arg(i);
        continue;
      }
      const double w = want[t * row + i];
      const double bound = tol[t * c.n_head + i / c.head_dim] * tol_scale + tol_add;
      if (!(std::fabs(got - w) <= bound)) {
        return QString("token %1 head %2 dim %3: %4, want %5 (tolerance %6)")
            .arg(t)
            .arg(i / c.head_dim)
            .arg(i % c.head_dim)
            .arg(static_cast<double>(got), 0, 'g', 9)
            .arg(w, 0, 'g', 9)
            .arg(bound, 0, 'g', 3);
      }
    }
  }
  return {};
}

// Without AVX2 a test of the AVX2 kernel gets one row, which skips.
void add_attention_rows(bool needs_avx2) {
  QTest::addColumn<int>("head_dim");
  QTest::addColumn<int>("n_head");
  QTest::addColumn<int>("n_kv_head");
  QTest::addColumn<int64_t>("pos0");
  QTest::addColumn<int64_t>("n_tokens");
  if (needs_avx2 && !cpu_features().avx2) {
    QTest::newRow("no AVX2") << 0 << 0 << 0 << int64_t{0} << int64_t{0};
    return;
  }
  const int heads[][2] = {{9, 3}, {4, 4}, {8, 1}};
  for (int head_dim : {32, 64, 96, 128, 256}) {
    for (const auto& h : heads) {
      for (int64_t pos0 : {0, 37}) {
        for (int64_t n_tokens : {1, 5}) {
          QTest::addRow("hd=%d heads=%d/%d pos0=%lld tokens=%lld", head_dim, h[0], h[1],
                        static_cast<long long>(pos0), static_cast<long long>(n_tokens))
              << head_dim << h[0] << h[1] << pos0 << n_tokens;
        }
      }
    }
  }
}

}  // namespace

void KernelTest::attention_scalar_matches_double_reference_data() {
  add_attention_rows(false);
}

void KernelTest::attention_scalar_matches_double_reference() {
  QFETCH(int, head_dim);
  QFETCH(int, n_head);
  QFETCH(int, n_kv_head);
  QFETCH(int64_t, pos0);
  QFETCH(int64_t, n_tokens);
  const AttentionCase c = make_case(head_dim, n_head, n_kv_head, pos0, n_tokens);
  const Expected e = reference_attention(c);
  std::mt19937 rng(1);
  const std::vector<float> out = run_attention(c, attention_scalar, random_cuts(c.n_items(), rng));
  const QString err = compare_out(c, out, e.out.data(), e.tol, 1.0, 0.0);
  QVERIFY2(err.isEmpty(), qPrintable(err));
}

void KernelTest::attention_avx2_matches_scalar_data() {
  add_attention_rows(true);
}

// attention_avx2 against attention_scalar: both are within the reference tolerance of the exact
// result, so within twice it of each other, plus 1e-6 for the polynomial exp (relative < 2e-7
// per weight, |v| ≤ 1). Its results do not depend on how the items are split (bit for bit).
void KernelTest::attention_avx2_matches_scalar() {
  if (!cpu_features().avx2) QSKIP("this CPU has no AVX2 (or TOKENFAB_FORCE_SCALAR=1)");
  QFETCH(int, head_dim);
  QFETCH(int, n_head);
  QFETCH(int, n_kv_head);
  QFETCH(int64_t, pos0);
  QFETCH(int64_t, n_tokens);
  QVERIFY(attention_avx2_supports(head_dim));
  const AttentionCase c = make_case(head_dim, n_head, n_kv_head, pos0, n_tokens);
  const Expected e = reference_attention(c);
  const std::vector<float> scalar = run_attention(c, attention_scalar, {});
  QVERIFY(!scalar.empty());
  const std::vector<double> scalar_d(scalar.begin(), scalar.end());
  // compare_out indexes `want` densely (n_tokens, n_head · head_dim): drop the stride padding.
  std::vector<double> want;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const auto row = scalar_d.begin() + t * c.args.out_stride;
    want.insert(want.end(), row, row + int64_t{n_head} * head_dim);
  }
  const std::vector<float> whole = run_attention(c, attention_avx2, {});
  QString err = compare_out(c, whole, want.data(), e.tol, 2.0, 1e-6);
  QVERIFY2(err.isEmpty(), qPrintable(err));

  std::mt19937 rng(2);
  for (int split = 0; split < 4; ++split) {
    const std::vector<int64_t> cuts = random_cuts(c.n_items(), rng);
    const std::vector<float> parts = run_attention(c, attention_avx2, cuts);
    QVERIFY2(!parts.empty() && std::memcmp(parts.data(), whole.data(), whole.size() * 4) == 0,
             qPrintable(QString("split at %1, %2 changes the result").arg(cuts[0]).arg(cuts[1])));
  }
}

void KernelTest::attention_decode_split_matches_reference_data() {
  QTest::addColumn<int>("head_dim");
  QTest::addColumn<int>("n_head");
  QTest::addColumn<int>("n_kv_head");
  QTest::addColumn<int64_t>("pos0");
  const int heads[][2] = {{9, 3}, {4, 4}, {8, 1}};
  for (int head_dim : {32, 64, 96, 128, 256}) {
    for (const auto& h : heads) {
      for (int64_t pos0 : {0, 5, 37}) {
        QTest::addRow("hd=%d heads=%d/%d pos0=%lld", head_dim, h[0], h[1],
                      static_cast<long long>(pos0))
            << head_dim << h[0] << h[1] << pos0;
      }
    }
  }
}

// Split-K decode, scalar and AVX2 partials, with 1 split, a few, and more splits than positions
// (empty ranges): the merged output against the double reference. The merge rescales each
// split's sums by e^(m_s − m) and divides once: a few more roundings than the one-pass kernels,
// hence twice their tolerance; AVX2 adds 1e-6 for the polynomial exp (as above).
void KernelTest::attention_decode_split_matches_reference() {
  QFETCH(int, head_dim);
  QFETCH(int, n_head);
  QFETCH(int, n_kv_head);
  QFETCH(int64_t, pos0);
  const AttentionCase c = make_case(head_dim, n_head, n_kv_head, pos0, 1);
  const Expected e = reference_attention(c);
  for (int n_splits : {1, 2, 3, 7, 64}) {
    const std::vector<float> scalar = run_decode(c, attention_decode_partial_scalar, n_splits);
    QString err = compare_out(c, scalar, e.out.data(), e.tol, 2.0, 0.0);
    QVERIFY2(err.isEmpty(), qPrintable(QString("scalar, %1 splits: ").arg(n_splits) + err));
    if (!cpu_features().avx2 || !attention_avx2_supports(head_dim)) continue;
    const std::vector<float> avx2 = run_decode(c, attention_decode_partial_avx2, n_splits);
    err = compare_out(c, avx2, e.out.data(), e.tol, 2.0, 1e-6);
    QVERIFY2(err.isEmpty(), qPrintable(QString("avx2, %1 splits: ").arg(n_splits) + err));
  }
}
