// The proposer (core/speculative/proposer.h) on a CPU device over a small synthetic model, with
// no engine: a Medusa chain is each level's best token of the target's LM head over the head's
// residual block (computed here the plain way: DraftHead::residual, Device::lm_head, the
// largest logit); a tree holds every level's best tokens under every node of the level above;
// context lookup alone drafts the tokens that followed the context's last n-gram, and with a
// head it is merged in as a branch; an adaptive chain reports the length it chose; the
// head-switching policy moves an `auto` request to the better-recorded head when its own falls
// behind, and says so.

#include <QTemporaryDir>
#include <QtTest>
#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include "core/device/device.h"
#include "core/model/synthetic_model.h"
#include "core/speculative/proposer.h"

using namespace tokenfab;

namespace {

std::shared_ptr<const DraftHead> random_medusa(const HParams& hp, const char* name, unsigned seed) {
  DraftHeadInfo info;
  info.name = name;
  info.n_heads = 4;
  info.n_embd = static_cast<int32_t>(hp.n_embd);
  info.n_vocab = static_cast<int32_t>(hp.n_vocab);
  DraftHead head = make_medusa_head(info);
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 0.5f);
  for (auto& w : head.w)
    for (float& x : w) x = noise(rng);
  return std::make_shared<const DraftHead>(std::move(head));
}

// The `n` best tokens of the LM head over row z (ties to the lower id).
std::vector<TokenId> best_tokens(Device& device, const std::vector<float>& z, int32_t n) {
  std::vector<float> logits;
  device.lm_head(z.data(), 1, logits);
  std::vector<TokenId> ids(logits.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<TokenId>(i);
  std::stable_sort(ids.begin(), ids.end(), [&](TokenId a, TokenId b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)];
  });
  ids.resize(static_cast<size_t>(n));
  return ids;
}

}  // namespace

class TestProposer : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void medusa_chain_is_each_levels_best_token();
  void medusa_tree_holds_each_levels_best_tokens();
  void lookup_alone_and_merged_with_a_head();
  void adaptive_chain_reports_its_length();
  void auto_request_switches_to_the_better_recorded_head();

 private:
  std::vector<float> hidden_row(unsigned seed) const;

  QTemporaryDir dir_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<CpuDevice> device_;
};

void TestProposer::initTestCase() {
  QVERIFY(dir_.isValid());
  const std::filesystem::path path = dir_.filePath("mini.gguf").toStdString();
  write_synthetic_llama(path, SyntheticShape::llama_mini(), kernels::WeightType::F32, 7);
  model_ = LlamaModel::load(path);
  device_ = std::make_unique<CpuDevice>(DeviceSpec{}, *model_, 1, 8, 16);
}

std::vector<float> TestProposer::hidden_row(unsigned seed) const {
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  std::vector<float> h(static_cast<size_t>(model_->hparams().n_embd));
  for (float& x : h) x = noise(rng);
  return h;
}

void TestProposer::medusa_chain_is_each_levels_best_token() {
  const auto head = random_medusa(model_->hparams(), "m", 1);
  DraftRequest r;
  r.head = head;
  r.draft_len = 3;
  DraftState s(r);
  s.hidden = hidden_row(2);
  const std::vector<float> h = s.hidden;
  const std::vector<TokenId> context = {1, 2, 3};
  const Proposer::Candidate c{&s, context, {}, {}};
  Proposer proposer(*device_);
  const auto out = proposer.propose(std::span(&c, 1), 0);
  QCOMPARE(out.size(), size_t{1});
  std::vector<TokenId> expected;
  std::vector<float> z(h.size());
  for (int level = 0; level < 3; ++level) {
    head->residual(level, h.data(), 1, z.data());
    expected.push_back(best_tokens(*device_, z, 1).front());
  }
  QCOMPARE(out[0].draft, expected);
  QVERIFY(out[0].parent.empty());  // a chain
  QVERIFY(s.hidden.empty());       // used up
  QVERIFY(!out[0].chosen_length);  // not adaptive
}

