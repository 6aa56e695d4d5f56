// Speculative decoding on the real model. Lossless: greedy output with a draft head equals the
// output without one, colocated and disaggregated, for 16 prompts. KV rollback: after rejected
// drafts the sequence's KV rows equal those of a run without speculation. Sampling: with
// temperature, the distribution of tokens with speculation matches the target's (chi-square).

#include <QtTest>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>

#include "core/device/device.h"
#include "core/kvcache/kv_manager.h"
#include "core/model/llama_model.h"
#include "core/model/model_files.h"
#include "core/model/transformer_pass.h"
#include "core/runtime/kv_storage.h"
#include "core/runtime/model_runner.h"
#include "core/runtime/sampler.h"
#include "core/serving/engine.h"
#include "core/serving/scheduler.h"
#include "core/serving/worker.h"
#include "core/speculative/draft_tree.h"
#include "core/speculative/draft_head.h"
#include "core/tokenizer/tokenizer.h"
#include "kernels/cpu/ops.h"
#include "tests/common/default_model.h"
#include "tests/serving/serving_prompts.h"

using namespace tokenfab;

namespace {

constexpr int32_t kMaxTokens = 24;

struct LosslessCase {
  const char* name;
  bool disaggregated;
  std::shared_ptr<const DraftHead> head;
  int32_t draft_len;
  std::vector<int32_t> tree_shape;  // empty: a chain
  bool adaptive = false;            // chain: each step's length chosen (draft_length.h)
  int32_t tree_nodes = 0;           // tree: > 0 a dynamic tree of at most this many nodes
  int32_t lookup = 0;               // > 0: context lookup drafts (alone when head is null)
};

EngineConfig lossless_config(bool disaggregated) {
  EngineConfig c;
  c.threads = 2;
  c.kv_blocks = 512;
  if (disaggregated) {
    c.prefill = "cpu:0";
    c.decode = "cpu:1";
  }
  return c;
}

}  // namespace

class SpeculativeTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void greedy_output_is_unchanged_by_any_head();
  void greedy_output_is_unchanged_by_mtp_heads();
  void greedy_output_is_unchanged_by_heads_with_taps();
  void taps_with_zero_fusion_draft_as_without_taps();
  void greedy_output_is_unchanged_by_dynamic_trees();
  void greedy_output_is_unchanged_by_context_lookup();
  void dynamic_tree_holds_the_most_probable_nodes();
  void draft_vocabulary_logits_are_the_target_s();
  void split_draft_steps_compute_what_one_thread_does();
  void chain_stop_sees_path_probabilities_and_cuts_the_chain();
  void greedy_output_is_unchanged_by_adaptive_drafting();
  void auto_selection_switches_heads_mid_generation();
  void rejected_drafts_leave_the_kv_as_without_speculation_data();
  void rejected_drafts_leave_the_kv_as_without_speculation();
  void speculative_sampling_keeps_the_target_distribution();

 private:
  // A head whose drafts are often right: its residual blocks are zero (each head proposes what
  // the base LM head predicts next), which a greedy continuation that repeats itself accepts.
  std::shared_ptr<const DraftHead> zero_head() const;
  // A head with random weights: drafts mostly wrong, exercising rejection and rollback.
  std::shared_ptr<const DraftHead> random_head(unsigned seed) const;
  // mtp heads over the draft vocabulary `vocab`: zero weights (each step proposes what the LM
  // head predicts from the hidden state it was given) or random ones.
  // With `taps`, the head also reads the target's layer taps (draft_tap_layers), its fusion
  // zero (seed 0) or random.
  std::shared_ptr<const DraftHead> mtp_head(std::vector<TokenId> vocab, unsigned seed,
                                            bool taps = false) const;

  // Each prompt's greedy output without speculation (computed once).
  const std::vector<std::vector<TokenId>>& plain_outputs();
  // Every token of the prompts and of their plain outputs: a draft vocabulary for mtp heads.
  std::vector<TokenId> prompt_and_output_tokens();
  void check_lossless(std::span<const LosslessCase> cases);

  std::unique_ptr<LlamaModel> model_;
  std::optional<Tokenizer> tokenizer_;
  std::vector<std::vector<TokenId>> prompts_;
  std::vector<std::vector<TokenId>> plain_;
};

void SpeculativeTest::initTestCase() {
  TOKENFAB_LOAD_DEFAULT_MODEL(model_, tokenizer_);
  for (const std::string& t : test::prompt_texts())
    prompts_.push_back(tokenizer_->encode(t, false, false));
}

std::shared_ptr<const DraftHead> SpeculativeTest::zero_head() const {
  DraftHeadInfo info;
  info.name = "zero";
  info.n_heads = 4;
  info.n_embd = static_cast<int32_t>(model_->hparams().n_embd);
  info.n_vocab = static_cast<int32_t>(model_->hparams().n_vocab);
  return std::make_shared<const DraftHead>(make_medusa_head(info));
}

std::shared_ptr<const DraftHead> SpeculativeTest::random_head(unsigned seed) const {
  DraftHead head = *zero_head();
  head.info.name = "random";
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 0.05f);
  for (auto& w : head.w)
    for (float& x : w) x = noise(rng);
  return std::make_shared<const DraftHead>(std::move(head));
}

std::shared_ptr<const DraftHead> SpeculativeTest::mtp_head(std::vector<TokenId> vocab,
                                                           unsigned seed, bool taps) const {
  DraftHeadInfo info;
  info.type = "mtp";
  info.name = std::string(seed == 0 ? "zero-mtp" : "random-mtp") + (taps ? "-taps" : "");
  if (taps) info.taps = draft_tap_layers(model_->hparams().n_layer);
  info.n_heads = 4;
  info.n_embd = static_cast<int32_t>(model_->hparams().n_embd);
  info.n_vocab = static_cast<int32_t>(model_->hparams().n_vocab);
  DraftHead head = make_mtp_head(info, std::move(vocab));
  if (seed != 0) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> noise(0.0f, 0.05f);
    for (float& x : head.w[0]) x = noise(rng);
    for (float& x : head.fuse_w) x = noise(rng);
    for (float& x : head.fuse_b) x = noise(rng);
  }
  return std::make_shared<const DraftHead>(std::move(head));
}

