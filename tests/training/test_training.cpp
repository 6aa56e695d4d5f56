// Unit tests of draft-head training that need no model: the head loss's analytic gradient against
// central finite differences, and the draft-head and trace file formats (round trips, and
// malformed files refused with a message naming the file and the field).

#include <xxhash.h>
#include <QTemporaryDir>

#include <QtTest>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/common/error.h"
#include "core/gguf/gguf_writer.h"
#include "core/speculative/context_lookup.h"
#include "core/speculative/dense_math.h"
#include "core/speculative/draft_head.h"
#include "core/speculative/draft_length.h"
#include "core/speculative/head_switch.h"
#include "core/training/head_loss.h"
#include "core/training/trace.h"
#include "core/training/trainer.h"

using namespace tokenfab;

namespace {

const std::string kSha(64, 'a');
const std::string kOtherSha = "0123456789abcdef" + std::string(48, 'b');

std::vector<float> random_vector(std::mt19937& rng, size_t n, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// The head loss of head_loss.h, summed over rows, computed plainly in double.
// The loss of head_loss.h for input rows x (m, in_cols), in double: the block's residual adds
// x's first d columns; the hidden-state regression is added when t.hidden_weight > 0.
double reference_loss(const std::vector<double>& w, const std::vector<double>& b,
                      const std::vector<float>& e, const std::vector<float>& x, int64_t d,
                      int64_t in_cols, int64_t v, const HeadTargets& t) {
  const auto m = static_cast<int64_t>(t.label.size());
  double total = 0.0;
  for (int64_t r = 0; r < m; ++r) {
    std::vector<double> z(static_cast<size_t>(d)), logits(static_cast<size_t>(v));
    for (int64_t o = 0; o < d; ++o) {
      double u = b[o];
      for (int64_t i = 0; i < in_cols; ++i) u += w[o * in_cols + i] * x[r * in_cols + i];
      z[o] = x[r * in_cols + o] + u / (1.0 + std::exp(-u));
    }
    double mx = -1e300;
    for (int64_t j = 0; j < v; ++j) {
      for (int64_t i = 0; i < d; ++i) logits[j] += double(e[j * d + i]) * z[i];
      mx = std::max(mx, logits[j]);
    }
    double sum = 0.0;
    for (double l : logits) sum += std::exp(l - mx);
    const double log_z = mx + std::log(sum);
    total += (1.0 - t.kl_weight) * (log_z - logits[t.label[r]]);
    for (int32_t j = 0; j < (t.kl_weight > 0 ? t.top_k : 0); ++j)
      total += double(t.kl_weight) * t.soft_prob[r * t.top_k + j] *
               (log_z - logits[t.soft_index[r * t.top_k + j]]);
    if (t.hidden_weight > 0.0f) {
      double sq = 0.0;
      for (int64_t o = 0; o < d; ++o)
        sq += (z[o] - t.hidden[r * d + o]) * (z[o] - t.hidden[r * d + o]);
      total += double(t.hidden_weight) * sq / double(d);
    }
  }
  return total;
}

// Knobs of a hand-written draft-head file, each breaking one thing.
struct HeadFileSpec {
  std::string architecture = "tokenfab-draft";
  std::string type = "medusa";
  std::string sha = kSha;
  std::string skip_key{};     // metadata key left out
  std::string skip_tensor{};  // tensor left out
  bool bad_weight_shape = false;
  std::string training_config = "{\"steps\": 10}";
};

void write_head_file(const std::filesystem::path& path, const HeadFileSpec& s) {
  constexpr int32_t kHeads = 2, kEmbd = 4;
  gguf::GgufWriter w;
  const auto add = [&](const std::string& key, gguf::Value v) {
    if (key != s.skip_key) w.add(key, std::move(v));
  };
  add("general.architecture", gguf::Value::string(s.architecture));
  add("tokenfab.draft.type", gguf::Value::string(s.type));
  add("tokenfab.draft.name", gguf::Value::string("hand-made"));
  add("tokenfab.draft.domain", gguf::Value::string("code"));
  add("tokenfab.draft.base_model_sha256", gguf::Value::string(s.sha));
  add("tokenfab.draft.n_heads", gguf::Value::i32(kHeads));
  add("tokenfab.draft.n_embd", gguf::Value::i32(kEmbd));
  add("tokenfab.draft.n_vocab", gguf::Value::i32(100));
  add("tokenfab.draft.training_config", gguf::Value::string(s.training_config));
  add("tokenfab.draft.summary", gguf::Value::string("{}"));
  const std::vector<float> weight(kEmbd * (kEmbd + 1), 0.5f), bias(kEmbd, 0.25f);
  const auto bytes = [](const std::vector<float>& v, size_t n) {
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), n * sizeof(float));
  };
  for (int k = 1; k <= kHeads; ++k) {
    const std::string wn = "medusa." + std::to_string(k) + ".weight";
    const std::string bn = "medusa." + std::to_string(k) + ".bias";
    if (wn != s.skip_tensor) {
      if (s.bad_weight_shape && k == 2)
        w.add_tensor(wn, gguf::TensorType::F32, {kEmbd + 1, kEmbd},
                     bytes(weight, kEmbd * (kEmbd + 1)));
      else
        w.add_tensor(wn, gguf::TensorType::F32, {kEmbd, kEmbd}, bytes(weight, kEmbd * kEmbd));
    }
    if (bn != s.skip_tensor) w.add_tensor(bn, gguf::TensorType::F32, {kEmbd}, bytes(bias, kEmbd));
  }
  w.write(path);
}

// Runs `fn`, which must throw Error whose message contains every one of `parts`.
template <typename Fn>
void expect_error(Fn fn, std::initializer_list<std::string> parts) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts)
      QVERIFY2(msg.find(p) != std::string::npos,
               qPrintable(QString("message '%1' lacks '%2'").arg(msg.c_str(), p.c_str())));
    return;
  }
  QFAIL("no Error was thrown");
}

TraceSet random_trace(std::mt19937& rng) {
  TraceSet t;
  t.n_embd = 4;
  t.top_k = 3;
  t.seq_begin = {0, 5, 6, 13};
  const size_t n = 13;
  t.hidden = random_vector(rng, n * 4, 1.0f);
  std::uniform_int_distribution<int> id(0, 999);
  for (size_t i = 0; i < n; ++i) {
    t.pred.push_back(id(rng));
    t.next.push_back(i % 3 == 0 ? id(rng) : t.pred.back());  // some positions off the greedy path
    for (int j = 0; j < 3; ++j) {
      t.topk_ids.push_back(id(rng));
      t.topk_probs.push_back(0.3f / float(j + 1));
    }
  }
  return t;
}

void write_bytes(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), std::streamsize(bytes.size()));
}

std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

}  // namespace

class TrainingTest : public QObject {
  Q_OBJECT

 private slots:
  void dense_kernels_match_reference();
  void gradient_check_data();
  void gradient_check();
  void input_gradient_check();
  void mtp_taps_file_roundtrip_and_root();
  void draft_head_file_roundtrip();
  void mtp_head_file_roundtrip();
  void head_switch_policy();
  void draft_length_policy();
  void chain_stop_rule_keeps_the_drafts_that_pay();
  void context_lookup_finds_latest_longest_match();
  void lookup_branch_merges_into_draft_trees();
  void malformed_head_files_rejected();
  void check_head_matches_refuses_other_models();
  void trace_roundtrip();
  void malformed_trace_files_rejected();
  void mtp_draft_vocabulary_holds_the_labels();

