// Draft-head training on the default model (SmolLM2-135M-Instruct, Q4_1): the trace recorder
// records what the ModelRunner computes and generates what greedy decoding generates, a short
// self-distillation run raises the simulated ACCEPT/STEP over the untrained head, and an mtp
// head's rollout rows teach the later steps of its chain; the quantization study's generating
// evaluation measures a re-quantized target beside the model's own.

#include <QTemporaryDir>
#include <QtTest>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/common/error.h"
#include "core/kvcache/kv_manager.h"
#include "core/model/llama_model.h"
#include "core/model/model_files.h"
#include "core/runtime/kv_storage.h"
#include "core/runtime/model_runner.h"
#include "core/storage/database.h"
#include "core/storage/registry.h"
#include "core/tokenizer/chat_template.h"
#include "core/tokenizer/tokenizer.h"
#include "core/tokenizer/utf8.h"
#include "core/training/generation_eval.h"
#include "core/training/head_eval.h"
#include "core/training/head_training_job.h"
#include "core/training/prompt_writer.h"
#include "core/training/trace_recorder.h"
#include "core/training/trainer.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/common/default_model.h"

using namespace tokenfab;

namespace {

// Prompts written for this test: a mix of prose, facts, instructions and code.
const char* const kPrompts[] = {
    "The history of the printing press begins",
    "To bake a simple loaf of bread, you need flour, water, salt and",
    "def is_prime(n):\n    if n < 2:\n        return False\n",
    "The three primary colors are",
    "Photosynthesis is the process by which plants",
    "Dear team, I am writing to let you know that the meeting on Friday",
    "for (int i = 0; i < 10; ++i) {\n",
    "The largest planet in our solar system is",
    "A good way to learn a new language is to",
    "Once upon a time, a young fox lived at the edge of a forest. One morning,",
    "import numpy as np\n\ndef normalize(v):\n",
    "The French Revolution started in 1789 when",
    "Here are five tips for staying productive while working from home:\n1.",
    "Water is made of two elements:",
    "SELECT name, age FROM users WHERE",
    "The speed of light in a vacuum is about",
    "In mathematics, a prime number is",
    "My favourite thing about autumn is",
    "The mitochondria is often called the powerhouse of the cell because",
    "class Stack:\n    def __init__(self):\n",
    "The recipe calls for two cups of sugar, but",
    "Machine learning is a field of computer science that",
    "The old lighthouse keeper climbed the stairs and",
    "To change a flat tire, first",
};

TokenId argmax(const float* x, int64_t n) {
  return static_cast<TokenId>(std::max_element(x, x + n) - x);
}

// Greedy decoding of one prompt alone on a ModelRunner: prefill, then one pass per token. Returns
// the argmax at each step, and the hidden states and logits that produced them. With `forced`,
// the text goes on with forced[step] instead of the argmax (a sampled continuation replayed).
struct Alone {
  std::vector<TokenId> tokens;
  std::vector<float> hidden, logits;
};

Alone generate_alone(const LlamaModel& model, kernels::ThreadPool& pool,
                     const std::vector<TokenId>& prompt, int n, const Tokenizer& tok,
                     std::span<const TokenId> forced = {}) {
  constexpr int32_t kBlocks = 64;
  KvStorage storage(model.hparams(), kBlocks, 16);
  KvManager kv(kBlocks, 16);
  ModelRunner runner(model, pool, storage);
  kv.allocate_sequence(0, prompt);
  std::vector<TokenId> seq = prompt;
  int64_t computed = 0;
  Alone out;
  std::vector<float> logits, hidden;
  for (int step = 0; step < n; ++step) {
    const auto& blocks = kv.table(0).blocks();
    const std::vector<int32_t> table(blocks.begin(), blocks.end());
    const BatchSequence s{std::span<const int32_t>(seq).subspan(size_t(computed)), computed, table,
                          true};
    runner.run({&s, 1}, logits, &hidden);
    computed = int64_t(seq.size());
    const TokenId t = argmax(logits.data(), int64_t(logits.size()));
    out.tokens.push_back(t);
    out.hidden.insert(out.hidden.end(), hidden.begin(), hidden.end());
    out.logits.insert(out.logits.end(), logits.begin(), logits.end());
    const TokenId chosen = forced.empty() ? t : forced[size_t(step)];
    if (tok.is_end_of_generation(chosen) || (!forced.empty() && step + 1 == int(forced.size())))
      break;
    seq.push_back(chosen);
    kv.append(0, chosen);
  }
  return out;
}

}  // namespace

class TrainingModelTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void recorder_matches_model();
  void recorder_keeps_the_text_s_next_tokens();
  void recorder_refills_finished_slots();
  void recorder_taps_leave_the_rest_unchanged();
  void simulated_chains_stay_on_the_greedy_path();
  void training_data_parts_are_cached_apart();
  void training_run_keeps_its_curve();
  void training_curve_read_from_any_summary();
  void openings_are_the_first_words_as_written();
  void model_writes_prompts_like_its_examples();
  void training_improves_acceptance_data();
  void training_improves_acceptance();
  void rollout_rows_train_later_steps();
  void early_stopping_waits_for_the_second_half();
  void generation_eval_on_a_requantized_target();

 private:
  const TraceSet& traces() {
    if (!traces_) {
      QElapsedTimer timer;
      timer.start();
      TraceOptions o{8, 64, 2, 12};
      o.taps = true;  // heads with taps read them, the others ignore them
      traces_ =
          record_continuations(*model_, encode_prompts(std::size(kPrompts)), o,
                               [&](TokenId t) { return tokenizer_->is_end_of_generation(t); }, {});
      qInfo("recorded %lld positions in %lld sequences in %.1f s", (long long)traces_->n_pos(),
            (long long)traces_->n_sequences(), timer.elapsed() / 1000.0);
    }
    return *traces_;
  }
  // 24 short continuations (~1100 training positions) are far less data than a domain corpus:
  // the heads overfit within a few dozen steps (training loss → 0 while validation loss climbs
  // back), so these runs use a gentler lr than the default and rely on the trainer returning
  // the best evaluated head.
  static TrainOptions small_run_options() {
    TrainOptions o;
    o.steps = 150;
    o.lr = 1e-3f;
    o.eval_every = 25;
    o.validation = 0.25f;
    o.patience = 0;
    o.threads = 2;
    o.seed = 1;
    return o;
  }
  DraftHeadInfo head_info(const QString& type) const {
    DraftHeadInfo info;
    info.type = type == QStringLiteral("mtp-taps") ? "mtp" : type.toStdString();
    if (type == QStringLiteral("mtp-taps")) info.taps = draft_tap_layers(model_->hparams().n_layer);
    info.name = "test-head";
    info.domain = "mixed";
    info.base_model_sha256 = EmbeddedModel::kSha256;
    info.n_embd = int32_t(model_->hparams().n_embd);
    info.n_vocab = int32_t(model_->hparams().n_vocab);
    return info;
  }

  std::vector<std::vector<TokenId>> encode_prompts(size_t n) const {
    std::vector<std::vector<TokenId>> out;
    for (size_t i = 0; i < n; ++i)
      out.push_back(tokenizer_->encode(kPrompts[i], tokenizer_->add_bos_token(), false));
    return out;
  }

  std::unique_ptr<LlamaModel> model_;
  std::optional<Tokenizer> tokenizer_;
  std::optional<TraceSet> traces_;  // recorded once, by traces()
};

void TrainingModelTest::initTestCase() {
  TOKENFAB_LOAD_DEFAULT_MODEL(model_, tokenizer_);
}

// Five prompts, three per pass (so two passes of different sizes): each recorded sequence is the
// prompt's greedy continuation, and each row's hidden state, argmax and top-k are what a runner
// decoding that prompt alone computes.
void TrainingModelTest::recorder_matches_model() {
  constexpr int kContinuation = 12, kTopK = 5;
  const auto prompts = encode_prompts(5);
  const TraceOptions options{kTopK, kContinuation, 2, 3};
  int64_t last_done = 0, last_total = 0;
  const TraceSet traces = record_continuations(
      *model_, prompts, options, [&](TokenId t) { return tokenizer_->is_end_of_generation(t); },
      [&](int64_t done, int64_t total) {
        last_done = done;
        last_total = total;
        return true;
      });
  QCOMPARE(last_total, int64_t(5 * kContinuation));
  QCOMPARE(last_done, last_total);
  QCOMPARE(traces.n_sequences(), int64_t(5));
  QCOMPARE(traces.top_k, kTopK);
  const int64_t d = model_->hparams().n_embd, v = model_->hparams().n_vocab;

  kernels::ThreadPool pool(2);
  double worst_hidden = 0.0;
  for (int s = 0; s < 5; ++s) {
    const Alone alone = generate_alone(*model_, pool, prompts[s], kContinuation, *tokenizer_);
    const int64_t b = traces.seq_begin[s], e = traces.seq_begin[s + 1];
    const std::vector<TokenId> recorded(traces.pred.begin() + b, traces.pred.begin() + e);
    QCOMPARE(recorded, alone.tokens);  // the continuation is the greedy one
    QVERIFY(std::equal(traces.next.begin() + b, traces.next.begin() + e, recorded.begin()));
    for (int64_t j = 0; j < e - b; ++j) {
      const float* l = alone.logits.data() + j * v;
      QCOMPARE(traces.pred[b + j], argmax(l, v));
      QCOMPARE(traces.topk_ids[(b + j) * kTopK], traces.pred[b + j]);
      // Top-k: descending logits, probabilities from the softmax of the same logits.
      const double mx = l[traces.pred[b + j]];
      double sum = 0.0;
      for (int64_t q = 0; q < v; ++q) sum += std::exp(double(l[q]) - mx);
      for (int k = 0; k < kTopK; ++k) {
        const TokenId id = traces.topk_ids[(b + j) * kTopK + k];
        const double want = std::exp(double(l[id]) - mx) / sum;
        QVERIFY(std::abs(traces.topk_probs[(b + j) * kTopK + k] - want) <= 1e-4 * want + 1e-7);
        if (k > 0) QVERIFY(l[id] <= l[traces.topk_ids[(b + j) * kTopK + k - 1]]);
      }
      for (int64_t i = 0; i < d; ++i)
        worst_hidden =
            std::max(worst_hidden,
                     double(std::abs(traces.hidden[(b + j) * d + i] - alone.hidden[j * d + i])));
    }
  }
  qInfo("recorder vs runner alone: max |Δ hidden| %.3g", worst_hidden);
  // Each row's arithmetic does not depend on the other rows of its pass (per-row activation
  // quantization, per-sequence attention), so the batched recorder reproduces the lone run.
  QCOMPARE(worst_hidden, 0.0);
}