const std::vector<std::vector<TokenId>>& SpeculativeTest::plain_outputs() {
  if (plain_.empty()) {
    Engine engine(*model_, lossless_config(false));
    std::vector<RequestId> ids;
    for (const auto& p : prompts_) ids.push_back(engine.submit({p, kMaxTokens}));
    for (const RequestId id : ids) plain_.push_back(engine.wait(id).output);
  }
  return plain_;
}

std::vector<TokenId> SpeculativeTest::prompt_and_output_tokens() {
  std::vector<TokenId> vocab;
  for (const auto& tokens : {prompts_, plain_outputs()})
    for (const auto& t : tokens) vocab.insert(vocab.end(), t.begin(), t.end());
  return vocab;
}

void SpeculativeTest::check_lossless(std::span<const LosslessCase> cases) {
  const std::vector<std::vector<TokenId>>& plain = plain_outputs();
  for (const LosslessCase& c : cases) {
    // Each request's verifying steps as its token events report them.
    struct Timing {
      int64_t steps = 0;
      double draft_s = 0.0, verify_s = 0.0;
    };
    // Filled on the engine's worker threads; asserted on this thread once the requests end
    // (a failed QVERIFY there would only return from the callback).
    std::mutex timing_mutex;
    std::map<RequestId, Timing> timing;
    int64_t drafts_without_verification = 0;  // events with draft time but no verifying time
    // Made after what its subscriber fills, so it is destroyed (its workers joined) first, also
    // when a check below returns early.
    Engine engine(*model_, lossless_config(c.disaggregated));
    engine.subscribe([&](const TokenEvent& e) {
      std::lock_guard lock(timing_mutex);
      if (e.verify_s == 0.0) {
        if (e.draft_s != 0.0) ++drafts_without_verification;
        return;
      }
      Timing& t = timing[e.id];
      ++t.steps;
      t.draft_s += e.draft_s;
      t.verify_s += e.verify_s;
    });
    std::vector<RequestId> ids;
    for (const auto& p : prompts_) {
      GenerationRequest r{p, kMaxTokens};
      r.head = c.head;
      r.draft_len = c.draft_len;
      r.tree_shape = c.tree_shape;
      r.adaptive_draft = c.adaptive;
      r.tree_nodes = c.tree_nodes;
      r.lookup = c.lookup;
      ids.push_back(engine.submit(std::move(r)));
    }
    int64_t proposed = 0, accepted = 0, lengths_chosen = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      const RequestInfo info = engine.wait(ids[i]);
      QVERIFY2(info.output == plain[i],
               qPrintable(QString("%1: prompt %2 differs with speculation").arg(c.name).arg(i)));
      if (c.adaptive) {
        // A length is chosen for every proposal; 0 (a plain step) may be every choice but the
        // probes of a request's first steps.
        QVERIFY(!info.speculation.length_steps.empty());
        for (const int64_t n : info.speculation.length_steps) lengths_chosen += n;
        QVERIFY(static_cast<int32_t>(info.speculation.length_steps.size()) <= c.draft_len + 1);
      } else if (c.head) {  // lookup alone drafts only where a suffix of the context recurs
        QVERIFY(info.speculation.verify_steps > 0);
        QVERIFY(info.speculation.length_steps.empty());
      }
      // The token events carry the verifying steps' timing: the request's totals add them up, and
      // proposing with a head takes time (the last proposal may end unverified).
      {
        std::lock_guard lock(timing_mutex);
        const Timing t = timing[ids[i]];
        QCOMPARE(t.steps, info.speculation.verify_steps);
        QVERIFY(std::fabs(t.verify_s - info.speculation.verify_s) <= 1e-9);
        QVERIFY(t.draft_s <= info.speculation.draft_s + 1e-9);
        if (c.head && t.steps > 0) QVERIFY(t.draft_s > 0.0 && t.verify_s > 0.0);
      }
      for (size_t p = 0; p < info.speculation.proposed_at.size(); ++p) {
        proposed += info.speculation.proposed_at[p];
        accepted += info.speculation.accepted_at[p];
        if (p > 0) QVERIFY(info.speculation.accepted_at[p] <= info.speculation.accepted_at[p - 1]);
      }
    }
    {
      std::lock_guard lock(timing_mutex);
      QCOMPARE(drafts_without_verification, int64_t{0});  // draft time only with a verifying step
    }
    const ServingSummary s = engine.summary();
    QVERIFY(s.accept_per_step.has_value());
    qInfo("%s: %lld of %lld drafts accepted, ACCEPT/STEP %.3f", c.name,
          static_cast<long long>(accepted), static_cast<long long>(proposed), *s.accept_per_step);
    QVERIFY(*s.accept_per_step >= 1.0);
    QVERIFY(s.verify_ms_per_step.has_value() && *s.verify_ms_per_step > 0.0);
    QVERIFY(s.draft_ms_per_step.has_value());
    QVERIFY(proposed > 0);
    if (c.lookup > 0 && !c.head) QVERIFY(accepted > 0);  // text repeats: some copies are right
  }
}

void SpeculativeTest::greedy_output_is_unchanged_by_any_head() {
  const LosslessCase cases[] = {
      {"colocated, zero head", false, zero_head(), 4, {}},
      {"colocated, random head", false, random_head(1), 3, {}},
      {"disaggregated, zero head", true, zero_head(), 4, {}},
      {"colocated, zero head, tree 3,2,2,1", false, zero_head(), 4, {3, 2, 2, 1}},
      {"colocated, random head, tree 2,2,2", false, random_head(1), 3, {2, 2, 2}},
      {"disaggregated, zero head, tree 4,2,2", true, zero_head(), 4, {4, 2, 2}}};
  check_lossless(cases);
}