 private:
  QTemporaryDir dir_;
  std::filesystem::path path(const char* name) const {
    return std::filesystem::path(dir_.path().toStdString()) / name;
  }
};

// The GEMMs against plain double loops on shapes that exercise the vector tiles and every tail
// (rows not a multiple of the tile, columns not a multiple of 16 / 3, k not a multiple of 8, k
// over the 256-long slice), and the vectorised exp against std::exp. Run also with
// TOKENFAB_FORCE_SCALAR=1 for the baseline variant.
void TrainingTest::dense_kernels_match_reference() {
  std::mt19937 rng(2);
  struct Shape {
    int64_t m, n, k;
  };
  for (const Shape sh : {Shape{1, 1, 1}, Shape{7, 37, 19}, Shape{13, 50, 600}, Shape{6, 16, 259},
                         Shape{32, 35, 8}}) {
    const std::vector<float> a = random_vector(rng, sh.m * sh.k, 1.0f);
    const std::vector<float> bt = random_vector(rng, sh.n * sh.k, 1.0f);  // (n, k)
    std::vector<float> b(sh.k * sh.n);                                    // (k, n)
    dense::transpose(bt.data(), sh.n, sh.k, sh.k, b.data(), sh.n);
    for (bool accumulate : {false, true}) {
      std::vector<float> c_nt(sh.m * sh.n, 0.5f), c_nn(sh.m * sh.n, 0.5f);
      dense::gemm_nt(sh.m, sh.n, sh.k, a.data(), sh.k, bt.data(), sh.k, c_nt.data(), sh.n,
                     accumulate);
      dense::gemm_nn(sh.m, sh.n, sh.k, a.data(), sh.k, b.data(), sh.n, c_nn.data(), sh.n,
                     accumulate);
      for (int64_t i = 0; i < sh.m; ++i) {
        for (int64_t j = 0; j < sh.n; ++j) {
          double want = accumulate ? 0.5 : 0.0, scale = 1.0;
          for (int64_t p = 0; p < sh.k; ++p) {
            want += double(a[i * sh.k + p]) * bt[j * sh.k + p];
            scale += std::abs(double(a[i * sh.k + p]) * bt[j * sh.k + p]);
          }
          // f32 sums of k products: error below k · 2^-24 of the sum of magnitudes.
          const double tol = 1e-7 * double(sh.k + 1) * scale;
          QVERIFY(std::abs(c_nt[i * sh.n + j] - want) <= tol);
          QVERIFY(std::abs(c_nn[i * sh.n + j] - want) <= tol);
        }
      }
    }
  }
  std::vector<float> x;
  for (int i = 0; i <= 1000; ++i) x.push_back(-86.0f + 86.0f * float(i) / 1000.0f);
  x.push_back(3.5f);
  std::vector<float> e = x;
  QCOMPARE(dense::max_value(x.data(), int64_t(x.size())), 3.5f);
  const double sum = dense::exp_shifted_sum(e.data(), int64_t(e.size()), 1.0f);
  double want_sum = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp(double(x[i] - 1.0f));  // the argument is rounded to f32 first
    want_sum += want;
    QVERIFY2(std::abs(e[i] - want) <= 4e-7 * want,
             qPrintable(QString("exp(%1): %2 vs %3").arg(x[i] - 1.0).arg(e[i]).arg(want)));
  }
  QVERIFY(std::abs(sum - want_sum) <= 1e-6 * want_sum);
}

void TrainingTest::gradient_check_data() {
  QTest::addColumn<float>("kl_weight");
  QTest::addColumn<int>("inputs");  // in_cols = inputs · d: 1 for Medusa, 2 for mtp ([h; e])
  QTest::addColumn<float>("hidden_weight");
  QTest::newRow("medusa, cross-entropy") << 0.0f << 1 << 0.0f;
  QTest::newRow("medusa, mixed with KL to top-k") << 0.4f << 1 << 0.0f;
  QTest::newRow("mtp, cross-entropy and hidden regression") << 0.0f << 2 << 0.7f;
  QTest::newRow("mtp, KL and hidden regression") << 0.4f << 2 << 1.5f;
}

// Tolerance: the analytic gradient runs in f32 (unit roundoff 6e-8, sums of at most 20 terms, the
// vectorised exp within 2e-7), so it agrees with the exact gradient to ~1e-6 relative; central
// differences in double with step 1e-5 err by ~1e-10. 1e-3 leaves a wide margin for roundoff and
// still fails on any wrong term of the backward pass (which gives O(1) relative errors).
void TrainingTest::gradient_check() {
  QFETCH(float, kl_weight);
  QFETCH(int, inputs);
  QFETCH(float, hidden_weight);
  constexpr int64_t d = 8, v = 20, m = 6;
  constexpr int32_t top_k = 3;
  const int64_t in_cols = inputs * d;
  std::mt19937 rng(7);
  const std::vector<float> w = random_vector(rng, d * in_cols, 0.4f),
                           b = random_vector(rng, d, 0.4f);
  const std::vector<float> h = random_vector(rng, m * in_cols, 1.0f),
                           e = random_vector(rng, v * d, 1.0f);
  const std::vector<float> hidden = random_vector(rng, m * d, 1.0f);
  std::vector<TokenId> ids(v);
  for (int j = 0; j < v; ++j) ids[j] = 100 + 3 * j;
  const Shortlist sl = Shortlist::from_rows(ids, e, d);
  std::vector<int32_t> label, soft_index;
  std::vector<float> soft_prob;
  for (int64_t r = 0; r < m; ++r) {
    label.push_back(int32_t((r * 7 + 3) % v));
    for (int j = 0; j < top_k; ++j) {
      soft_index.push_back(int32_t((r * 5 + j * 4) % v));
      soft_prob.push_back(std::array<float, 3>{0.6f, 0.3f, 0.1f}[j]);
    }
  }
  const HeadTargets t{label, soft_index, soft_prob, top_k, kl_weight, hidden.data(), hidden_weight};

  kernels::ThreadPool pool(2);
  HeadLossScratch scratch;
  std::vector<float> dw(d * in_cols, 0.0f), db(d, 0.0f);
  const double loss = head_loss_and_grad(w.data(), b.data(), sl, h.data(), in_cols, m, t, dw.data(),
                                         db.data(), pool, scratch);

  std::vector<double> wd(w.begin(), w.end()), bd(b.begin(), b.end());
  const double ref = reference_loss(wd, bd, e, h, d, in_cols, v, t);
  QVERIFY2(std::abs(loss - ref) <= 1e-5 * std::abs(ref),
           qPrintable(QString("loss %1 vs reference %2").arg(loss).arg(ref)));

  constexpr double eps = 1e-5;
  const auto numeric = [&](std::vector<double>& params, size_t i) {
    const double keep = params[i];
    params[i] = keep + eps;
    const double up = reference_loss(wd, bd, e, h, d, in_cols, v, t);
    params[i] = keep - eps;
    const double down = reference_loss(wd, bd, e, h, d, in_cols, v, t);
    params[i] = keep;
    return (up - down) / (2 * eps);
  };
  double diff2 = 0.0, norm2 = 0.0, worst = 0.0, largest = 0.0;
  const auto compare = [&](std::vector<double>& params, const std::vector<float>& analytic) {
    for (size_t i = 0; i < params.size(); ++i) {
      const double n = numeric(params, i);
      diff2 += (analytic[i] - n) * (analytic[i] - n);
      norm2 += n * n;
      worst = std::max(worst, std::abs(analytic[i] - n));
      largest = std::max(largest, std::abs(n));
    }
  };
  compare(wd, dw);
  compare(bd, db);
  const double rel = std::sqrt(diff2 / norm2);
  qInfo("gradient check: relative error %.3g, worst entry %.3g of %.3g", rel, worst, largest);
  QVERIFY(rel < 1e-3);
  QVERIFY(worst < 1e-3 * largest);
}