// Sampled continuations: each sequence's next tokens are a continuation drawn from the target
// (reproducible from the seed, off the greedy path somewhere), and each row's argmax and hidden
// state are what a runner replaying those tokens alone computes. Corpus traces: next is the
// text's own next token, across window ends too, and the argmax only after the text's last one.
void TrainingModelTest::recorder_keeps_the_text_s_next_tokens() {
  constexpr int kContinuation = 12;
  const auto prompts = encode_prompts(5);
  TraceOptions options{4, kContinuation, 2, 3};
  options.sampling = SamplingParams{};
  options.sampling.temperature = 1.0f;
  options.sampling.seed = 7;
  const auto eog = [&](TokenId t) { return tokenizer_->is_end_of_generation(t); };
  const TraceSet traces = record_continuations(*model_, prompts, options, eog, {});
  QCOMPARE(traces.n_sequences(), int64_t(5));
  QVERIFY(record_continuations(*model_, prompts, options, eog, {}).next == traces.next);
  int64_t off_path = 0;
  kernels::ThreadPool pool(2);
  for (int s = 0; s < 5; ++s) {
    const int64_t b = traces.seq_begin[s], e = traces.seq_begin[s + 1];
    const std::vector<TokenId> drawn(traces.next.begin() + b, traces.next.begin() + e);
    const Alone alone =
        generate_alone(*model_, pool, prompts[s], kContinuation, *tokenizer_, drawn);
    QCOMPARE(int64_t(alone.tokens.size()), e - b);
    QVERIFY(std::equal(alone.tokens.begin(), alone.tokens.end(), traces.pred.begin() + b));
    QVERIFY(std::equal(alone.hidden.begin(), alone.hidden.end(),
                       traces.hidden.begin() + b * model_->hparams().n_embd));
    for (int64_t j = b; j < e; ++j) off_path += !traces.greedy_at(j);
  }
  qInfo("sampled at temperature 1: %lld of %lld positions off the greedy path", (long long)off_path,
        (long long)traces.n_pos());
  QVERIFY(off_path > 0);

  const std::vector<TokenId> text = tokenizer_->encode(
      "Rivers carry water from the hills to the sea, and along the way they shape valleys, feed "
      "fields and give towns a reason to grow where they bend.",
      false, false);
  QVERIFY(text.size() > 20);
  const TraceSet corpus = record_corpus(*model_, text, 8, TraceOptions{4, 1, 2, 3}, {});
  QCOMPARE(corpus.n_pos(), int64_t(text.size()) - (text.size() % 8 == 1 ? 1 : 0));
  for (int64_t i = 0; i < corpus.n_pos(); ++i)
    QCOMPARE(corpus.next[i], size_t(i) + 1 < text.size() ? text[i + 1] : corpus.pred[i]);
}

// Continuations that stop at different lengths free their slots at different passes, and the
// next prompts take them while the others go on: with one, two or three sequences live at once,
// each sampled sequence is the same, recorded in prompt order (the seed of prompt j is seed + j,
// whichever slot it runs in). A cancelled run keeps the started prompts' sequences, in order.
void TrainingModelTest::recorder_refills_finished_slots() {
  constexpr int kContinuation = 10;
  const auto prompts = encode_prompts(6);
  TraceOptions options{3, kContinuation, 2, 1};
  options.sampling = SamplingParams{};
  options.sampling.temperature = 1.0f;
  options.sampling.seed = 11;
  options.taps = true;
  // Ends a continuation at the first token id divisible by 5: about one token in five.
  const auto stop = [](TokenId t) { return t % 5 == 0; };
  const TraceSet one = record_continuations(*model_, prompts, options, stop, {});
  QCOMPARE(one.n_sequences(), int64_t(6));
  std::set<int64_t> lengths;
  for (int s = 0; s < 6; ++s) lengths.insert(one.seq_begin[s + 1] - one.seq_begin[s]);
  qInfo("sequence lengths: %zu distinct", lengths.size());
  QVERIFY(lengths.size() > 1);  // the slots were freed at different passes
  for (const int32_t batch : {2, 3}) {
    options.batch = batch;
    const TraceSet many = record_continuations(*model_, prompts, options, stop, {});
    QCOMPARE(many.seq_begin, one.seq_begin);
    QCOMPARE(many.next, one.next);
    QCOMPARE(many.pred, one.pred);
    QCOMPARE(many.topk_ids, one.topk_ids);
    QCOMPARE(many.topk_probs, one.topk_probs);
    QCOMPARE(many.hidden, one.hidden);
    QCOMPARE(many.taps, one.taps);
  }
  // Cancelled after three passes: the prompts started by then, in order, each cut where it stood.
  options.batch = 3;
  int passes = 0;
  const TraceSet cut = record_continuations(*model_, prompts, options, stop,
                                            [&](int64_t, int64_t) { return ++passes < 3; });
  QCOMPARE(passes, 3);
  QVERIFY(cut.n_sequences() >= 3 && cut.n_pos() < one.n_pos());
  for (int64_t s = 0; s < cut.n_sequences(); ++s) {
    const int64_t b = cut.seq_begin[s], n = cut.seq_begin[s + 1] - b;
    QVERIFY(n >= 1 && n <= one.seq_begin[s + 1] - one.seq_begin[s]);
    QVERIFY(std::equal(cut.next.begin() + b, cut.next.begin() + b + n,
                       one.next.begin() + one.seq_begin[s]));
  }
}