// mtp heads that also read the target's layer taps: the workers' hidden rows are then draft
// features (the final hidden state and the taps), handed over with the KV in disaggregated mode.
void SpeculativeTest::greedy_output_is_unchanged_by_heads_with_taps() {
  const std::vector<TokenId> vocab = prompt_and_output_tokens();
  const LosslessCase cases[] = {
      {"colocated, random mtp head with taps", false, mtp_head(vocab, 4, true), 4, {}},
      {"colocated, random mtp head with taps, tree 3,2,2,1",
       false,
       mtp_head(vocab, 5, true),
       4,
       {3, 2, 2, 1}},
      {"disaggregated, random mtp head with taps", true, mtp_head(vocab, 6, true), 3, {}},
      {"colocated, random mtp head with taps, dynamic tree",
       false,
       mtp_head(vocab, 7, true),
       4,
       {4, 4, 4, 4},
       false,
       16}};
  check_lossless(cases);
}

// A head whose taps fusion is zero starts each chain from h_t as a head without taps does, so
// both draft the same tokens: what the engine hands the head as the final hidden state is the
// same with the taps behind it. And a fusion that is not zero changes what is drafted.
void SpeculativeTest::taps_with_zero_fusion_draft_as_without_taps() {
  const std::vector<TokenId> vocab = prompt_and_output_tokens();
  const auto drafts = [&](std::shared_ptr<const DraftHead> head) {
    Engine engine(*model_, lossless_config(false));
    std::vector<RequestId> ids;
    for (const auto& p : prompts_) {
      GenerationRequest r{p, kMaxTokens};
      r.head = head;
      r.draft_len = 4;
      ids.push_back(engine.submit(std::move(r)));
    }
    std::vector<std::vector<int64_t>> accepted;
    for (const RequestId id : ids) accepted.push_back(engine.wait(id).speculation.accepted_at);
    return accepted;
  };
  DraftHead plain = *mtp_head(vocab, 8);
  DraftHead tapped = plain;
  tapped.info.taps = draft_tap_layers(model_->hparams().n_layer);
  tapped.fuse_w.assign(tapped.info.taps.size() * plain.w[0].size() / 2, 0.0f);
  tapped.fuse_b.assign(plain.b[0].size(), 0.0f);
  const auto without = drafts(std::make_shared<const DraftHead>(plain));
  QCOMPARE(drafts(std::make_shared<const DraftHead>(tapped)), without);
  std::mt19937 rng(9);
  std::normal_distribution<float> noise(0.0f, 0.5f);
  for (float& x : tapped.fuse_w) x = noise(rng);
  QVERIFY(drafts(std::make_shared<const DraftHead>(tapped)) != without);
}

// The same for mtp heads (their own sequential drafting path in the worker), chain and tree,
// colocated and disaggregated.
void SpeculativeTest::greedy_output_is_unchanged_by_mtp_heads() {
  const std::vector<TokenId> vocab = prompt_and_output_tokens();
  const LosslessCase cases[] = {
      {"colocated, zero mtp head", false, mtp_head(vocab, 0), 4, {}},
      {"colocated, random mtp head, tree 3,2,2,1", false, mtp_head(vocab, 2), 4, {3, 2, 2, 1}},
      {"disaggregated, random mtp head", true, mtp_head(vocab, 3), 3, {}},
      {"disaggregated, zero mtp head, tree 2,2,2", true, mtp_head(vocab, 0), 3, {2, 2, 2}}};
  check_lossless(cases);
}

// The same for dynamic trees (mtp heads: each step's tree follows the head's own probabilities),
// colocated and disaggregated. A slot of its own: each test function has its own time limit.
void SpeculativeTest::greedy_output_is_unchanged_by_dynamic_trees() {
  const std::vector<TokenId> vocab = prompt_and_output_tokens();
  LosslessCase colocated{"colocated, random mtp head, dynamic tree of 20 in 8,4,2,1",
                         false,
                         mtp_head(vocab, 2),
                         4,
                         {8, 4, 2, 1}};
  colocated.tree_nodes = 20;
  LosslessCase disaggregated{"disaggregated, zero mtp head, dynamic tree of 12 in 4,4,4",
                             true,
                             mtp_head(vocab, 0),
                             3,
                             {4, 4, 4}};
  disaggregated.tree_nodes = 12;
  const LosslessCase cases[] = {colocated, disaggregated};
  check_lossless(cases);
}

// The same with context lookup drafts: alone (no head; fixed and adaptive length), and as one
// more branch of a head's chain
// (which becomes a tree where they differ), static tree and dynamic tree; colocated and
// disaggregated.
void SpeculativeTest::greedy_output_is_unchanged_by_context_lookup() {
  const std::vector<TokenId> vocab = prompt_and_output_tokens();
  const auto with_lookup = [](LosslessCase c, int32_t lookup, int32_t tree_nodes = 0) {
    c.lookup = lookup;
    c.tree_nodes = tree_nodes;
    return c;
  };
  const LosslessCase cases[] = {
      with_lookup({"colocated, context lookup alone, 4 tokens", false, nullptr, 4, {}}, 3),
      with_lookup({"disaggregated, context lookup alone, adaptive, up to 3 tokens",
                   true,
                   nullptr,
                   3,
                   {},
                   true},
                  2),
      with_lookup({"colocated, random mtp head + lookup", false, mtp_head(vocab, 2), 4, {}}, 3),
      with_lookup(
          {"colocated, zero head, tree 3,2,2,1 + lookup", false, zero_head(), 4, {3, 2, 2, 1}}, 3),
      with_lookup({"disaggregated, random mtp head, dynamic tree of 20 in 8,4,2,1 + lookup",
                   true,
                   mtp_head(vocab, 3),
                   4,
                   {8, 4, 2, 1}},
                  3, 20)};
  check_lossless(cases);
}