void TrainingTest::draft_head_file_roundtrip() {
  DraftHeadInfo info;
  info.name = "code-small";
  info.domain = "code";
  info.base_model_sha256 = kSha;
  info.n_heads = 3;
  info.n_embd = 16;
  info.n_vocab = 100;
  info.training_config_json = R"({"steps": 150, "lr": 0.003})";
  info.summary_json = R"({"accept_per_step": 1.7})";
  DraftHead head = make_medusa_head(info);
  QCOMPARE(head.n_heads(), 3);
  std::mt19937 rng(3);
  for (int k = 0; k < 3; ++k) {
    head.w[k] = random_vector(rng, 16 * 16, 0.2f);
    head.b[k] = random_vector(rng, 16, 0.2f);
  }
  save_draft_head(head, path("head.gguf"));
  const DraftHead back = load_draft_head(path("head.gguf"));
  QCOMPARE(back.info.type, std::string("medusa"));
  QCOMPARE(back.info.name, info.name);
  QCOMPARE(back.info.domain, info.domain);
  QCOMPARE(back.info.base_model_sha256, info.base_model_sha256);
  QCOMPARE(back.info.n_heads, 3);
  QCOMPARE(back.info.n_embd, 16);
  QCOMPARE(back.info.n_vocab, 100);
  QCOMPARE(back.info.training_config_json, info.training_config_json);
  QCOMPARE(back.info.summary_json, info.summary_json);
  QVERIFY(back.w == head.w);
  QVERIFY(back.b == head.b);

  // residual() is h + SiLU(W h + b), computed here plainly in double.
  const std::vector<float> h = random_vector(rng, 3 * 16, 1.0f);
  std::vector<float> z(h.size());
  back.residual(1, h.data(), 3, z.data());
  for (int r = 0; r < 3; ++r) {
    for (int o = 0; o < 16; ++o) {
      double u = back.b[1][o];
      for (int i = 0; i < 16; ++i) u += double(back.w[1][o * 16 + i]) * h[r * 16 + i];
      const double want = h[r * 16 + o] + u / (1 + std::exp(-u));
      QVERIFY(std::abs(z[r * 16 + o] - want) < 1e-5);
    }
  }
  // A fresh head is the base LM head: z = h.
  DraftHead zero = make_medusa_head(info);
  zero.residual(0, h.data(), 3, z.data());
  QVERIFY(z == h);
}

void TrainingTest::mtp_head_file_roundtrip() {
  constexpr int d = 16;
  DraftHeadInfo info;
  info.type = "mtp";
  info.name = "code-mtp";
  info.domain = "code";
  info.base_model_sha256 = kSha;
  info.n_heads = 5;
  info.n_embd = d;
  info.n_vocab = 100;
  DraftHead head = make_mtp_head(info, {42, 7, 99, 7, 0});
  QCOMPARE(head.vocab, (std::vector<TokenId>{0, 7, 42, 99}));  // sorted, deduplicated
  QCOMPARE(head.n_heads(), 5);
  QVERIFY(head.is_mtp());
  std::mt19937 rng(5);
  head.w[0] = random_vector(rng, d * 2 * d, 0.2f);
  head.b[0] = random_vector(rng, d, 0.2f);
  save_draft_head(head, path("mtp.gguf"));
  const DraftHead back = load_draft_head(path("mtp.gguf"));
  QCOMPARE(back.info.type, std::string("mtp"));
  QCOMPARE(back.info.n_heads, 5);
  QCOMPARE(back.vocab, head.vocab);
  QVERIFY(back.w == head.w);
  QVERIFY(back.b == head.b);

  // mtp_step() is h + SiLU(W [h; e] + b), computed here plainly in double.
  const std::vector<float> h = random_vector(rng, 3 * d, 1.0f), e = random_vector(rng, 3 * d, 1.0f);
  std::vector<float> z(h.size());
  back.mtp_step(h.data(), e.data(), 3, z.data());
  for (int r = 0; r < 3; ++r) {
    for (int o = 0; o < d; ++o) {
      double u = back.b[0][o];
      for (int i = 0; i < d; ++i) u += double(back.w[0][o * 2 * d + i]) * h[r * d + i];
      for (int i = 0; i < d; ++i) u += double(back.w[0][o * 2 * d + d + i]) * e[r * d + i];
      const double want = h[r * d + o] + u / (1 + std::exp(-u));
      QVERIFY(std::abs(z[r * d + o] - want) < 1e-5);
    }
  }
  expect_error([&] { make_mtp_head(info, {}); }, {"code-mtp", "vocabulary is empty"});
  expect_error([&] { make_mtp_head(info, {3, 100}); }, {"code-mtp", "token id 100"});
  info.type = "medusa";
  expect_error([&] { make_mtp_head(info, {3}); }, {"code-mtp", "needs type mtp"});
}

// The switching policy of head_switch.h on hand-made acceptance sequences.
void TrainingTest::head_switch_policy() {
  constexpr int32_t w = HeadSwitchPolicy::kWindow;
  DraftHeadInfo info;
  info.n_embd = 4;
  info.n_vocab = 10;
  const auto head = [&](const char* name) {
    info.name = name;
    return std::make_shared<const DraftHead>(make_medusa_head(info));
  };
  const std::vector<HeadCandidate> c = {{head("a"), 3.0}, {head("b"), 2.5}, {head("c"), 1.2}};
  {  // Below 80 % of its record: nothing before a full window, then the best untried candidate.
    HeadSwitchPolicy p(c.size(), 0);
    for (int32_t i = 0; i < w - 1; ++i) QVERIFY(!p.on_step(c, 1));
    QCOMPARE(p.on_step(c, 1), std::optional<size_t>(1));
    QCOMPARE(p.current(), size_t{1});
    QCOMPARE(p.live_at_last_switch(), 1.0);
    // "b" at 1.5 live < 0.8 · 2.5: "c" (1.2) is not above live, "a" was tried: it stays.
    for (int32_t i = 0; i < 3 * w; ++i) QVERIFY(!p.on_step(c, i % 2 == 0 ? 1 : 2));
    QCOMPARE(p.current(), size_t{1});
  }
  {  // At its record (a window mean of 2.5 ≥ 0.8 · 3.0): no switch.
    HeadSwitchPolicy p(c.size(), 0);
    for (int32_t i = 0; i < 4 * w; ++i) QVERIFY(!p.on_step(c, i % 2 == 0 ? 2 : 3));
  }
  {  // The window slides: a good start does not hide a poor stretch.
    HeadSwitchPolicy p(c.size(), 0);
    for (int32_t i = 0; i < w; ++i) QVERIFY(!p.on_step(c, 4));
    std::optional<size_t> to;
    int32_t steps = 0;
    while (!to && steps < 4 * w) {
      to = p.on_step(c, 1);
      ++steps;
    }
    QCOMPARE(to, std::optional<size_t>(1));
    QVERIFY(p.live_at_last_switch() < HeadSwitchPolicy::kRatio * 3.0);
  }
}