// The simulated chain counts only positions where the text goes on with the target's own token,
// so a position whose next token was replaced is not simulated (a Medusa head's drafts do not
// read the text, so nothing else changes).
void TrainingModelTest::simulated_chains_stay_on_the_greedy_path() {
  TraceSet traces = this->traces();
  const DraftHead head = make_medusa_head(head_info(QStringLiteral("medusa")));
  kernels::ThreadPool pool(2);
  TransformerPass pass(*model_, pool);
  std::vector<int64_t> all(size_t(traces.n_pos()));
  std::iota(all.begin(), all.end(), 0);
  const std::vector<int64_t> ends = traces.sequence_ends();
  const HeadEvaluation greedy = evaluate_head(pass, head, traces, ends, all);
  int64_t replaced = 0;
  for (int64_t i = 0; i < traces.n_pos(); i += 7) {
    traces.next[size_t(i)] = (traces.pred[size_t(i)] + 1) % TokenId(model_->hparams().n_vocab);
    replaced += i + head.n_heads() < ends[size_t(i)];
  }
  const HeadEvaluation off = evaluate_head(pass, head, traces, ends, all);
  QVERIFY(replaced > 0);
  QCOMPARE(off.n_chain_positions, greedy.n_chain_positions - replaced);
}

// A run's data come in parts (the greedy continuations, each sampled pass, the corpus), each
// traced once and cached on its own: a second run that adds a sampled pass and a file to the
// first run's prompts reads the greedy part from the cache and records only the new ones.
void TrainingModelTest::training_data_parts_are_cached_apart() {
  QTemporaryDir home;
  QVERIFY(home.isValid());
  qputenv("TOKENFAB_HOME", home.path().toUtf8());
  const std::filesystem::path traces_dir = user_data_dir() / "traces";
  const auto trace_files = [&] {
    size_t n = 0;
    for (const auto& e : std::filesystem::directory_iterator(traces_dir)) n += e.is_regular_file();
    return n;
  };
  HeadTrainingRequest r;
  r.name = "parts-1";
  r.domain = "code";
  r.prompt_set = "code";
  r.type = "mtp";
  r.max_prompts = 4;
  r.continuation = 8;
  r.steps = 2;
  r.heads = 2;
  r.batch = 16;
  r.threads = 2;
  std::vector<std::string> messages;
  const auto progress = [&](const HeadTrainingProgress& p) {
    if (!p.message.empty()) messages.push_back(p.message);
    return true;
  };
  const HeadTrainingResult first = run_head_training(*model_, *tokenizer_, r, progress);
  QCOMPARE(trace_files(), size_t(1));

  const std::filesystem::path notes = std::filesystem::path(home.path().toStdString()) / "notes.py";
  std::ofstream(notes) << "def area(width, height):\n    return width * height\n";
  r.name = "parts-2";
  r.samples = 1;
  r.corpus = {notes.string()};
  messages.clear();
  const HeadTrainingResult second = run_head_training(*model_, *tokenizer_, r, progress);
  QCOMPARE(trace_files(), size_t(3));
  QCOMPARE(std::count_if(
               messages.begin(), messages.end(),
               [](const std::string& m) { return m.find("from the cache") != std::string::npos; }),
           std::ptrdiff_t(1));
  const int64_t greedy = first.report["trace_positions"].get<int64_t>();
  const int64_t corpus = int64_t(
      tokenizer_->encode("def area(width, height):\n    return width * height\n", false, false)
          .size());
  // The sampled pass: four sequences of at most eight positions each.
  QVERIFY(second.report["trace_positions"].get<int64_t>() > greedy + corpus);
  QVERIFY(second.report["trace_positions"].get<int64_t>() <= greedy + 4 * 8 + corpus);

  // Prompts the target writes: cached as a file of their own, their greedy and sampled parts
  // traced apart from the set's (which come from the cache), and all of it reused by a rerun.
  r.name = "parts-3";
  r.self_prompts = 3;
  messages.clear();
  const HeadTrainingResult third = run_head_training(*model_, *tokenizer_, r, progress);
  const int64_t written = third.report["written_prompts"].get<int64_t>();
  QVERIFY(written >= 0 && written <= 3);
  QCOMPARE(trace_files(), size_t(3 + 1 + (written > 0 ? 2 : 0)));
  QCOMPARE(std::count_if(
               messages.begin(), messages.end(),
               [](const std::string& m) { return m.find("from the cache") != std::string::npos; }),
           std::ptrdiff_t(3));
  QVERIFY(third.report["trace_positions"].get<int64_t>() >=
          second.report["trace_positions"].get<int64_t>() + written);
  QVERIFY(third.report["trace_positions"].get<int64_t>() <=
          second.report["trace_positions"].get<int64_t>() + 2 * written * 8);
  r.name = "parts-4";
  messages.clear();
  const HeadTrainingResult fourth = run_head_training(*model_, *tokenizer_, r, progress);
  QCOMPARE(trace_files(), size_t(3 + 1 + (written > 0 ? 2 : 0)));
  QVERIFY(fourth.report["trace_cached"].get<bool>());
  QCOMPARE(fourth.report["written_prompts"].get<int64_t>(), written);
  QCOMPARE(fourth.report["trace_positions"], third.report["trace_positions"]);
  QVERIFY(std::any_of(messages.begin(), messages.end(), [](const std::string& m) {
    return m.find("written prompts: ") == 0 && m.find("from the cache") != std::string::npos;
  }));
  qunsetenv("TOKENFAB_HOME");
}