// A dynamic tree holds the most probable nodes of the static tree of the same shape: every node's
// path probability is computed here, step by step from the head's own softmax, over the whole
// static tree (mtp_propose), and the best-first tree of N nodes must be its N most probable
// nodes, in level order, each after its parent; at the static tree's size the two hold the same
// nodes.
void SpeculativeTest::dynamic_tree_holds_the_most_probable_nodes() {
  const std::shared_ptr<const DraftHead> head = mtp_head(prompt_and_output_tokens(), 2);
  const int64_t d = model_->hparams().n_embd, v = static_cast<int64_t>(head->vocab.size());
  const std::vector<int32_t> widths = {3, 2, 2, 1};  // 3 + 6 + 12 + 12 = 33 nodes
  std::vector<float> h(static_cast<size_t>(d));
  std::mt19937 rng(7);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  for (float& x : h) x = noise(rng);
  const TokenId last = prompts_[0].back();
  std::vector<TokenId> all;
  std::vector<int32_t> all_parent;
  head->mtp_propose(*model_, h.data(), last, widths, 64, all, all_parent);
  QCOMPARE(all.size(), size_t{33});

  // Reference: the state and path log-probability of every static node, parents first.
  const auto step = [&](const std::vector<float>& from, TokenId token, std::vector<float>& to,
                        std::vector<double>& log_softmax) {
    std::vector<float> e(static_cast<size_t>(d)), logits(static_cast<size_t>(v));
    embed_tokens(*model_, std::span(&token, 1), e.data());
    to.resize(static_cast<size_t>(d));
    head->mtp_step(from.data(), e.data(), 1, to.data());
    head->vocab_logits(*model_, to.data(), 1, logits.data());
    double top = logits[0], sum = 0.0;
    for (const float l : logits) top = std::max(top, static_cast<double>(l));
    for (const float l : logits) sum += std::exp(static_cast<double>(l) - top);
    log_softmax.resize(logits.size());
    for (size_t j = 0; j < logits.size(); ++j) log_softmax[j] = logits[j] - top - std::log(sum);
  };
  const auto log_p_of = [&](const std::vector<double>& log_softmax, TokenId token) {
    const auto it = std::lower_bound(head->vocab.begin(), head->vocab.end(), token);
    return log_softmax[static_cast<size_t>(it - head->vocab.begin())];
  };
  std::vector<float> root_state;
  std::vector<double> root_ls;
  step(h, last, root_state, root_ls);
  std::vector<std::vector<float>> state(all.size());
  std::vector<std::vector<double>> child_ls(all.size());
  std::vector<double> log_p(all.size());
  std::vector<std::vector<TokenId>> path(all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    const int32_t p = all_parent[i];
    QVERIFY(p < static_cast<int32_t>(i));
    const auto pi = static_cast<size_t>(p);
    log_p[i] = (p < 0 ? 0.0 : log_p[pi]) + log_p_of(p < 0 ? root_ls : child_ls[pi], all[i]);
    path[i] = p < 0 ? std::vector<TokenId>{} : path[pi];
    path[i].push_back(all[i]);
    step(p < 0 ? root_state : state[pi], all[i], state[i], child_ls[i]);
  }
  std::vector<size_t> by_p(all.size());
  std::iota(by_p.begin(), by_p.end(), size_t{0});
  std::stable_sort(by_p.begin(), by_p.end(),
                   [&](size_t a, size_t b) { return log_p[a] > log_p[b]; });

  for (const int32_t n : {1, 5, 12, 33}) {
    std::vector<TokenId> draft;
    std::vector<int32_t> parent;
    head->mtp_propose_best_first(*model_, h.data(), last, widths, n, draft, parent);
    QCOMPARE(static_cast<int32_t>(draft.size()), n);
    std::vector<std::vector<TokenId>> got(draft.size()), want;
    std::vector<int32_t> depth(draft.size());
    for (size_t i = 0; i < draft.size(); ++i) {
      const int32_t p = parent[i];
      QVERIFY(p < static_cast<int32_t>(i));
      depth[i] = p < 0 ? 1 : depth[static_cast<size_t>(p)] + 1;
      if (i > 0) QVERIFY(depth[i] >= depth[i - 1]);  // level order
      got[i] = p < 0 ? std::vector<TokenId>{} : got[static_cast<size_t>(p)];
      got[i].push_back(draft[i]);
    }
    for (int32_t k = 0; k < n; ++k) want.push_back(path[by_p[static_cast<size_t>(k)]]);
    std::sort(got.begin(), got.end());
    std::sort(want.begin(), want.end());
    QVERIFY2(got == want, qPrintable(QString("tree of %1 nodes").arg(n)));
  }
}