void TestProposer::medusa_tree_holds_each_levels_best_tokens() {
  const auto head = random_medusa(model_->hparams(), "m", 3);
  DraftRequest r;
  r.head = head;
  r.tree_shape = {2, 2};
  DraftState s(r);
  s.hidden = hidden_row(4);
  const std::vector<float> h = s.hidden;
  const std::vector<TokenId> context = {5};
  const Proposer::Candidate c{&s, context, {}, {}};
  Proposer proposer(*device_);
  const auto out = proposer.propose(std::span(&c, 1), 0);
  std::vector<std::vector<TokenId>> levels;
  std::vector<float> z(h.size());
  for (int level = 0; level < 2; ++level) {
    head->residual(level, h.data(), 1, z.data());
    levels.push_back(best_tokens(*device_, z, 2));
  }
  std::vector<TokenId> draft;
  std::vector<int32_t> parent;
  build_draft_tree(levels, draft, parent);
  QCOMPARE(out[0].draft, draft);
  QCOMPARE(out[0].parent, parent);
  QCOMPARE(out[0].draft.size(), size_t{6});  // 2 + 2·2
}

void TestProposer::lookup_alone_and_merged_with_a_head() {
  // The context ends with "7 8", which earlier was followed by 9 10 11.
  const std::vector<TokenId> context = {4, 7, 8, 9, 10, 11, 12, 7, 8};
  DraftRequest r;
  r.lookup = 2;
  r.draft_len = 3;
  DraftState alone(r);
  const Proposer::Candidate c{&alone, context, {}, {}};
  Proposer proposer(*device_);
  const auto out = proposer.propose(std::span(&c, 1), 0);
  QCOMPARE(out[0].draft, (std::vector<TokenId>{9, 10, 11}));
  QCOMPARE(out[0].seconds, 0.0);  // copied from the context

  r.head = random_medusa(model_->hparams(), "m", 5);
  DraftState with_head(r);
  with_head.hidden = hidden_row(6);
  const Proposer::Candidate ch{&with_head, context, {}, {}};
  const auto merged = proposer.propose(std::span(&ch, 1), 0);
  // The head's chain of 3, with the lookup chain as a branch where they differ: every lookup
  // token is in the tree on a path from the root.
  QVERIFY(merged[0].draft.size() >= 3);
  for (const TokenId t : {9, 10, 11})
    QVERIFY(std::find(merged[0].draft.begin(), merged[0].draft.end(), t) != merged[0].draft.end());
}

void TestProposer::adaptive_chain_reports_its_length() {
  DraftRequest r;
  r.head = random_medusa(model_->hparams(), "m", 7);
  r.draft_len = 6;  // more than the head's 4 levels
  r.adaptive_draft = true;
  DraftState s(r);
  s.hidden = hidden_row(8);
  const std::vector<TokenId> context = {1};
  const std::vector<int64_t> proposed = {10, 10, 10, 10}, accepted = {9, 8, 7, 6};
  const Proposer::Candidate c{&s, context, proposed, accepted};
  Proposer proposer(*device_);
  const auto out = proposer.propose(std::span(&c, 1), 0);
  QVERIFY(out[0].chosen_length.has_value());
  QCOMPARE(out[0].max_length, 4);  // the head's levels bound the chain
  QVERIFY(*out[0].chosen_length >= 0 && *out[0].chosen_length <= 4);
  QCOMPARE(static_cast<int32_t>(out[0].draft.size()), *out[0].chosen_length);
}

void TestProposer::auto_request_switches_to_the_better_recorded_head() {
  const auto poor = random_medusa(model_->hparams(), "poor", 9);
  const auto good = random_medusa(model_->hparams(), "good", 10);
  DraftRequest r;
  r.head = poor;
  r.candidates = {{poor, 3.0}, {good, 2.5}};
  DraftState s(r);
  QVERIFY(s.head_policy.has_value());
  std::optional<HeadSwitchEvent> event;
  // Every verification emits one token: far below the 3.0 its record promised.
  for (int i = 0; i < 4 * HeadSwitchPolicy::kWindow && !event; ++i)
    event = Proposer::on_verified(s, 1);
  QVERIFY(event.has_value());
  QCOMPARE(event->from, std::string("poor"));
  QCOMPARE(event->to, std::string("good"));
  QCOMPARE(s.head, good);
  QCOMPARE(event->from_record, 3.0);
}

QTEST_GUILESS_MAIN(TestProposer)
#include "test_proposer.moc"