// A training run keeps its evaluations in the head's summary (the registry's row and the head
// file alike): one point per evaluation step, each with the mean of the training losses reported
// since the previous one, and the validation loss and simulated ACCEPT/STEP reported at it.
void TrainingModelTest::training_run_keeps_its_curve() {
  QTemporaryDir home;
  QVERIFY(home.isValid());
  qputenv("TOKENFAB_HOME", home.path().toUtf8());
  HeadTrainingRequest r;
  r.name = "curve";
  r.domain = "code";
  r.prompt_set = "code";
  r.max_prompts = 4;
  r.continuation = 8;
  r.steps = 5;  // evaluations at steps 0 and 5 (every 50, and the last)
  r.heads = 2;
  r.batch = 16;
  r.threads = 2;
  std::vector<HeadTrainingProgress> reports;
  const HeadTrainingResult result =
      run_head_training(*model_, *tokenizer_, r, [&](const HeadTrainingProgress& p) {
        if (p.phase == "training") reports.push_back(p);
        return true;
      });
  std::vector<int32_t> steps;
  std::vector<double> means, val, accept;
  double sum = 0.0;
  int n = 0;
  for (const HeadTrainingProgress& p : reports) {
    if (p.step > 0) {
      sum += p.loss;
      ++n;
    }
    if (!p.val_loss) continue;
    steps.push_back(p.step);
    means.push_back(n ? sum / n : p.loss);
    val.push_back(*p.val_loss);
    accept.push_back(p.sim_accept_per_step.value());
    sum = 0.0;
    n = 0;
  }
  QCOMPARE(steps, (std::vector<int32_t>{0, 5}));

  const auto db = Database::open_default();
  Registry registry(*db);
  const auto record = registry.find_head("curve");
  QVERIFY(record.has_value());
  const DraftHead head = load_draft_head(registry.head_file(*record));
  for (const std::string& summary :
       {record->summary_json, head.info.summary_json, result.report.dump()}) {
    const TrainingCurve c = TrainingCurve::from_summary(summary);
    QCOMPARE(c.step, steps);
    QCOMPARE(c.val_loss, val);
    QCOMPARE(c.accept, accept);
    QCOMPARE(c.train_loss.size(), means.size());
    for (size_t i = 0; i < means.size(); ++i) QVERIFY(std::abs(c.train_loss[i] - means[i]) < 1e-12);
  }
  qunsetenv("TOKENFAB_HOME");
}

// A summary is shown, not trusted: no curve, a summary that is not JSON, or a curve of the wrong
// shape reads as no curve; a well-formed one reads back as written.
void TrainingModelTest::training_curve_read_from_any_summary() {
  TrainingCurve c;
  c.step = {0, 50, 100};
  c.train_loss = {9.5, 4.25, 3.0};
  c.val_loss = {9.5, 4.5, 3.5};
  c.accept = {1.0, 1.5, 1.75};
  const nlohmann::json summary = {{"val_loss", 3.5}, {"curve", c.to_json()}};
  const TrainingCurve back = TrainingCurve::from_summary(summary.dump());
  QCOMPARE(back.step, c.step);
  QCOMPARE(back.train_loss, c.train_loss);
  QCOMPARE(back.val_loss, c.val_loss);
  QCOMPARE(back.accept, c.accept);
  QVERIFY(TrainingCurve::from_summary("{}").empty());
  QVERIFY(TrainingCurve::from_summary("").empty());
  QVERIFY(TrainingCurve::from_summary("not json").empty());
  QVERIFY(TrainingCurve::from_summary("[1, 2]").empty());
  QVERIFY(TrainingCurve::from_summary(R"({"curve": 3})").empty());
  nlohmann::json short_column = summary;
  short_column["curve"]["accept"] = {1.0, 1.5};
  QVERIFY(TrainingCurve::from_summary(short_column.dump()).empty());
  nlohmann::json wrong_type = summary;
  wrong_type["curve"]["step"] = {"zero", "one", "two"};
  QVERIFY(TrainingCurve::from_summary(wrong_type.dump()).empty());
  nlohmann::json missing = summary;
  missing["curve"].erase("val_loss");
  QVERIFY(TrainingCurve::from_summary(missing.dump()).empty());
}