// Adaptive chains (each step's length chosen from measured step costs and acceptance, 0 when
// drafting does not pay): outputs unchanged whatever lengths are picked, colocated and
// disaggregated, Medusa and mtp heads.
// An mtp head's logits over its draft vocabulary are the target's own logits for those tokens,
// bit for bit (the same stored rows and kernels as the target's LM head), for one row and for
// several, with a vocabulary whose size is not a multiple of the x8 row group and one that is.
void SpeculativeTest::draft_vocabulary_logits_are_the_target_s() {
  const int64_t d = model_->hparams().n_embd, n_vocab = model_->hparams().n_vocab;
  std::vector<TokenId> vocab = prompt_and_output_tokens();
  std::mt19937 rng(11);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  QVERIFY(vocab.size() > 16);
  const size_t whole_groups = (vocab.size() - 1) / 8 * 8;
  for (const size_t size : {whole_groups - 5, whole_groups}) {
    const std::vector<TokenId> sub(vocab.begin(), vocab.begin() + static_cast<ptrdiff_t>(size));
    const std::shared_ptr<const DraftHead> head = mtp_head(sub, 1);
    const auto v = static_cast<int64_t>(head->vocab.size());
    for (const int64_t n : {int64_t{1}, int64_t{5}}) {
      std::vector<float> z(static_cast<size_t>(n * d));
      for (float& x : z) x = noise(rng);
      std::vector<float> draft(static_cast<size_t>(n * v)), target;
      head->vocab_logits(*model_, z.data(), n, draft.data());
      kernels::ThreadPool pool(1);
      TransformerPass pass(*model_, pool);
      target.resize(static_cast<size_t>(n * n_vocab));
      pass.lm_head(z.data(), n, target.data());
      for (int64_t r = 0; r < n; ++r)
        for (int64_t j = 0; j < v; ++j)
          QVERIFY2(draft[r * v + j] == target[r * n_vocab + head->vocab[j]],
                   qPrintable(QString("vocabulary of %1, row %2, token %3: %4 against %5")
                                  .arg(v)
                                  .arg(r)
                                  .arg(head->vocab[j])
                                  .arg(draft[r * v + j])
                                  .arg(target[r * n_vocab + head->vocab[j]])));
    }
  }
}

// A single request's draft steps split over the device's threads (the worker does so when fewer
// requests draft than it has threads): mtp_step, the vocabulary logits, the chain, the static
// tree and the best-first tree are bit for bit those of one thread, for 2 and 3 parts, a
// vocabulary that is not a whole number of x8 row groups and several rows at once.
void SpeculativeTest::split_draft_steps_compute_what_one_thread_does() {
  std::vector<TokenId> vocab = prompt_and_output_tokens();
  if (vocab.size() % 8 == 0) vocab.pop_back();
  const std::shared_ptr<const DraftHead> head = mtp_head(vocab, 5);
  const int64_t d = model_->hparams().n_embd, v = static_cast<int64_t>(head->vocab.size());
  kernels::ThreadPool pool(3);
  const DraftSplit split = [&](int64_t parts, const std::function<void(int64_t)>& fn) {
    parallel_for_on(pool, parts, fn);
  };
  std::mt19937 rng(13);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  const int64_t n = 4;
  std::vector<float> h(static_cast<size_t>(n * d)), e(h.size());
  for (float& x : h) x = noise(rng);
  for (float& x : e) x = noise(rng);
  std::vector<float> z_one(h.size()), logits_one(static_cast<size_t>(n * v));
  head->mtp_step(h.data(), e.data(), n, z_one.data());
  head->vocab_logits(*model_, z_one.data(), n, logits_one.data());
  const TokenId last = prompts_[0].back();
  const std::vector<int32_t> chain(4, 1), widths = {3, 2, 2, 1};
  std::vector<TokenId> chain_one, tree_one, best_one;
  std::vector<int32_t> parent, tree_parent_one, best_parent_one;
  head->mtp_propose(*model_, h.data(), last, chain, 64, chain_one, parent);
  head->mtp_propose(*model_, h.data(), last, widths, 64, tree_one, tree_parent_one);
  head->mtp_propose_best_first(*model_, h.data(), last, widths, 20, best_one, best_parent_one);
  for (const int64_t parts : {int64_t{2}, int64_t{3}}) {
    const QString what = QString("%1 parts").arg(parts);
    std::vector<float> z(h.size()), logits(logits_one.size());
    head->mtp_step(h.data(), e.data(), n, z.data(), &split, parts);
    QVERIFY2(z == z_one, qPrintable(what + ": mtp_step"));
    head->vocab_logits(*model_, z.data(), n, logits.data(), &split, parts);
    QVERIFY2(logits == logits_one, qPrintable(what + ": vocabulary logits"));
    std::vector<TokenId> draft;
    std::vector<int32_t> tree_parent;
    head->mtp_propose(*model_, h.data(), last, chain, 64, draft, tree_parent, &split, parts);
    QVERIFY2(draft == chain_one, qPrintable(what + ": chain"));
    head->mtp_propose(*model_, h.data(), last, widths, 64, draft, tree_parent, &split, parts);
    QVERIFY2(draft == tree_one && tree_parent == tree_parent_one,
             qPrintable(what + ": static tree"));
    head->mtp_propose_best_first(*model_, h.data(), last, widths, 20, draft, tree_parent, &split,
                                 parts);
    QVERIFY2(draft == best_one && tree_parent == best_parent_one,
             qPrintable(what + ": best-first tree"));
  }
  // With taps (a random fusion), the chain's first state too: split, it is the same.
  const std::shared_ptr<const DraftHead> tapped = mtp_head(vocab, 9, true);
  const int64_t width = tapped->feature_width();
  std::vector<float> f(static_cast<size_t>(n * width));
  for (float& x : f) x = noise(rng);
  std::vector<float> g_one(h.size());
  tapped->mtp_root(f.data(), n, g_one.data());
  std::vector<TokenId> tapped_one;
  tapped->mtp_propose(*model_, f.data(), last, chain, 64, tapped_one, parent);
  for (const int64_t parts : {int64_t{2}, int64_t{3}}) {
    const QString what = QString("taps, %1 parts").arg(parts);
    std::vector<float> g(h.size());
    tapped->mtp_root(f.data(), n, g.data(), &split, parts);
    QVERIFY2(g == g_one, qPrintable(what + ": mtp_root"));
    std::vector<TokenId> draft;
    tapped->mtp_propose(*model_, f.data(), last, chain, 64, draft, parent, &split, parts);
    QVERIFY2(draft == tapped_one, qPrintable(what + ": chain"));
  }
}