// The cost table interpolates between measured row counts; the policy measures both ends first,
// then picks the length with the most expected tokens per second, and probes the unused end every
// kProbeEvery decisions.
void TrainingTest::draft_length_policy() {
  const StepCostTable kFree;  // proposals: nothing measured (counted as free)
  StepCostTable costs;
  QVERIFY(!costs.estimate(3));
  costs.record(1, 1.0);
  costs.record(5, 3.0);
  QCOMPARE(*costs.estimate(3), 2.0);        // halfway between 1 and 5
  QCOMPARE(*costs.estimate(8), 4.8);        // beyond: in proportion to the rows
  QCOMPARE(*costs.floor_estimate(3), 1.0);  // the nearest measured count below
  QVERIFY(!costs.floor_estimate(0));
  {
    StepCostTable proposals;
    proposals.record(4, 2.0);
    QCOMPARE(*proposals.linear_estimate(1), 0.5);  // below the smallest: in proportion
    QCOMPARE(*proposals.linear_estimate(6), 3.0);
  }
  costs.record(5, 5.0);  // the average moves a quarter of the way
  QCOMPARE(*costs.measured(5), 3.5);

  // A table with these (rows, seconds) measured.
  const auto table = [](std::initializer_list<std::pair<int32_t, double>> measured) {
    StepCostTable t;
    for (const auto& [rows, seconds] : measured) t.record(rows, seconds);
    return t;
  };
  const auto counts = [](std::vector<double> p, int64_t n) {
    std::pair<std::vector<int64_t>, std::vector<int64_t>> c;  // proposed, accepted
    for (double x : p) {
      c.first.push_back(n);
      c.second.push_back(static_cast<int64_t>(x * static_cast<double>(n)));
    }
    return c;
  };
  {  // Unmeasured ends are measured first: the plain step, then the longest.
    DraftLengthPolicy policy(4);
    StepCostTable empty;
    QCOMPARE(policy.choose({}, {}, empty, kFree, 0), 0);
    empty.record(1, 0.01);
    QCOMPARE(policy.choose({}, {}, empty, kFree, 0), 4);
    // With no acceptance data every P_i is 1/2 (smoothed, non-increasing).
    QCOMPARE(policy.acceptance(), (std::vector<double>{0.5, 0.5, 0.5, 0.5}));
    // In a batch (15 other rows) steps are never exactly 16 or 20 rows: any count on each side
    // will do. Only larger steps measured: the plain end first.
    StepCostTable batch;
    batch.record(40, 2.0);
    QVERIFY(!batch.measured_at_or_below(16) && batch.measured_at_or_above(20));
    QCOMPARE(policy.choose({}, {}, batch, kFree, 15), 0);
    batch.record(12, 1.0);  // both sides known: the choice comes from the estimates
    const auto [proposed, accepted] = std::pair<std::vector<int64_t>, std::vector<int64_t>>{
        {1000, 1000, 1000, 1000}, {10, 5, 2, 1}};
    QCOMPARE(policy.choose(proposed, accepted, batch, kFree, 15), 0);
  }
  {  // Rows nearly free (a bandwidth-bound device) and good acceptance: the longest chain.
    const StepCostTable c = table({{1, 1.0}, {5, 1.1}});
    DraftLengthPolicy policy(4);
    const auto [proposed, accepted] = counts({0.9, 0.8, 0.7, 0.6}, 1000);
    QCOMPARE(policy.choose(proposed, accepted, c, kFree, 0), 4);
    // The same with proposals that cost a plain step per draft (1, 2, … seconds): E(1) = 1.9
    // in 1.025 + 1 seconds is worse than 1 token in 1, and longer chains only add to it.
    const StepCostTable dear = table({{1, 1.0}, {4, 4.0}});
    QCOMPARE(policy.choose(proposed, accepted, c, dear, 0), 0);
  }
  {  // Each row costing most of a step (a compute-bound CPU) and acceptance 0.6, 0.4, …: a row
     // count not measured yet counts at the cost of the nearest measured one below, so each
     // longer step is tried while that looks better than a plain one, then plain steps
     // (E(k) / t(1 + k) largest at k = 0 once measured: 1/1 against 1.6/1.7, 2.0/2.4, …).
    StepCostTable c = table({{1, 1.0}, {5, 3.8}});
    DraftLengthPolicy policy(4);
    const auto [proposed, accepted] = counts({0.6, 0.4, 0.3, 0.2}, 1000);
    QCOMPARE(policy.choose(proposed, accepted, c, kFree, 0), 3);  // 2.3 / 1.0: 2–4 rows untried
    c.record(4, 3.1);
    QCOMPARE(policy.choose(proposed, accepted, c, kFree, 0), 2);  // 2.0 / 1.0
    c.record(3, 2.4);
    QCOMPARE(policy.choose(proposed, accepted, c, kFree, 0), 1);  // 1.6 / 1.0
    c.record(2, 1.7);
    QCOMPARE(policy.choose(proposed, accepted, c, kFree, 0), 0);  // all measured: 1.6 / 1.7 < 1
    // The same acceptance at a cost of 0.2 per extra row, only the ends measured: 3 drafts (2.3
    // tokens) look best at the floor cost of 1.0; measured at 1.6, the choice stays 3
    // (E(k)/t = 1, 1.33, 1.43, 1.44, 1.39 on the straight line).
    StepCostTable cheap = table({{1, 1.0}, {5, 1.8}});
    QCOMPARE(policy.choose(proposed, accepted, cheap, kFree, 0), 3);
    cheap.record(2, 1.2);
    cheap.record(3, 1.4);
    cheap.record(4, 1.6);
    QCOMPARE(policy.choose(proposed, accepted, cheap, kFree, 0), 3);
    // A step bound by memory: 2 rows cost what 1 does, more rows more. Measured, one draft
    // (1.6 / 1.0) is the best; a straight line from 1 row (1.0) to 5 (2.0) would have put 2 rows
    // at 1.25 and chosen two drafts (2.0 / 1.5).
    const StepCostTable bound = table({{1, 1.0}, {2, 1.0}, {3, 1.5}, {4, 1.8}, {5, 2.0}});
    QCOMPARE(policy.choose(proposed, accepted, bound, kFree, 0), 1);
    // In a batch the other sequences' 3 rows are the base: from 4 rows (1.6) to 8 (1.8) a row
    // costs 0.05. With 5–7 rows untried at the floor of 1.6, 3 drafts come first (2.3 / 1.6);
    // 7 rows measured at 1.75, the longest chain wins (2.5 / 1.8 against 2.3 / 1.75).
    StepCostTable batch = table({{4, 1.6}, {8, 1.8}});
    QCOMPARE(policy.choose(proposed, accepted, batch, kFree, 3), 3);
    batch.record(7, 1.75);
    QCOMPARE(policy.choose(proposed, accepted, batch, kFree, 3), 4);
  }
  {  // Measured acceptance is monotone: a deeper position cannot be likelier than a shallower.
    const StepCostTable c = table({{1, 1.0}, {5, 1.0}});
    DraftLengthPolicy policy(4);
    policy.choose({100, 100, 100, 100}, {10, 90, 90, 90}, c, kFree, 0);
    for (double p : policy.acceptance()) QVERIFY(p <= 11.0 / 102.0 + 1e-12);
  }
  {  // Probes: every kProbeEvery decisions the end not in use.
    const StepCostTable c = table({{1, 1.0}, {2, 1.7}, {3, 2.4}, {4, 3.1}, {5, 3.8}});
    DraftLengthPolicy policy(4);
    const auto [proposed, accepted] = counts({0.6, 0.4, 0.3, 0.2}, 1000);
    std::vector<int32_t> chosen;
    for (int32_t i = 0; i < 2 * DraftLengthPolicy::kProbeEvery; ++i)
      chosen.push_back(policy.choose(proposed, accepted, c, kFree, 0));
    QCOMPARE(std::count(chosen.begin(), chosen.end(), 4), 1);
    QCOMPARE(chosen[DraftLengthPolicy::kProbeEvery - 1], 4);
    QCOMPARE(std::count(chosen.begin(), chosen.end(), 0), 2 * DraftLengthPolicy::kProbeEvery - 1);
  }
}