// The opening of a prompt: its first words as written, inner spacing kept, nothing after them.
void TrainingModelTest::openings_are_the_first_words_as_written() {
  QCOMPARE(opening_words("  Write a  Python\nfunction ", 2), std::string("Write a"));
  QCOMPARE(opening_words("  Write a  Python\nfunction ", 3), std::string("Write a  Python"));
  QCOMPARE(opening_words("  Write a  Python\nfunction ", 4),
           std::string("Write a  Python\nfunction"));
  QCOMPARE(opening_words("  Write a  Python\nfunction ", 9),
           std::string("Write a  Python\nfunction"));
}

// The target writes requests like its examples: each opens with an example's first words and is
// one the target ended itself (valid UTF-8, no control token in it), new, of bounded length, and
// the same requests come back for the same seed (one example is Korean: its characters span
// tokens).
void TrainingModelTest::model_writes_prompts_like_its_examples() {
  const std::vector<std::string> examples = {
      "Write a Python function that returns the second largest number in a list.",
      "Explain how a hash table handles collisions, with a short example in C.",
      "Continue this story: The lighthouse had been dark for eleven years.",
      "한국의 전통 음식 하나를 골라 집에서 만드는 방법을 설명해 주세요."};
  const ChatTemplate tmpl = ChatTemplate::from_gguf(model_->file());
  PromptWriting w;
  w.count = 12;
  w.max_tokens = 64;
  w.threads = 2;
  w.seed = 5;
  int64_t last_done = 0, last_total = 0;
  const std::vector<std::string> written =
      write_prompts(*model_, *tokenizer_, tmpl, examples, w, [&](int64_t done, int64_t total) {
        last_done = done;
        last_total = total;
        return true;
      });
  QCOMPARE(last_total, int64_t(12 * 64));
  QCOMPARE(last_done, last_total);
  QVERIFY2(written.size() >= 3 && written.size() <= 12, std::to_string(written.size()).c_str());
  std::set<std::string> distinct(written.begin(), written.end());
  QCOMPARE(distinct.size(), written.size());
  for (const std::string& text : written) {
    QVERIFY2(
        std::any_of(examples.begin(), examples.end(),
                    [&](const std::string& e) { return text.rfind(opening_words(e, 2), 0) == 0; }),
        text.c_str());
    QVERIFY2(std::find(examples.begin(), examples.end(), text) == examples.end(), text.c_str());
    QVERIFY2(text.find("<|") == std::string::npos, text.c_str());
    QVERIFY2(utf8::is_valid(text), text.c_str());
    std::istringstream in(text);
    int words = 0;
    for (std::string word; in >> word;) ++words;
    QVERIFY2(words >= 5 && words <= 80, text.c_str());  // an opening of 2+ words, 3+ beyond it
  }
  qInfo("wrote %zu of 12 requests, e.g.: %s", written.size(), written.front().c_str());
  QCOMPARE(write_prompts(*model_, *tokenizer_, tmpl, examples, w, {}), written);
  w.seed = 6;
  QVERIFY(write_prompts(*model_, *tokenizer_, tmpl, examples, w, {}) != written);
}

// Recording the layer taps changes nothing else a trace holds, bit for bit; each tap row is the
// residual stream RMS-normalised (mean square 1 up to eps, which is far below the stream's).
void TrainingModelTest::recorder_taps_leave_the_rest_unchanged() {
  const auto prompts = encode_prompts(2);
  TraceOptions o{8, 12, 2, 2};
  const TraceSet plain = record_continuations(*model_, prompts, o, {}, {});
  o.taps = true;
  const TraceSet tapped = record_continuations(*model_, prompts, o, {}, {});
  QCOMPARE(plain.n_taps, 0);
  QCOMPARE(tapped.n_taps, int32_t(draft_tap_layers(model_->hparams().n_layer).size()));
  QVERIFY(tapped.hidden == plain.hidden && tapped.pred == plain.pred && tapped.next == plain.next);
  QVERIFY(tapped.topk_ids == plain.topk_ids && tapped.topk_probs == plain.topk_probs);
  const auto d = size_t(model_->hparams().n_embd);
  QCOMPARE(tapped.taps.size(), size_t(tapped.n_pos()) * size_t(tapped.n_taps) * d);
  bool taps_differ = false;
  for (size_t row = 0; row < tapped.taps.size() / d; ++row) {
    double sq = 0.0;
    for (size_t j = 0; j < d; ++j)
      sq += double(tapped.taps[row * d + j]) * tapped.taps[row * d + j];
    QVERIFY2(std::abs(sq / double(d) - 1.0) < 1e-3, qPrintable(QString::number(sq / double(d))));
    if (row % 2 == 1 && !std::equal(tapped.taps.begin() + (row - 1) * d,
                                    tapped.taps.begin() + row * d, tapped.taps.begin() + row * d))
      taps_differ = true;  // the two layers' streams are not the same
  }
  QVERIFY(taps_differ);
}

void TrainingModelTest::training_improves_acceptance_data() {
  QTest::addColumn<QString>("type");
  QTest::newRow("medusa") << QStringLiteral("medusa");
  QTest::newRow("mtp") << QStringLiteral("mtp");
  QTest::newRow("mtp with layer taps") << QStringLiteral("mtp-taps");
}