// A chain's stopping rule (ChainStop) is called once per drafted token with the path
// probability the head gives it — the product of its softmax top-1 probabilities over the draft
// vocabulary, computed here step by step — and its verdicts cut the chain: the kept drafts are a
// prefix of the unstopped chain. Trees ignore it.
void SpeculativeTest::chain_stop_sees_path_probabilities_and_cuts_the_chain() {
  const std::shared_ptr<const DraftHead> head = mtp_head(prompt_and_output_tokens(), 3);
  const int64_t d = model_->hparams().n_embd, v = static_cast<int64_t>(head->vocab.size());
  std::vector<float> h(static_cast<size_t>(d));
  std::mt19937 rng(21);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  for (float& x : h) x = noise(rng);
  const TokenId last = prompts_[0].back();
  const std::vector<int32_t> chain(4, 1);
  std::vector<TokenId> full, draft;
  std::vector<int32_t> parent;
  head->mtp_propose(*model_, h.data(), last, chain, 64, full, parent);
  QCOMPARE(full.size(), size_t{4});

  // Reference: each step's softmax probability of the chain's token, multiplied along.
  std::vector<double> want;
  {
    std::vector<float> state = h, next(static_cast<size_t>(d)), e(static_cast<size_t>(d)),
                       logits(static_cast<size_t>(v));
    TokenId token = last;
    double path = 1.0;
    for (const TokenId drafted : full) {
      embed_tokens(*model_, std::span(&token, 1), e.data());
      head->mtp_step(state.data(), e.data(), 1, next.data());
      head->vocab_logits(*model_, next.data(), 1, logits.data());
      const float top = *std::max_element(logits.begin(), logits.end());
      double sum = 0.0;
      for (const float l : logits) sum += std::exp(static_cast<double>(l - top));
      const auto at =
          std::lower_bound(head->vocab.begin(), head->vocab.end(), drafted) - head->vocab.begin();
      QCOMPARE(logits[static_cast<size_t>(at)], top);  // the draft is the step's top token
      path *= 1.0 / sum;
      want.push_back(path);
      state = next;
      token = drafted;
    }
  }
  // A rule that answers `verdicts` in turn (kKeep once they run out) and records what it saw.
  const auto propose = [&](std::vector<DraftVerdict> verdicts, std::span<const int32_t> widths,
                           std::vector<double>& seen) {
    seen.clear();
    const ChainStop stop = [&](double p) {
      seen.push_back(p);
      return seen.size() <= verdicts.size() ? verdicts[seen.size() - 1] : DraftVerdict::kKeep;
    };
    head->mtp_propose(*model_, h.data(), last, widths, 64, draft, parent, nullptr, 1, &stop);
  };
  std::vector<double> seen;
  propose({}, chain, seen);
  QCOMPARE(draft, full);
  QCOMPARE(seen.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    QVERIFY(std::fabs(seen[i] - want[i]) <= 1e-9 * want[i]);
    if (i > 0) QVERIFY(seen[i] <= seen[i - 1]);
  }
  using V = std::vector<TokenId>;
  propose({DraftVerdict::kKeep, DraftVerdict::kKeep, DraftVerdict::kDrop}, chain, seen);
  QCOMPARE(draft, V(full.begin(), full.begin() + 2));  // the third is dropped, and the chain ends
  QCOMPARE(seen.size(), size_t{3});
  propose({DraftVerdict::kKeep, DraftVerdict::kKeepLast}, chain, seen);
  QCOMPARE(draft, V(full.begin(), full.begin() + 2));  // the second is kept, no third is drafted
  QCOMPARE(seen.size(), size_t{2});
  propose({DraftVerdict::kDrop}, chain, seen);
  QVERIFY(draft.empty());
  const std::vector<int32_t> widths = {2, 1};
  std::vector<TokenId> tree;
  std::vector<int32_t> tree_parent;
  head->mtp_propose(*model_, h.data(), last, widths, 64, tree, tree_parent);
  propose({DraftVerdict::kDrop}, widths, seen);
  QVERIFY(seen.empty());
  QCOMPARE(draft, tree);
  QCOMPARE(parent, tree_parent);
}

void SpeculativeTest::greedy_output_is_unchanged_by_adaptive_drafting() {
  const std::vector<TokenId> vocab = prompt_and_output_tokens();
  const LosslessCase cases[] = {
      {"colocated, zero head, adaptive", false, zero_head(), 4, {}, true},
      {"colocated, random head, adaptive", false, random_head(5), 3, {}, true},
      {"disaggregated, zero mtp head, adaptive", true, mtp_head(vocab, 0), 4, {}, true},
      // Colocated on the CPU an mtp chain also stops by confidence (ChainStopRule).
      {"colocated, random mtp head, adaptive", false, mtp_head(vocab, 2), 4, {}, true}};
  check_lossless(cases);
}

// A request whose head does far worse than its record switches, once, to the other candidate
// (head_switch.h), is logged in its statistics, and its greedy output does not change.
void SpeculativeTest::auto_selection_switches_heads_mid_generation() {
  constexpr int32_t kTokens = 48;
  const std::shared_ptr<const DraftHead> poor = random_head(4), other = zero_head();
  Engine engine(*model_, lossless_config(false));
  for (size_t p = 0; p < 4; ++p) {
    const RequestInfo plain = engine.wait(engine.submit({prompts_[p], kTokens}));
    GenerationRequest r{prompts_[p], kTokens};
    r.head = poor;
    // Records as `heads eval` would have left them: the random head claims 3.0.
    r.head_candidates = {{poor, 3.0}, {other, 2.0}};
    const RequestInfo info = engine.wait(engine.submit(std::move(r)));
    QCOMPARE(info.output, plain.output);
    if (static_cast<int32_t>(info.output.size()) <= HeadSwitchPolicy::kWindow) continue;
    QCOMPARE(static_cast<int>(info.speculation.switches.size()), 1);
    const SpeculationStats::HeadSwitch& change = info.speculation.switches.front();
    QCOMPARE(change.from, std::string("random"));
    QCOMPARE(change.to, std::string("zero"));
    QVERIFY(change.at_token >= HeadSwitchPolicy::kWindow);
    QVERIFY(change.live_accept_per_step < HeadSwitchPolicy::kRatio * 3.0);
    QCOMPARE(change.from_record, 3.0);
    QCOMPARE(info.head, std::string("zero"));
    qInfo("prompt %zu: switched at token %d (live ACCEPT/STEP %.2f)", p, change.at_token,
          change.live_accept_per_step);
  }
  // A head meeting its record is kept: the zero head recorded at 1.0 never falls below 0.8.
  GenerationRequest r{prompts_[0], kTokens};
  r.head = other;
  r.head_candidates = {{other, 1.0}, {poor, 5.0}};
  const RequestInfo info = engine.wait(engine.submit(std::move(r)));
  QVERIFY(info.speculation.switches.empty());
}

