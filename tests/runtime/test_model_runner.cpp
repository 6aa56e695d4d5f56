// The batched ModelRunner over a paged KV pool: a batch gives every sequence the tokens it would
// get alone (greedy), whatever else shares the pass — other prompts' prefill chunks or other
// sequences' decode steps — and agrees with the single-sequence contiguous forward pass.

#include <QtTest>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "tests/common/default_model.h"
#include "core/common/error.h"
#include "core/kvcache/kv_manager.h"
#include "core/model/llama_forward.h"
#include "core/model/llama_model.h"
#include "core/model/model_files.h"
#include "core/runtime/model_runner.h"
#include "core/tokenizer/tokenizer.h"

using namespace tokenfab;

namespace {

constexpr int32_t kBlockSize = 16;
constexpr int32_t kBlocks = 128;
constexpr int kDecodeSteps = 10;

TokenId argmax(const float* x, int64_t n) {
  return static_cast<TokenId>(std::max_element(x, x + n) - x);
}

// One sequence's state while a test drives the runner by hand (the scheduler's job later).
struct Seq {
  SequenceId id;
  std::vector<TokenId> tokens;  // every token whose KV is (or is being) in the pool
  int64_t computed = 0;         // tokens whose KV is in the pool
  std::vector<TokenId> generated;
};

}  // namespace

class ModelRunnerTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void batch_equals_single_runs();
  void mixed_prefill_chunks_and_decodes();
  void agrees_with_contiguous_forward();
  void rejects_bad_batches();

 private:
  // Runs one step: each entry of `work` is (sequence, how many of its pending tokens to compute).
  // Returns the logits of the sequences that finished their pending tokens, in order.
  void step(ModelRunner& runner, KvManager& kv, std::vector<std::pair<Seq*, int64_t>> work);
  std::vector<std::vector<TokenId>> generate_alone();
  std::vector<Seq> admit_all(KvManager& kv);  // every prompt as a sequence, its blocks allocated

  std::unique_ptr<LlamaModel> model_;
  std::optional<Tokenizer> tokenizer_;
  std::unique_ptr<kernels::ThreadPool> pool_;
  std::vector<std::vector<TokenId>> prompts_;
  std::vector<std::vector<TokenId>> alone_;  // each prompt's greedy tokens, run alone
};

void ModelRunnerTest::initTestCase() {
  TOKENFAB_LOAD_DEFAULT_MODEL(model_, tokenizer_);
  pool_ = std::make_unique<kernels::ThreadPool>(2);
  // Prompt lengths chosen to land inside, on and across block boundaries.
  for (const char* text :
       {"The capital of France is", "Once upon a time, in a small village by the sea, there lived",
        "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
        "Water boils at one hundred degrees Celsius at sea level. At the top of a high mountain, "
        "where the air pressure is lower, it boils at a lower temperature, which is why cooking "
        "pasta takes"})
    prompts_.push_back(tokenizer_->encode(text, false, false));
  alone_ = generate_alone();
}

std::vector<Seq> ModelRunnerTest::admit_all(KvManager& kv) {
  std::vector<Seq> seqs;
  for (size_t i = 0; i < prompts_.size(); ++i) {
    seqs.push_back({static_cast<SequenceId>(i), prompts_[i], 0, {}});
    if (!kv.allocate_sequence(seqs.back().id, seqs.back().tokens)) qFatal("the test pool is too small");
  }
  return seqs;
}

void ModelRunnerTest::step(ModelRunner& runner, KvManager& kv,
                           std::vector<std::pair<Seq*, int64_t>> work) {
  std::vector<std::vector<int32_t>> tables;
  tables.reserve(work.size());
  std::vector<BatchSequence> batch;
  for (auto& [s, n] : work) {
    const auto& blocks = kv.table(s->id).blocks();
    tables.emplace_back(blocks.begin(), blocks.end());
    const bool finishes = s->computed + n == static_cast<int64_t>(s->tokens.size());
    batch.push_back({std::span<const int32_t>(s->tokens).subspan(static_cast<size_t>(s->computed),
                                                                 static_cast<size_t>(n)),
                     s->computed, tables.back(), finishes});
  }
  std::vector<float> logits;
  runner.run(batch, logits);
  const int64_t n_vocab = model_->hparams().n_vocab;
  size_t next = 0;
  for (auto& [s, n] : work) {
    s->computed += n;
    if (s->computed < static_cast<int64_t>(s->tokens.size())) continue;
    const TokenId t = argmax(logits.data() + next++ * n_vocab, n_vocab);
    s->generated.push_back(t);
    s->tokens.push_back(t);
    const AppendResult r = kv.append(s->id, t);
    QCOMPARE(static_cast<int>(r.status), static_cast<int>(AppendStatus::kOk));
  }
}

// Each prompt alone: one prefill pass, then one decode pass per token.
std::vector<std::vector<TokenId>> ModelRunnerTest::generate_alone() {
  std::vector<std::vector<TokenId>> out;
  for (size_t i = 0; i < prompts_.size(); ++i) {
    KvStorage storage(model_->hparams(), kBlocks, kBlockSize);
    KvManager kv(kBlocks, kBlockSize);
    ModelRunner runner(*model_, *pool_, storage);
    Seq s{static_cast<SequenceId>(i), prompts_[i], 0, {}};
    kv.allocate_sequence(s.id, s.tokens);
    step(runner, kv, {{&s, static_cast<int64_t>(s.tokens.size())}});
    for (int k = 1; k < kDecodeSteps; ++k) step(runner, kv, {{&s, 1}});
    out.push_back(s.generated);
  }
  return out;
}