void TrainingModelTest::training_improves_acceptance() {
  QFETCH(QString, type);
  const TraceSet& traces = this->traces();
  const DraftHeadInfo info = head_info(type);

  const TrainOptions o = small_run_options();
  const DraftHead zero = type != QStringLiteral("medusa")
                             ? make_mtp_head(info, draft_vocabulary(traces, o))
                             : make_medusa_head(info);
  int evaluations = 0;
  const TrainResult r = train_head(*model_, zero, traces, o, [&](const TrainProgress& p) {
    if (p.val_loss) {
      ++evaluations;
      qInfo(
          "step %3d  loss %.3f  val loss %.3f  top1 %.2f %.2f %.2f %.2f  accept/step %.3f  "
          "%.0f positions/s",
          p.step, p.loss, *p.val_loss, p.val_top1[0], p.val_top1[1], p.val_top1[2], p.val_top1[3],
          *p.simulated_accept_per_step, p.positions_per_s);
    }
    return true;
  });
  qInfo(
      "trained %d steps in %.1f s: %.0f positions/s, shortlist %lld tokens, %lld train / %lld "
      "val positions; val loss %.3f -> %.3f, ACCEPT/STEP %.3f -> %.3f",
      r.steps_run, r.seconds, r.positions_per_s, (long long)r.shortlist_size,
      (long long)r.train_positions, (long long)r.val_positions, r.initial_val_loss,
      r.final_val_loss, r.initial_accept_per_step, r.simulated_accept_per_step);
  QCOMPARE(r.steps_run, 150);
  QVERIFY(!r.cancelled && !r.stopped_early);
  QCOMPARE(evaluations, 1 + 150 / 25);
  QVERIFY(r.final_val_loss < r.initial_val_loss);
  QVERIFY(r.simulated_accept_per_step > r.initial_accept_per_step);

  // The standalone simulation agrees in direction on every traced position.
  std::vector<int64_t> all(size_t(traces.n_pos()));
  std::iota(all.begin(), all.end(), 0);
  const double before = simulated_accept_per_step(*model_, zero, traces, all);
  const double after = simulated_accept_per_step(*model_, r.head, traces, all);
  qInfo("all positions: ACCEPT/STEP %.3f -> %.3f", before, after);
  QVERIFY(after > before);
}

// The same traces and schedule, an mtp head trained with one rollout row per position (steps 1
// and 2 of its chain are taught) and with three (all four steps): the later steps' top-1 over the
// traced positions is higher with the rows that teach them. Measured on the code domain's
// held-out prompts (SmolLM2-135M, 21 k positions, 600 steps), steps 3 and 4 rose from 0.20 / 0.13
// to 0.33 / 0.31; here the data are small, so the test compares the two steps' sum.
void TrainingModelTest::rollout_rows_train_later_steps() {
  const TraceSet& traces = this->traces();
  TrainOptions o = small_run_options();
  const DraftHead zero =
      make_mtp_head(head_info(QStringLiteral("mtp")), draft_vocabulary(traces, o));
  std::vector<int64_t> all(size_t(traces.n_pos()));
  std::iota(all.begin(), all.end(), 0);
  kernels::ThreadPool pool(2);
  TransformerPass pass(*model_, pool);
  std::vector<double> later;  // steps 3 + 4 top-1, per rollout setting
  for (const int32_t rollout : {1, 3}) {
    o.rollout = rollout;
    const TrainResult r = train_head(*model_, zero, traces, o, {});
    const HeadEvaluation e = evaluate_head(pass, r.head, traces, traces.sequence_ends(), all);
    qInfo("rollout %d: top1 %.3f %.3f %.3f %.3f, ACCEPT/STEP %.3f", rollout, e.top1[0], e.top1[1],
          e.top1[2], e.top1[3], e.accept_per_step);
    later.push_back(e.top1[2] + e.top1[3]);
  }
  QVERIFY2(later[1] > later[0], "three rollout rows did not raise steps 3 and 4");
}

// With a patience of one evaluation, evaluations that do not improve in the first half of the
// steps (at a high learning rate the validation loss wanders; here, every 5 steps, it does) do
// not stop the run; the first one after the half does, and the best head evaluated is returned.
void TrainingModelTest::early_stopping_waits_for_the_second_half() {
  const TraceSet& traces = this->traces();
  TrainOptions o = small_run_options();
  o.steps = 200;
  o.lr = TrainOptions{}.lr;
  o.eval_every = 5;
  o.patience = 1;
  const DraftHead zero =
      make_mtp_head(head_info(QStringLiteral("mtp")), draft_vocabulary(traces, o));
  int32_t best_step = 0, last_eval = 0, first_half_misses = 0;
  double best = std::numeric_limits<double>::infinity();
  const TrainResult r = train_head(*model_, zero, traces, o, [&](const TrainProgress& p) {
    if (!p.val_loss) return true;
    last_eval = p.step;
    if (*p.val_loss < best) {
      best = *p.val_loss;
      best_step = p.step;
    } else if (2 * p.step <= o.steps) {
      ++first_half_misses;
    }
    return true;
  });
  qInfo(
      "%d evaluations without improvement in the first half; stopped at step %d (early: %d), "
      "best evaluation at step %d",
      first_half_misses, r.steps_run, int(r.stopped_early), best_step);
  QVERIFY2(first_half_misses > 0, "the test needs a first half that does not always improve");
  QVERIFY(r.steps_run > o.steps / 2);
  QCOMPARE(r.final_val_loss, best);
  if (r.stopped_early) {
    QCOMPARE(r.steps_run, last_eval);
    QVERIFY(best_step < last_eval);
  }
}