void SpeculativeTest::rejected_drafts_leave_the_kv_as_without_speculation_data() {
  QTest::addColumn<bool>("tree");
  QTest::newRow("chain") << false;
  QTest::newRow("tree") << true;
}

// Scheduler + ModelRunner directly: a sequence decoded with drafts that are right, partly right
// and wrong (the true continuation with a corrupted position) ends with the same tokens and the
// same KV rows, bit for bit, as the sequence decoded one token at a time. Trees: each level holds
// the true token among wrong siblings (in a random order), sometimes only wrong ones; the
// accepted path's KV rows are moved onto the chain's positions as the worker does.
void SpeculativeTest::rejected_drafts_leave_the_kv_as_without_speculation() {
  QFETCH(bool, tree);
  const HParams& hp = model_->hparams();
  constexpr int32_t kBlocks = 64, kBlockSize = 16, kTokens = 40;
  kernels::ThreadPool pool(2);
  auto argmax = [&](const float* row) {
    return static_cast<TokenId>(kernels::argmax(row, hp.n_vocab));
  };
  struct Run {
    KvStorage storage;
    KvManager kv;
    Scheduler scheduler;
    ModelRunner runner;
    std::vector<TokenId> output;
    Run(const LlamaModel& m, kernels::ThreadPool& p)
        : storage(m.hparams(), kBlocks, kBlockSize),
          kv(kBlocks, kBlockSize),
          scheduler(kv),
          runner(m, p, storage) {}
  };
  const std::vector<TokenId>& prompt = prompts_[1];
  auto run = [&](Run& r, const std::vector<TokenId>* truth, std::mt19937* rng) {
    r.scheduler.add({1, prompt, kTokens, false});
    std::vector<float> logits;
    while (r.scheduler.has_unfinished()) {
      const StepPlan plan = r.scheduler.schedule();
      std::vector<BatchSequence> batch;
      std::vector<std::vector<int32_t>> tables;
      tables.reserve(plan.chunks.size());
      for (const ScheduledChunk& c : plan.chunks) {
        const auto& blocks = r.kv.table(c.seq).blocks();
        tables.emplace_back(blocks.begin(), blocks.end());
        BatchSequence& b = batch.emplace_back();
        b.tokens =
            std::span<const int32_t>(r.scheduler.sequence(c.seq).tokens)
                .subspan(static_cast<size_t>(c.first_token), static_cast<size_t>(c.n_tokens));
        b.pos0 = c.first_token;
        b.blocks = tables.back();
        b.want_logits = c.wants_logits;
        b.all_logits = c.n_draft > 0;
        b.tree_parent = c.tree_parent;
      }
      r.runner.run(batch, logits);
      std::vector<ChunkResult> results;
      size_t row = 0;
      for (size_t ci = 0; ci < plan.chunks.size(); ++ci) {
        const ScheduledChunk& c = plan.chunks[ci];
        if (!c.wants_logits) continue;
        const SequenceState& s = r.scheduler.sequence(c.seq);
        ChunkResult& res = results.emplace_back();
        if (!c.tree_parent.empty()) {
          int32_t at = 0;
          for (bool found = true; found;) {
            found = false;
            const TokenId want = argmax(logits.data() + (row + at) * hp.n_vocab);
            for (int32_t child = at + 1; child < c.n_tokens && !found; ++child) {
              if (c.tree_parent[static_cast<size_t>(child)] != at ||
                  s.tokens[static_cast<size_t>(c.first_token + child)] != want)
                continue;
              res.tokens.push_back(want);
              res.path.push_back(child);
              at = child;
              found = true;
            }
            if (!found) res.tokens.push_back(want);
          }
          for (size_t j = 0; j < res.path.size(); ++j)
            r.storage.copy_position(tables[ci], c.first_token + res.path[j],
                                    c.first_token + 1 + static_cast<int64_t>(j));
          row += static_cast<size_t>(c.n_tokens);
          continue;
        }
        int32_t j = 0;
        for (; j < c.n_draft; ++j) {
          const TokenId want = argmax(logits.data() + (row + j) * hp.n_vocab);
          const TokenId draft = s.tokens[static_cast<size_t>(c.first_token + 1 + j)];
          if (want != draft) {
            res.tokens.push_back(want);
            break;
          }
          res.tokens.push_back(draft);
        }
        if (j == c.n_draft) res.tokens.push_back(argmax(logits.data() + (row + j) * hp.n_vocab));
        row += static_cast<size_t>(1 + c.n_draft);
      }
      for (const EmittedToken& e :
           r.scheduler.complete(plan, std::span<const ChunkResult>(results)))
        r.output.push_back(e.token);
      if (truth && r.scheduler.contains(1) && !r.scheduler.sequence(1).done()) {
        // Drafts: the true continuation, with one position (sometimes) corrupted.
        const size_t n_out = r.output.size();
        std::vector<TokenId> draft;
        for (size_t k = 0; k < 4 && n_out + k < truth->size(); ++k)
          draft.push_back((*truth)[n_out + k]);
        std::uniform_int_distribution<int> pick(0, 5);
        if (const int bad = pick(*rng); bad < static_cast<int>(draft.size())) draft[bad] += 1;
        if (!tree) {
          r.scheduler.set_draft(1, draft);
        } else {  // two or three candidates per level, the (possibly corrupted) one among them
          std::vector<std::vector<TokenId>> levels;
          for (TokenId t : draft) {
            std::vector<TokenId> level = {t, t + 2};
            if (levels.size() % 2 == 0) level.push_back(t + 3);
            std::shuffle(level.begin(), level.end(), *rng);
            levels.push_back(std::move(level));
          }
          std::vector<TokenId> nodes;
          std::vector<int32_t> parent;
          build_draft_tree(levels, nodes, parent);
          r.scheduler.set_draft(1, nodes, parent);
        }
      }
    }
  };
  Run plain(*model_, pool), spec(*model_, pool);
  run(plain, nullptr, nullptr);
  std::mt19937 rng(5);
  // Keep the KV: stop before the scheduler frees it by comparing at max_tokens - 1... instead,
  // run both to the end and compare the blocks each run freed into the prefix cache — freed
  // blocks keep their rows, and the tables are identical in shape.
  run(spec, &plain.output, &rng);
  QCOMPARE(spec.output, plain.output);
  QCOMPARE(static_cast<int>(spec.output.size()), kTokens);
  QVERIFY(spec.scheduler.step_log().size() < plain.scheduler.step_log().size());
  // Both sequences' full blocks are registered in the prefix cache under the same hashes (the
  // same tokens); their KV rows must match bit for bit.
  const KvSnapshot a = plain.kv.snapshot(), b = spec.kv.snapshot();
  std::map<uint64_t, BlockId> by_hash;
  for (BlockId id = 0; id < a.n_blocks; ++id)
    if (a.blocks[static_cast<size_t>(id)].has_hash)
      by_hash[a.blocks[static_cast<size_t>(id)].hash] = id;
  int compared = 0;
  const size_t block_bytes = plain.storage.block_bytes();
  for (BlockId id = 0; id < b.n_blocks; ++id) {
    const BlockRecord& rec = b.blocks[static_cast<size_t>(id)];
    if (!rec.has_hash) continue;
    const auto it = by_hash.find(rec.hash);
    if (it == by_hash.end()) continue;  // a block holding rejected drafts: not in the plain run
    for (int32_t layer = 0; layer < plain.storage.n_layers(); ++layer) {
      QVERIFY(std::memcmp(plain.storage.k_block(layer, it->second), spec.storage.k_block(layer, id),
                          block_bytes) == 0);
      QVERIFY(std::memcmp(plain.storage.v_block(layer, it->second), spec.storage.v_block(layer, id),
                          block_bytes) == 0);
    }
    ++compared;
  }
  // Prompt + output = 14 + 40 tokens: three full blocks.
  QVERIFY2(compared >= 3, qPrintable(QString("only %1 blocks compared").arg(compared)));
}