// A chain's confidence stop keeps a draft after the first when its expected acceptance q (the
// head's path probability, calibrated) raises the expected tokens per second of the verifying
// step: q · C ≥ E · Δ, with C the step's cost so far, E the tokens expected from it and Δ the
// extra row.
void TrainingTest::chain_stop_rule_keeps_the_drafts_that_pay() {
  const auto table = [](std::initializer_list<std::pair<int32_t, double>> measured) {
    StepCostTable t;
    for (const auto& [rows, seconds] : measured) t.record(rows, seconds);
    return t;
  };
  const StepCostTable kFree;  // proposals: nothing measured (counted as free)
  using V = DraftVerdict;
  {  // Nothing measured: every draft is kept, so that its cost gets measured; the last at max.
    const StepCostTable none;
    ChainStopRule rule(none, kFree, 0, 3, 1.0);
    QCOMPARE(rule.judge(0.01), V::kKeep);
    QCOMPARE(rule.judge(0.001), V::kKeep);
    QCOMPARE(rule.judge(0.0001), V::kKeepLast);
    QCOMPARE(rule.kept(), 3);
    QCOMPARE(rule.steps(), 3);
  }
  {  // Rows nearly free (5 rows cost 1.1, one 1.0; 2 rows untried count as 1): even an unlikely
     // draft is kept.
    const StepCostTable cheap = table({{1, 1.0}, {5, 1.1}});
    ChainStopRule rule(cheap, kFree, 0, 4, 1.0);
    QCOMPARE(rule.judge(0.05), V::kKeep);
  }
  // Each row 0.3 of a 1.0 plain step (a compute-bound CPU).
  const StepCostTable dear = table({{1, 1.0}, {2, 1.3}, {3, 1.6}, {4, 1.9}, {5, 2.2}});
  {  // The first draft is always kept (drafting was the length policy's choice); a second draft
     // as unlikely as 0.1 is not: 0.1 · 1.3 < 1.2 · 0.3.
    ChainStopRule rule(dear, kFree, 0, 4, 1.0);
    QCOMPARE(rule.judge(0.2), V::kKeep);
    QCOMPARE(rule.judge(0.1), V::kDrop);
    QCOMPARE(rule.kept(), 1);
  }
  {
    ChainStopRule rule(dear, kFree, 0, 4, 1.0);
    QCOMPARE(rule.judge(0.5), V::kKeep);  // 0.5 · 1.0 ≥ 0.3; E = 1.5
    QCOMPARE(rule.judge(0.3), V::kDrop);  // 0.3 · 1.3 = 0.39 < 1.5 · 0.3
    QCOMPARE(rule.kept_probabilities(), std::vector<double>{0.5});
    QCOMPARE(rule.steps(), 2);
  }
  {
    ChainStopRule rule(dear, kFree, 0, 4, 1.0);
    QCOMPARE(rule.judge(0.5), V::kKeep);
    QCOMPARE(rule.judge(0.4), V::kKeep);  // 0.4 · 1.3 = 0.52 ≥ 0.45
  }
  {  // Draft steps cost 0.1 each: after a likely draft the next step is drafted; after a less
     // likely one, a next draft as likely would not pay for its row and its step:
     // 0.5 · (1.6 + 0.2) = 0.9 < 2.4 · (0.3 + 0.1).
    const StepCostTable steps = table({{4, 0.4}});
    ChainStopRule rule(dear, steps, 0, 4, 1.0);
    QCOMPARE(rule.judge(0.9), V::kKeep);      // 0.9 · 1.1 ≥ 0.3; 0.9 · 1.4 ≥ 1.9 · 0.4
    QCOMPARE(rule.judge(0.5), V::kKeepLast);  // 0.5 · 1.5 ≥ 1.9 · 0.3, then as above
    QCOMPARE(rule.kept(), 2);
    // An unlikely first draft is kept, but no second is drafted: 0.2 · 1.4 < 1.2 · 0.4.
    ChainStopRule unlikely(dear, steps, 0, 4, 1.0);
    QCOMPARE(unlikely.judge(0.2), V::kKeepLast);
  }
  {  // In a batch the other rows are the base: 3 others, a plain step of 4 rows.
    const StepCostTable batch = table({{4, 2.0}, {5, 2.1}, {6, 2.2}});
    ChainStopRule rule(batch, kFree, 3, 4, 1.0);
    QCOMPARE(rule.judge(0.1), V::kKeep);  // 0.1 · 2.0 ≥ 1 · 0.1
  }
  {  // Calibration: the head's record scales its probabilities.
    QCOMPARE(ChainStopRule::calibration(0, 0.0), 1.0);
    QCOMPARE(ChainStopRule::calibration(10, 20.0), 12.0 / 22.0);
    QCOMPARE(ChainStopRule::calibration(100, 2.0), 4.0);   // clamped
    QCOMPARE(ChainStopRule::calibration(0, 100.0), 0.25);  // clamped
    // Second drafts of path probability 0.6 and 0.25: as given, 0.6 · 1.3 ≥ 1.5 · 0.3 is kept and
    // 0.25 · 1.3 < 1.3 · 0.3 is not; halved, 0.3 · 1.3 < 1.5 · 0.3 is dropped; doubled,
    // 0.5 · 1.3 ≥ 1.6 · 0.3 is kept.
    const auto second = [&](double calibration, double first, double p) {
      ChainStopRule rule(dear, kFree, 0, 4, calibration);
      rule.judge(first);
      return rule.judge(p);
    };
    QCOMPARE(second(1.0, 0.5, 0.6), V::kKeep);
    QCOMPARE(second(1.0, 0.3, 0.25), V::kDrop);
    QCOMPARE(second(0.5, 1.0, 0.6), V::kDrop);
    QCOMPARE(second(2.0, 0.3, 0.25), V::kKeep);
  }
}