// All prompts prefilled in one pass, then all decoded together, step by step.
void ModelRunnerTest::batch_equals_single_runs() {
  KvStorage storage(model_->hparams(), kBlocks, kBlockSize);
  KvManager kv(kBlocks, kBlockSize);
  ModelRunner runner(*model_, *pool_, storage);
  std::vector<Seq> seqs = admit_all(kv);
  std::vector<std::pair<Seq*, int64_t>> prefill;
  for (auto& s : seqs) prefill.push_back({&s, static_cast<int64_t>(s.tokens.size())});
  step(runner, kv, prefill);
  for (int k = 1; k < kDecodeSteps; ++k) {
    std::vector<std::pair<Seq*, int64_t>> decode;
    for (auto& s : seqs) decode.push_back({&s, 1});
    step(runner, kv, decode);
  }
  for (size_t i = 0; i < seqs.size(); ++i) QCOMPARE(seqs[i].generated, alone_[i]);
  QCOMPARE(QString::fromStdString(kv.check_invariants()), QString());
}

// The last prompt is read in chunks of 8 tokens while the others decode in the same passes
// (chunked prefill inside continuous batching).
void ModelRunnerTest::mixed_prefill_chunks_and_decodes() {
  KvStorage storage(model_->hparams(), kBlocks, kBlockSize);
  KvManager kv(kBlocks, kBlockSize);
  ModelRunner runner(*model_, *pool_, storage);
  std::vector<Seq> seqs = admit_all(kv);
  Seq& late = seqs.back();
  std::vector<std::pair<Seq*, int64_t>> first;
  for (size_t i = 0; i + 1 < seqs.size(); ++i)
    first.push_back({&seqs[i], static_cast<int64_t>(seqs[i].tokens.size())});
  first.push_back({&late, 8});
  step(runner, kv, first);
  while (std::any_of(seqs.begin(), seqs.end(), [](const Seq& s) { return s.generated.size() < kDecodeSteps; })) {
    std::vector<std::pair<Seq*, int64_t>> work;
    for (auto& s : seqs) {
      if (s.generated.size() >= kDecodeSteps) continue;
      const int64_t pending = static_cast<int64_t>(s.tokens.size()) - s.computed;
      work.push_back({&s, std::min<int64_t>(pending, 8)});
    }
    step(runner, kv, work);
  }
  for (size_t i = 0; i < seqs.size(); ++i) QCOMPARE(seqs[i].generated, alone_[i]);
}

// The paged batch and the contiguous single-sequence pass compute the same function; their
// attention sums run in different orders, so the logits agree to the tolerance measured for that
// (see test_model: a 1-ulp change flips some 8-bit activation roundings; bound 3.0 on logits
// of ~15–25), and the argmax agrees wherever the top two are further apart than that.
void ModelRunnerTest::agrees_with_contiguous_forward() {
  const int64_t n_vocab = model_->hparams().n_vocab;
  for (const auto& prompt : prompts_) {
    LlamaForward forward(*model_, *pool_);
    KvCache cache = forward.make_cache();
    std::vector<float> expected;
    forward.forward(prompt, cache, LogitsFor::LastToken, expected);

    KvStorage storage(model_->hparams(), kBlocks, kBlockSize);
    KvManager kv(kBlocks, kBlockSize);
    ModelRunner runner(*model_, *pool_, storage);
    kv.allocate_sequence(0, prompt);
    const auto& blocks = kv.table(0).blocks();
    const std::vector<int32_t> table(blocks.begin(), blocks.end());
    const BatchSequence seq{prompt, 0, table, true};
    std::vector<float> got;
    runner.run({&seq, 1}, got);
    double worst = 0;
    for (int64_t i = 0; i < n_vocab; ++i) worst = std::max(worst, std::abs(double(got[i]) - expected[i]));
    qInfo("paged vs contiguous prefill (%zu tokens): max |Δ logit| %.3g", prompt.size(), worst);
    QVERIFY(worst <= 3.0);
    std::vector<float> sorted(expected);
    std::nth_element(sorted.begin(), sorted.begin() + 1, sorted.end(), std::greater<float>());
    if (sorted[0] - sorted[1] > 6.0) QCOMPARE(argmax(got.data(), n_vocab), argmax(expected.data(), n_vocab));
  }
}

void ModelRunnerTest::rejects_bad_batches() {
  KvStorage storage(model_->hparams(), 4, kBlockSize);
  ModelRunner runner(*model_, *pool_, storage);
  std::vector<float> logits;
  const std::vector<int32_t> tokens(20, 100);
  const std::vector<int32_t> one_block = {0};
  const BatchSequence too_short{tokens, 0, one_block, true};
  QVERIFY_THROWS_EXCEPTION(Error, runner.run({&too_short, 1}, logits));
  const std::vector<int32_t> bad_token = {1 << 30};
  const BatchSequence out_of_vocab{bad_token, 0, one_block, true};
  QVERIFY_THROWS_EXCEPTION(Error, runner.run({&out_of_vocab, 1}, logits));
  const std::vector<int32_t> bad_block = {7};
  const BatchSequence outside_pool{std::span<const int32_t>(tokens).first(4), 0, bad_block, true};
  QVERIFY_THROWS_EXCEPTION(Error, runner.run({&outside_pool, 1}, logits));
}

QTEST_GUILESS_MAIN(ModelRunnerTest)
#include "test_model_runner.moc"