// The first token after a prompt, sampled at temperature 1 from a top-k 8 distribution: directly
// (the target), and through speculative sampling against a draft token (accept with p(draft),
// else resample from the residual) — the frequencies must fit the target's probabilities.
void SpeculativeTest::speculative_sampling_keeps_the_target_distribution() {
  const HParams& hp = model_->hparams();
  KvStorage storage(hp, 8, 16);
  KvManager kv(8, 16);
  kernels::ThreadPool pool(2);
  ModelRunner runner(*model_, pool, storage);
  const std::vector<TokenId>& prompt = prompts_[3];
  kv.allocate_sequence(0, prompt);
  const auto& blocks = kv.table(0).blocks();
  const std::vector<int32_t> table(blocks.begin(), blocks.end());
  const BatchSequence seq{prompt, 0, table, true};
  std::vector<float> logits;
  runner.run({&seq, 1}, logits);
  SamplingParams params{.temperature = 1.0f, .top_k = 8, .top_p = 1.0f, .min_p = 0.0f, .seed = 0};
  // The target's filtered distribution, computed here from the logits.
  std::vector<std::pair<float, TokenId>> top;
  for (TokenId t = 0; t < hp.n_vocab; ++t) top.push_back({logits[t], t});
  std::partial_sort(top.begin(), top.begin() + 8, top.end(), std::greater<>());
  top.resize(8);
  std::map<TokenId, double> p;
  double z = 0;
  for (const auto& [l, t] : top) z += std::exp(l - top[0].first);
  for (const auto& [l, t] : top) p[t] = std::exp(l - top[0].first) / z;
  const TokenId draft = top[1].second;  // a plausible but not the likeliest token
  constexpr int kDraws = 20000;
  std::map<TokenId, int> counts;
  params.seed = 7;
  Sampler sampler(params);
  for (int i = 0; i < kDraws; ++i) {
    const TokenId t =
        sampler.accept_draft(logits, draft) ? draft : sampler.sample_rejected(logits, draft);
    ++counts[t];
  }
  double chi2 = 0;
  for (const auto& [t, prob] : p) {
    const double expected = prob * kDraws;
    chi2 += (counts[t] - expected) * (counts[t] - expected) / expected;
  }
  for (const auto& [t, n] : counts) QVERIFY2(p.count(t), "a token outside the target's support");
  // 7 degrees of freedom: the 0.999 quantile is 24.3.
  qInfo("chi-square %.2f over 8 tokens (draft token p = %.3f)", chi2, p[draft]);
  QVERIFY2(chi2 < 24.3, qPrintable(QString("chi-square %1").arg(chi2)));
}

QTEST_GUILESS_MAIN(SpeculativeTest)
#include "test_speculative.moc"