void TrainingTest::context_lookup_finds_latest_longest_match() {
  using V = std::vector<TokenId>;
  const auto lookup = [](const V& context, int32_t max_ngram, int32_t length) {
    return lookup_continuation(context, max_ngram, length);
  };
  // Suffix "2 3": the latest earlier occurrence (at 5) wins over the first (at 1).
  QCOMPARE(lookup({1, 2, 3, 4, 2, 3, 5, 6, 2, 3}, 2, 3), (V{5, 6, 2}));
  // The longest suffix that recurs wins: "7 2 3" recurs (at 1), so its continuation (4) is taken
  // over the later "2 3" (at 5, followed by 5).
  QCOMPARE(lookup({7, 2, 3, 4, 2, 3, 5, 9, 7, 2, 3}, 3, 2), (V{4, 2}));
  // With max_ngram 2 the same context takes the latest "2 3".
  QCOMPARE(lookup({7, 2, 3, 4, 2, 3, 5, 9, 7, 2, 3}, 2, 2), (V{5, 9}));
  // Falls back to one token when no longer suffix recurs.
  QCOMPARE(lookup({5, 1, 6, 8, 1}, 3, 4), (V{6, 8, 1}));
  // A run: the occurrence may overlap the suffix; the continuation stops at the context's end.
  QCOMPARE(lookup({4, 4, 4}, 2, 5), (V{4}));
  QCOMPARE(lookup({1, 2, 1, 2, 1, 2}, 4, 4), (V{1, 2}));
  // Nothing to copy: no recurring suffix, or fewer than two tokens.
  QVERIFY(lookup({1, 2, 3, 4}, 3, 4).empty());
  QVERIFY(lookup({9}, 3, 4).empty());
  QVERIFY(lookup({}, 3, 4).empty());
}

void TrainingTest::lookup_branch_merges_into_draft_trees() {
  using V = std::vector<TokenId>;
  using P = std::vector<int32_t>;
  {  // A branch the chain already holds adds nothing; one that extends it keeps a chain.
    V draft = {5, 6, 7};
    P parent;
    QCOMPARE(merge_draft_branch(draft, parent, V{5, 6}, 64), 0);
    QCOMPARE(merge_draft_branch(draft, parent, V{5, 6, 7, 8, 9}, 64), 2);
    QCOMPARE(draft, (V{5, 6, 7, 8, 9}));
    QVERIFY(parent.empty());
  }
  {  // Without a head's draft the branch is the chain.
    V draft;
    P parent;
    QCOMPARE(merge_draft_branch(draft, parent, V{3, 4}, 64), 2);
    QCOMPARE(draft, (V{3, 4}));
    QVERIFY(parent.empty());
  }
  {  // A branch that leaves the chain after one token turns it into a tree sharing that token.
    V draft = {5, 6, 7};
    P parent;
    QCOMPARE(merge_draft_branch(draft, parent, V{5, 8, 9}, 64), 2);
    QCOMPARE(draft, (V{5, 6, 7, 8, 9}));
    QCOMPARE(parent, (P{-1, 0, 1, 0, 3}));
  }
  {  // In a tree the shared path is found through the parents; the cap bounds what is added.
    V draft = {1, 2, 3, 4};  // root → 1, 2; 1 → 3; 2 → 4
    P parent = {-1, -1, 0, 1};
    V d = draft;
    P p = parent;
    QCOMPARE(merge_draft_branch(d, p, V{2, 4, 7, 8}, 64), 2);
    QCOMPARE(d, (V{1, 2, 3, 4, 7, 8}));
    QCOMPARE(p, (P{-1, -1, 0, 1, 3, 4}));
    d = draft;
    p = parent;
    QCOMPARE(merge_draft_branch(d, p, V{9, 8}, 5), 1);
    QCOMPARE(d, (V{1, 2, 3, 4, 9}));
    QCOMPARE(p, (P{-1, -1, 0, 1, -1}));
    QCOMPARE(merge_draft_branch(d, p, V{6}, 5), 0);  // full
  }
  // Random trees and branches: the original nodes are untouched, parents stay earlier, no two
  // siblings share a token that the merge created, and the branch's first tokens (as many as
  // fitted) are a path from the root.
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    V draft;
    P parent;
    const int n = static_cast<int>(rng() % 12);
    const bool chain = rng() % 3 == 0;
    for (int i = 0; i < n; ++i) {
      draft.push_back(static_cast<TokenId>(rng() % 3));
      if (!chain) parent.push_back(static_cast<int32_t>(rng() % static_cast<unsigned>(i + 1)) - 1);
    }
    // Distinct sibling tokens, as heads draft them (a chain trivially has them).
    if (!chain) {
      std::vector<std::pair<int32_t, TokenId>> seen;
      for (int i = 0; i < n; ++i) {
        while (std::find(seen.begin(), seen.end(), std::pair{parent[i], draft[i]}) != seen.end())
          draft[i] += 3;
        seen.emplace_back(parent[i], draft[i]);
      }
    }
    V branch;
    for (int j = 0, len = 1 + static_cast<int>(rng() % 6); j < len; ++j)
      branch.push_back(static_cast<TokenId>(rng() % 3));
    const int32_t cap = 4 + static_cast<int32_t>(rng() % 14);
    const V before = draft;
    const P before_parent = parent;
    const int32_t added = merge_draft_branch(draft, parent, branch, cap);
    QCOMPARE(static_cast<int32_t>(draft.size()), n + added);
    QVERIFY(added == 0 || static_cast<int32_t>(draft.size()) <= cap);
    QVERIFY(std::equal(before.begin(), before.end(), draft.begin()));
    P full = parent;  // parents in tree form, chain or not
    if (full.empty())
      for (size_t i = 0; i < draft.size(); ++i) full.push_back(static_cast<int32_t>(i) - 1);
    if (!parent.empty() && !before_parent.empty())
      QVERIFY(std::equal(before_parent.begin(), before_parent.end(), parent.begin()));
    for (size_t i = 0; i < full.size(); ++i) QVERIFY(full[i] >= -1 && full[i] < int32_t(i));
    // Follow the branch from the root as far as the tree holds it.
    int32_t node = -1;
    size_t depth = 0;
    for (; depth < branch.size(); ++depth) {
      int32_t next = -1;
      for (size_t i = 0; i < draft.size() && next < 0; ++i)
        if (full[i] == node && draft[i] == branch[depth]) next = static_cast<int32_t>(i);
      if (next < 0) break;
      node = next;
    }
    // Either the whole branch is there, or the tree is full.
    QVERIFY(depth == branch.size() || static_cast<int32_t>(draft.size()) >= cap);
  }
}

void TrainingTest::malformed_head_files_rejected() {
  const std::string f = path("bad.gguf").string();
  write_head_file(f, {});
  QCOMPARE(load_draft_head(f).info.name, std::string("hand-made"));  // the spec itself is valid

  expect_error(
      [&] {
        write_head_file(f, {.architecture = "llama"});
        load_draft_head(f);
      },
      {f, "general.architecture", "llama"});
  expect_error(
      [&] {
        write_head_file(f, {.type = "mtp"});  // Medusa tensors under the mtp type
        load_draft_head(f);
      },
      {f, "missing tensor mtp.weight"});
  expect_error(
      [&] {
        write_head_file(f, {.type = "eagle"});
        load_draft_head(f);
      },
      {f, "type 'eagle' is not supported (expected medusa or mtp)"});
  expect_error(
      [&] {
        write_head_file(f, {.sha = "1234"});
        load_draft_head(f);
      },
      {f, "base_model_sha256"});
  expect_error(
      [&] {
        write_head_file(f, {.skip_key = "tokenfab.draft.n_vocab"});
        load_draft_head(f);
      },
      {f, "tokenfab.draft.n_vocab"});
  expect_error(
      [&] {
        write_head_file(f, {.skip_tensor = "medusa.2.bias"});
        load_draft_head(f);
      },
      {f, "medusa.2.bias"});
  expect_error(
      [&] {
        write_head_file(f, {.bad_weight_shape = true});
        load_draft_head(f);
      },
      {f, "medusa.2.weight", "shape"});
  expect_error(
      [&] {
        write_head_file(f, {.training_config = "[1, 2"});
        load_draft_head(f);
      },
      {f, "training_config"});
  // Not GGUF at all, and a valid file cut short.
  write_bytes(f, "this is not a draft head");
  expect_error([&] { load_draft_head(f); }, {f});
  write_head_file(f, {});
  const std::string whole = read_bytes(f);
  write_bytes(f, whole.substr(0, whole.size() - 20));
  expect_error([&] { load_draft_head(f); }, {f});
}