// The quantization study's measurement (generation_eval.h) with context lookup drafts, which need
// no head: on a target re-quantized to Q8_0 the drafted and plain outputs agree, the model's own
// speed is measured beside them, progress goes from re-quantizing through every prompt, and a
// cancel or an unknown quantization throws. On the model's own weights, its speed is the baseline.
void TrainingModelTest::generation_eval_on_a_requantized_target() {
  GenerationEvalRequest r;
  r.prompts = {"Write a Python function that reverses a list.", "Name three primary colours."};
  r.max_tokens = 24;
  r.lookup = 3;
  r.target_quant = "q8_0";
  r.config.threads = 2;
  std::vector<GenerationEvalProgress> seen;
  const GenerationEvalResult result =
      evaluate_by_generating(*model_, *tokenizer_, r, [&](const GenerationEvalProgress& p) {
        seen.push_back(p);
        return true;
      });
  QVERIFY(result.lossless);
  QCOMPARE(result.prompts, int64_t{2});
  QVERIFY(result.native.has_value());
  QVERIFY(result.with.tokens > 0);
  QCOMPARE(result.with.tokens, result.without.tokens);
  QCOMPARE(result.native->tokens, result.without.tokens);  // Q8_0 keeps these greedy replies
  QVERIFY(result.native->tok_s() > 0 && result.without.tok_s() > 0);
  QVERIFY(result.net_speedup_vs_native() > 0);
  // Lookup drafts are verified in steps of their own time and cost nothing to propose; the run
  // without drafts verifies none.
  QVERIFY(result.with.verify_steps > 0 && result.with.verify_ms_per_step() > 0.0);
  QCOMPARE(result.with.draft_ms_per_step(), 0.0);
  QCOMPARE(result.without.verify_steps, int64_t{0});
  QVERIFY(result.with.step_ms() > 0.0 && result.without.step_ms() > 0.0);
  QVERIFY(seen.size() >= 4);
  QCOMPARE(seen.front().phase, std::string("quantizing"));
  QCOMPARE(seen[1].phase, std::string("generating"));
  QCOMPARE(seen[1].done, int64_t{0});
  QCOMPARE(seen.back().done, seen.back().total);
  const EvaluationRecord e = evaluation_record(r, result);
  QCOMPARE(e.target_quant, std::string("q8_0"));
  QCOMPARE(e.spec, std::string("chain"));
  QCOMPARE(e.native_decode_tok_s, result.native->tok_s());
  QCOMPARE(e.baseline_decode_tok_s, result.without.tok_s());
  QCOMPARE(e.prompts, int64_t{2});

  r.target_quant = "native";
  r.prompts.resize(1);
  const GenerationEvalResult own = evaluate_by_generating(
      *model_, *tokenizer_, r, [](const GenerationEvalProgress&) { return true; });
  QVERIFY(!own.native.has_value());
  QCOMPARE(evaluation_record(r, own).native_decode_tok_s, own.without.tok_s());
  QVERIFY(own.with.length_steps.empty());  // a fixed length
  // Adaptive (`heads eval --adaptive`): a length is chosen for each proposal, and counted.
  r.adaptive = true;
  const GenerationEvalResult adaptive = evaluate_by_generating(
      *model_, *tokenizer_, r, [](const GenerationEvalProgress&) { return true; });
  QVERIFY(adaptive.lossless);
  QVERIFY(!adaptive.with.length_steps.empty());
  QVERIFY(std::accumulate(adaptive.with.length_steps.begin(), adaptive.with.length_steps.end(),
                          int64_t{0}) > 0);
  QVERIFY(static_cast<int32_t>(adaptive.with.length_steps.size()) <= r.draft_len + 1);
  QVERIFY(adaptive.without.length_steps.empty());
  r.adaptive = false;

  const auto error_of = [&](const std::function<bool(const GenerationEvalProgress&)>& progress) {
    try {
      evaluate_by_generating(*model_, *tokenizer_, r, progress);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  const std::string cancelled =
      error_of([](const GenerationEvalProgress& p) { return p.phase != "generating"; });
  QVERIFY2(cancelled.find("cancelled") != std::string::npos, cancelled.c_str());
  r.target_quant = "q3_k";  // a type, not a mixture llama-quantize names (q3_k_s, q3_k_m, q3_k_l)
  const std::string unknown = error_of([](const GenerationEvalProgress&) { return true; });
  QVERIFY2(unknown.find("expected " + target_quant_names_text()) != std::string::npos,
           unknown.c_str());
}

QTEST_GUILESS_MAIN(TrainingModelTest)
#include "test_training_model.moc"