void TrainingTest::check_head_matches_refuses_other_models() {
  DraftHeadInfo info;
  info.name = "prose";
  info.base_model_sha256 = kOtherSha;
  info.n_embd = 576;
  info.n_vocab = 49152;
  check_head_matches(info, kOtherSha, 576, 49152, "SmolLM2");  // its own model: accepted
  expect_error(
      [&] { check_head_matches(info, kSha, 576, 49152, "SmolLM2"); },
      {"head 'prose' was trained for model 0123456789ab…, not for SmolLM2 (aaaaaaaaaaaa…)"});
  expect_error([&] { check_head_matches(info, kOtherSha, 960, 49152, "SmolLM2-360M"); },
               {"head 'prose'", "n_embd 576"});
}

void TrainingTest::trace_roundtrip() {
  std::mt19937 rng(11);
  const TraceSet t = random_trace(rng);
  t.save(path("t.trace"));
  const TraceSet back = TraceSet::load(path("t.trace"));
  QCOMPARE(back.n_embd, 4);
  QCOMPARE(back.top_k, 3);
  QVERIFY(back.hidden == t.hidden);
  QVERIFY(back.pred == t.pred);
  QVERIFY(back.next == t.next);
  QVERIFY(back.topk_ids == t.topk_ids);
  QVERIFY(back.topk_probs == t.topk_probs);
  QVERIFY(back.seq_begin == t.seq_begin);
  // Saved under a temporary name of its own, then renamed: no temporary file stays behind, and a
  // save that cannot finish throws Error naming the file (never a filesystem_error) and leaves
  // none either.
  const auto temporary_files = [&] {
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir_.path().toStdString()))
      n += e.path().filename().string().find(".tmp-") != std::string::npos;
    return n;
  };
  QCOMPARE(temporary_files(), 0);
  // Writers of one file at once (a CLI and the app tracing the same data) never share a temporary
  // file: each save succeeds, and the file that stays is one of them, whole.
  {
    std::atomic<int> failures{0};
    std::vector<std::thread> writers;
    for (int w = 0; w < 4; ++w)
      writers.emplace_back([&] {
        for (int i = 0; i < 5; ++i) {
          try {
            t.save(path("shared.trace"));
          } catch (const std::exception&) {
            ++failures;
          }
        }
      });
    for (std::thread& w : writers) w.join();
    QCOMPARE(failures.load(), 0);
    QVERIFY(TraceSet::load(path("shared.trace")).hidden == t.hidden);
  }
  QCOMPARE(temporary_files(), 0);
  std::filesystem::create_directory(path("taken.trace"));  // a folder holds the name
  expect_error([&] { t.save(path("taken.trace")); }, {"taken.trace", "rename"});
  expect_error([&] { t.save(path("no-such-folder") / "t.trace"); }, {"no-such-folder"});
  QCOMPARE(temporary_files(), 0);

  const std::vector<int64_t> ends = t.sequence_ends();
  QCOMPARE(ends[0], int64_t(5));
  QCOMPARE(ends[5], int64_t(6));
  QCOMPARE(ends[12], int64_t(13));

  TraceSet joined;
  joined.append(t);
  joined.append(t);
  QCOMPARE(joined.n_pos(), int64_t(26));
  QVERIFY((joined.seq_begin == std::vector<int64_t>{0, 5, 6, 13, 18, 19, 26}));
  TraceSet other = t;
  other.top_k = 2;
  expect_error([&] { joined.append(other); }, {"top_k"});

  TraceSet empty;
  empty.n_embd = 4;
  empty.save(path("empty.trace"));
  QCOMPARE(TraceSet::load(path("empty.trace")).n_pos(), int64_t(0));

  // A version 1 file (written before next existed: the same bytes without the next array)
  // loads with next = pred, which is what its greedy continuations read.
  std::string v1 = read_bytes(path("t.trace"));
  const size_t n = size_t(t.n_pos());
  const size_t next_at = 40 + (size_t(t.n_sequences()) + 1) * 8 + n * 4 * 4 + n * 4;
  v1.erase(next_at, n * 4);
  v1.resize(v1.size() - 8);
  const uint32_t version = 1;
  std::memcpy(v1.data() + 8, &version, 4);
  const uint64_t sum = XXH64(v1.data(), v1.size(), 0);
  v1.append(reinterpret_cast<const char*>(&sum), 8);
  write_bytes(path("v1.trace"), v1);
  const TraceSet old = TraceSet::load(path("v1.trace"));
  QVERIFY(old.pred == t.pred);
  QVERIFY(old.next == t.pred);
  QVERIFY(old.hidden == t.hidden && old.topk_probs == t.topk_probs);

  QVERIFY(t.greedy_path(1, 3));  // positions 1 and 2 continue greedily, 0 and 3 were drawn
  QCOMPARE(t.greedy_path(0, 3), t.greedy_at(0));

  // Layer taps (version 3): two taps of n_embd at each position travel with the rest.
  TraceSet tapped = t;
  tapped.n_taps = 2;
  tapped.taps = random_vector(rng, size_t(t.n_pos()) * 2 * 4, 1.0f);
  tapped.save(path("taps.trace"));
  const TraceSet tapped_back = TraceSet::load(path("taps.trace"));
  QCOMPARE(tapped_back.n_taps, 2);
  QVERIFY(tapped_back.taps == tapped.taps);
  QVERIFY(tapped_back.hidden == t.hidden && tapped_back.next == t.next);
  expect_error([&] { joined.append(tapped); }, {"layer taps"});
  TraceSet short_taps = tapped;
  short_taps.taps.pop_back();
  expect_error([&] { short_taps.validate("taps"); }, {"taps", "do not match"});
  std::string v2 = read_bytes(path("taps.trace"));  // a version 2 file cannot hold taps
  const uint32_t two = 2;
  std::memcpy(v2.data() + 8, &two, 4);
  write_bytes(path("v2.trace"), v2);
  expect_error([&] { TraceSet::load(path("v2.trace")); }, {"v2.trace", "version 2"});
}

// dloss/dx[:, :n_embd] of head_loss_and_grad (what an mtp head's taps fusion backpropagates
// through) against central differences of the reference loss, for the first rows only; the
// tolerances are gradient_check's.
void TrainingTest::input_gradient_check() {
  constexpr int64_t d = 8, v = 20, m = 6, in_cols = 2 * d, dx_rows = 4;
  std::mt19937 rng(13);
  const std::vector<float> w = random_vector(rng, d * in_cols, 0.4f),
                           b = random_vector(rng, d, 0.4f);
  std::vector<float> x = random_vector(rng, m * in_cols, 1.0f);
  const std::vector<float> e = random_vector(rng, v * d, 1.0f),
                           hidden = random_vector(rng, m * d, 1.0f);
  std::vector<TokenId> ids(v);
  for (int j = 0; j < v; ++j) ids[j] = 2 * j;
  const Shortlist sl = Shortlist::from_rows(ids, e, d);
  std::vector<int32_t> label;
  for (int64_t r = 0; r < m; ++r) label.push_back(int32_t((r * 7 + 3) % v));
  const HeadTargets t{label, {}, {}, 0, 0.0f, hidden.data(), 0.9f};
  kernels::ThreadPool pool(2);
  HeadLossScratch scratch;
  std::vector<float> dw(d * in_cols, 0.0f), db(d, 0.0f), dx(dx_rows * d, 0.0f);
  head_loss_and_grad(w.data(), b.data(), sl, x.data(), in_cols, m, t, dw.data(), db.data(), pool,
                     scratch, dx.data(), dx_rows);
  const std::vector<double> wd(w.begin(), w.end()), bd(b.begin(), b.end());
  constexpr double eps = 1e-3;  // x is f32: the step must stay far above its roundoff
  double diff2 = 0.0, norm2 = 0.0;
  for (int64_t r = 0; r < dx_rows; ++r) {
    for (int64_t j = 0; j < d; ++j) {
      float& xi = x[size_t(r * in_cols + j)];
      const float keep = xi;
      xi = keep + float(eps);
      const double up = reference_loss(wd, bd, e, x, d, in_cols, v, t);
      xi = keep - float(eps);
      const double down = reference_loss(wd, bd, e, x, d, in_cols, v, t);
      xi = keep;
      const double n = (up - down) / (2 * eps);
      diff2 += (dx[size_t(r * d + j)] - n) * (dx[size_t(r * d + j)] - n);
      norm2 += n * n;
    }
  }
  const double rel = std::sqrt(diff2 / norm2);
  qInfo("input gradient check: relative error %.3g", rel);
  QVERIFY(rel < 1e-3);
}

// An mtp head with layer taps: the fusion's tensors and the tapped layers survive a round trip,
// and mtp_root is h + W_f [t_1; t_2] + b_f (computed here plainly in double); a Medusa head or
// unordered layers are refused.
void TrainingTest::mtp_taps_file_roundtrip_and_root() {
  constexpr int d = 8;
  DraftHeadInfo info;
  info.type = "mtp";
  info.name = "tapped";
  info.base_model_sha256 = kSha;
  info.n_heads = 3;
  info.n_embd = d;
  info.n_vocab = 50;
  info.taps = {1, 3};
  DraftHead head = make_mtp_head(info, {1, 2, 3});
  QCOMPARE(head.feature_width(), int64_t(3 * d));
  QCOMPARE(head.fuse_w.size(), size_t(2 * d * d));
  std::mt19937 rng(17);
  head.w[0] = random_vector(rng, 2 * d * d, 0.2f);
  head.fuse_w = random_vector(rng, 2 * d * d, 0.3f);
  head.fuse_b = random_vector(rng, d, 0.3f);
  save_draft_head(head, path("tapped.gguf"));
  const DraftHead back = load_draft_head(path("tapped.gguf"));
  QVERIFY(back.info.taps == info.taps);
  QVERIFY(back.fuse_w == head.fuse_w && back.fuse_b == head.fuse_b && back.w == head.w);

  const std::vector<float> f = random_vector(rng, 2 * 3 * d, 1.0f);  // two feature rows
  std::vector<float> g(2 * d);
  back.mtp_root(f.data(), 2, g.data());
  for (int r = 0; r < 2; ++r) {
    for (int o = 0; o < d; ++o) {
      double want = f[r * 3 * d + o] + back.fuse_b[o];
      for (int i = 0; i < 2 * d; ++i)
        want += double(back.fuse_w[o * 2 * d + i]) * f[r * 3 * d + d + i];
      QVERIFY(std::abs(g[r * d + o] - want) < 1e-5);
    }
  }
  // Without taps the root is h itself.
  info.taps.clear();
  const DraftHead untapped = make_mtp_head(info, {1});
  untapped.mtp_root(f.data(), 1, g.data());
  QVERIFY(std::equal(g.begin(), g.begin() + d, f.begin()));

  info.taps = {3, 1};
  expect_error([&] { make_mtp_head(info, {1}); }, {"tapped", "ascending"});
  info.taps = {1};
  info.type = "medusa";
  expect_error([&] { make_medusa_head(info); }, {"tapped", "only an mtp head"});
}

void TrainingTest::malformed_trace_files_rejected() {
  std::mt19937 rng(5);
  random_trace(rng).save(path("good.trace"));
  const std::string good = read_bytes(path("good.trace"));
  const std::string f = path("bad.trace").string();

  write_bytes(f, good.substr(0, good.size() - 1));
  expect_error([&] { TraceSet::load(f); }, {f, "truncated"});
  write_bytes(f, good.substr(0, 30));
  expect_error([&] { TraceSet::load(f); }, {f, "truncated"});
  write_bytes(f, good + "x");
  expect_error([&] { TraceSet::load(f); }, {f, "trailing"});
  std::string corrupt = good;
  corrupt[200] ^= 0x10;  // inside the hidden states
  write_bytes(f, corrupt);
  expect_error([&] { TraceSet::load(f); }, {f, "checksum"});
  std::string version = good;
  version[8] = 4;  // a later format
  write_bytes(f, version);
  expect_error([&] { TraceSet::load(f); }, {f, "version 4"});
  TraceSet short_next = random_trace(rng);
  short_next.next.pop_back();
  expect_error([&] { short_next.save(path("short.trace")); }, {"next"});
  std::string magic = good;
  magic[0] = 'X';
  write_bytes(f, magic);
  expect_error([&] { TraceSet::load(f); }, {f, "not a trace file"});
  expect_error([&] { TraceSet::load(path("missing.trace")); }, {"missing.trace"});
}

// An mtp head's draft vocabulary is the training side's pred ids — every label its softmax can
// meet — sorted and unique; only with the KL term, whose targets are the top-k ids, does it take
// those too.
void TrainingTest::mtp_draft_vocabulary_holds_the_labels() {
  std::mt19937 rng(5);
  const TraceSet t = random_trace(rng);
  TrainOptions o;
  o.validation = 0.3f;  // one of the three sequences held out
  const std::vector<TokenId> plain = draft_vocabulary(t, o);
  QVERIFY(!plain.empty());
  QVERIFY(std::is_sorted(plain.begin(), plain.end()));
  QVERIFY(std::adjacent_find(plain.begin(), plain.end()) == plain.end());
  // Exactly the preds of the two training sequences: of all but one of the three.
  bool matches_a_split = false;
  for (int64_t held_out = 0; held_out < t.n_sequences(); ++held_out) {
    std::vector<TokenId> preds;
    for (int64_t q = 0; q < t.n_sequences(); ++q)
      if (q != held_out)
        preds.insert(preds.end(), t.pred.begin() + t.seq_begin[size_t(q)],
                     t.pred.begin() + t.seq_begin[size_t(q) + 1]);
    std::sort(preds.begin(), preds.end());
    preds.erase(std::unique(preds.begin(), preds.end()), preds.end());
    matches_a_split = matches_a_split || preds == plain;
  }
  QVERIFY(matches_a_split);

  o.kl_weight = 0.5f;
  const std::vector<TokenId> with_kl = draft_vocabulary(t, o);
  QVERIFY(std::includes(with_kl.begin(), with_kl.end(), plain.begin(), plain.end()));
  QVERIFY(std::any_of(with_kl.begin(), with_kl.end(), [&](TokenId id) {
    return std::find(t.pred.begin(), t.pred.end(), id) == t.pred.end();
  }));
}

QTEST_GUILESS_MAIN(TrainingTest)
#include "test_training.moc"
