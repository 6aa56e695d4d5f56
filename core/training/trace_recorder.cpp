#include "core/training/trace_recorder.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <thread>

#include "core/common/error.h"
#include "core/kvcache/kv_manager.h"
#include "core/runtime/kv_storage.h"
#include "core/runtime/model_runner.h"
#include "core/speculative/dense_math.h"
#include "kernels/cpu/ops.h"

namespace tokenfab {

namespace {

constexpr int32_t kBlockSize = 16;
// Rows whose logits one corpus pass keeps: (256, 49152) f32 logits are 48 MiB.
constexpr int64_t kMaxLogitRowsPerPass = 256;

int resolve_threads(int threads) {
  return threads > 0 ? threads : std::max(1u, std::thread::hardware_concurrency());
}

// What was recorded for one sequence so far.
struct SequenceRecord {
  std::vector<float> hidden;  // (n, n_embd)
  std::vector<float> taps;    // (n, n_taps · n_embd)
  std::vector<TokenId> pred;  // (n)
  std::vector<TokenId> next;  // (n)
  std::vector<TokenId> topk_ids;
  std::vector<float> topk_probs;
  int64_t n() const { return static_cast<int64_t>(pred.size()); }
};

// The rows of one pass, analysed: argmax, top-k ids and their softmax probabilities.
struct PassRows {
  std::vector<float> logits;  // (rows, n_vocab), clobbered by the analysis
  std::vector<float> hidden;  // (rows, width): final-norm hidden state, then the layer taps
  std::vector<TokenId> pred;  // (rows)
  std::vector<TokenId> topk_ids;
  std::vector<float> topk_probs;
};

// One row: the top_k largest logits, largest first (ties: lower id first), and the softmax.
void analyse_row(float* l, int64_t n_vocab, int32_t top_k, TokenId* pred, TokenId* ids,
                 float* probs) {
  *pred = static_cast<TokenId>(kernels::argmax(l, n_vocab));
  std::vector<float> vals;
  vals.reserve(static_cast<size_t>(top_k) + 1);
  for (int64_t j = 0; j < n_vocab && top_k > 0; ++j) {
    if (static_cast<int32_t>(vals.size()) == top_k && !(l[j] > vals.back())) continue;
    int32_t at = static_cast<int32_t>(vals.size()) - (static_cast<int32_t>(vals.size()) == top_k);
    if (static_cast<int32_t>(vals.size()) < top_k) vals.push_back(0.0f);
    while (at > 0 && l[j] > vals[static_cast<size_t>(at - 1)]) {
      vals[static_cast<size_t>(at)] = vals[static_cast<size_t>(at - 1)];
      ids[at] = ids[at - 1];
      --at;
    }
    vals[static_cast<size_t>(at)] = l[j];
    ids[at] = static_cast<TokenId>(j);
  }
  const float mx = l[*pred];
  const double sum = dense::exp_shifted_sum(l, n_vocab, mx);
  for (int32_t j = 0; j < top_k; ++j)
    probs[j] = static_cast<float>(std::exp(double(vals[static_cast<size_t>(j)]) - mx) / sum);
}

void analyse_rows(PassRows& p, int64_t rows, int64_t n_vocab, int32_t top_k,
                  kernels::ThreadPool& pool) {
  p.pred.resize(static_cast<size_t>(rows));
  p.topk_ids.resize(static_cast<size_t>(rows * top_k));
  p.topk_probs.resize(static_cast<size_t>(rows * top_k));
  pool.run([&](int ti, int nt) {
    int64_t r0 = 0, r1 = 0;
    kernels::ThreadPool::split(rows, 1, ti, nt, r0, r1);
    for (int64_t r = r0; r < r1; ++r)
      analyse_row(p.logits.data() + r * n_vocab, n_vocab, top_k, p.pred.data() + r,
                  p.topk_ids.data() + r * top_k, p.topk_probs.data() + r * top_k);
  });
}

void take_row(const PassRows& p, int64_t r, int64_t d, int64_t width, int32_t top_k, TokenId next,
              SequenceRecord& rec) {
  const auto row = p.hidden.begin() + r * width;
  rec.hidden.insert(rec.hidden.end(), row, row + d);
  rec.taps.insert(rec.taps.end(), row + d, row + width);
  rec.pred.push_back(p.pred[static_cast<size_t>(r)]);
  rec.next.push_back(next);
  rec.topk_ids.insert(rec.topk_ids.end(), p.topk_ids.begin() + r * top_k,
                      p.topk_ids.begin() + (r + 1) * top_k);
  rec.topk_probs.insert(rec.topk_probs.end(), p.topk_probs.begin() + r * top_k,
                        p.topk_probs.begin() + (r + 1) * top_k);
}

void append_sequence(TraceSet& out, const SequenceRecord& rec) {
  if (rec.n() == 0) return;
  out.hidden.insert(out.hidden.end(), rec.hidden.begin(), rec.hidden.end());
  out.taps.insert(out.taps.end(), rec.taps.begin(), rec.taps.end());
  out.pred.insert(out.pred.end(), rec.pred.begin(), rec.pred.end());
  out.next.insert(out.next.end(), rec.next.begin(), rec.next.end());
  out.topk_ids.insert(out.topk_ids.end(), rec.topk_ids.begin(), rec.topk_ids.end());
  out.topk_probs.insert(out.topk_probs.end(), rec.topk_probs.begin(), rec.topk_probs.end());
  out.seq_begin.push_back(out.n_pos());
}

// A sequence of one pass: `n` tokens from `pos0`, with its block table.
struct PassItem {
  SequenceId seq;
  std::span<const TokenId> tokens;
  int64_t pos0;
  bool all_logits;
};

void run_pass(ModelRunner& runner, const KvManager& kv, std::span<const PassItem> items,
              PassRows& out) {
  std::vector<std::vector<int32_t>> tables;
  tables.reserve(items.size());
  std::vector<BatchSequence> batch;
  for (const PassItem& it : items) {
    const auto& blocks = kv.table(it.seq).blocks();
    tables.emplace_back(blocks.begin(), blocks.end());
    batch.push_back({it.tokens, it.pos0, tables.back(), !it.all_logits, it.all_logits});
  }
  runner.run(batch, out.logits, &out.hidden);
}

void check_tokens(std::span<const TokenId> tokens, int64_t n_vocab, const std::string& where) {
  for (TokenId t : tokens)
    if (t < 0 || t >= n_vocab)
      throw Error(where + ": token id " + std::to_string(t) + " is outside the vocabulary");
}

TraceSet empty_trace(const HParams& hp, const TraceOptions& o) {
  TraceSet t;
  t.n_embd = static_cast<int32_t>(hp.n_embd);
  t.top_k = o.top_k;
  t.n_taps = o.taps ? static_cast<int32_t>(draft_tap_layers(hp.n_layer).size()) : 0;
  t.seq_begin = {0};
  return t;
}

}  // namespace

void TraceOptions::validate() const {
  const auto bad = [](const std::string& what) { throw Error("trace option " + what); };
  if (top_k < 0 || top_k > 1024) bad("top_k must be in [0, 1024]");
  if (continuation_tokens < 1) bad("continuation_tokens must be at least 1");
  if (threads < 0) bad("threads must be ≥ 0");
  if (batch < 1) bad("batch must be at least 1");
  sampling.validate();
}

TraceSet record_continuations(const LlamaModel& model,
                              std::span<const std::vector<TokenId>> prompts, const TraceOptions& o,
                              std::function<bool(TokenId)> is_end_of_generation,
                              const TraceProgress& progress) {
  o.validate();
  const HParams& hp = model.hparams();
  if (o.top_k > hp.n_vocab) throw Error("trace option top_k exceeds the vocabulary");
  const int64_t c = o.continuation_tokens;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string where = "prompt " + std::to_string(i);
    if (prompts[i].empty()) throw Error(where + " is empty");
    check_tokens(prompts[i], hp.n_vocab, where);
    if (static_cast<int64_t>(prompts[i].size()) + c > hp.n_ctx_train)
      throw Error(where + ": " + std::to_string(prompts[i].size()) + " tokens plus " +
                  std::to_string(c) + " continuation tokens exceed the model's context of " +
                  std::to_string(hp.n_ctx_train));
  }
  kernels::ThreadPool pool(resolve_threads(o.threads));
  TraceSet out = empty_trace(hp, o);
  const int64_t total = static_cast<int64_t>(prompts.size()) * c;
  int64_t done = 0;
  bool cancelled = false;
  // Up to `batch` prompts are live at once; a slot freed by a finished continuation takes the
  // next prompt at the following pass (its prefill rides along with the others' decode rows), so
  // passes stay full until the prompts run out. Every row's arithmetic is independent of the
  // other rows of its pass, so what is recorded does not depend on the batch.
  const size_t slots = std::min(prompts.size(), static_cast<size_t>(o.batch));
  int64_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, static_cast<int64_t>(p.size()) + c);
  // Each live sequence's own blocks, one more for a copied partial block, one spare.
  const int32_t n_blocks = static_cast<int32_t>(slots) *
                               static_cast<int32_t>((longest + kBlockSize - 1) / kBlockSize + 1) +
                           1;
  KvStorage storage(hp, n_blocks, kBlockSize);
  KvManager kv(n_blocks, kBlockSize);
  ModelRunner runner(model, pool, storage);
  runner.set_draft_taps(o.taps);
  const int64_t width = runner.hidden_width();
  struct Live {
    size_t prompt = 0;               // index into prompts, also the KV sequence id
    std::vector<TokenId> tokens;     // prompt, then the tokens generated so far
    int64_t computed = 0;            // tokens whose KV is in the pool
    std::optional<Sampler> sampler;  // sampled continuations
  };
  // Sequences finish out of order; each is appended to `out` once those before it have been.
  std::vector<SequenceRecord> recs(prompts.size());
  std::vector<char> finished(prompts.size(), 0);
  auto append_finished = [&, appended = size_t{0}](size_t up_to, bool all) mutable {
    for (; appended < up_to && (all || finished[appended]); ++appended) {
      append_sequence(out, recs[appended]);
      recs[appended] = SequenceRecord{};
    }
  };
  std::vector<std::optional<Live>> live(slots);
  size_t next_prompt = 0;
  PassRows rows;
  std::vector<TokenId> chosen;
  while (!cancelled) {
    for (auto& slot : live) {
      if (slot || next_prompt == prompts.size()) continue;
      Live& s = slot.emplace();
      s.prompt = next_prompt++;
      s.tokens = prompts[s.prompt];
      if (o.sampling.temperature > 0.0f) {
        SamplingParams sp = o.sampling;
        sp.seed += s.prompt;
        s.sampler.emplace(sp);
      }
      // A prefix found in the cache is computed again all the same: its blocks may belong to a
      // sequence whose KV is not written yet, and the values written are the same.
      if (!kv.allocate_sequence(static_cast<SequenceId>(s.prompt), s.tokens))
        throw Error("trace recorder: the KV pool is too small (internal error)");
    }
    std::vector<PassItem> items;
    std::vector<size_t> who;
    for (size_t j = 0; j < live.size(); ++j) {
      if (!live[j]) continue;
      const Live& s = *live[j];
      const auto pending =
          std::span<const TokenId>(s.tokens).subspan(static_cast<size_t>(s.computed));
      items.push_back({static_cast<SequenceId>(s.prompt), pending, s.computed, false});
      who.push_back(j);
    }
    if (items.empty()) break;
    run_pass(runner, kv, items, rows);
    chosen.assign(items.size(), -1);  // sampled before the analysis clobbers the logits
    for (size_t r = 0; r < items.size(); ++r)
      if (live[who[r]]->sampler)
        chosen[r] = live[who[r]]->sampler->sample(
            std::span<const float>(rows.logits.data() + r * static_cast<size_t>(hp.n_vocab),
                                   static_cast<size_t>(hp.n_vocab)));
    analyse_rows(rows, static_cast<int64_t>(items.size()), hp.n_vocab, o.top_k, pool);
    for (size_t r = 0; r < items.size(); ++r) {
      Live& s = *live[who[r]];
      SequenceRecord& rec = recs[s.prompt];
      const auto id = static_cast<SequenceId>(s.prompt);
      const TokenId next = chosen[r] >= 0 ? chosen[r] : rows.pred[r];
      take_row(rows, static_cast<int64_t>(r), hp.n_embd, width, o.top_k, next, rec);
      s.computed = static_cast<int64_t>(s.tokens.size());
      ++done;
      if (rec.n() == c || (is_end_of_generation && is_end_of_generation(next))) {
        done += c - rec.n();
        finished[s.prompt] = 1;
        kv.free_sequence(id);
        live[who[r]].reset();
        continue;
      }
      s.tokens.push_back(next);
      const AppendResult a = kv.append(id, next);
      if (!a.ok()) throw Error("trace recorder: the KV pool is too small (internal error)");
      if (a.copy) storage.copy_block(a.copy->src, a.copy->dst);
    }
    append_finished(next_prompt, false);
    if (progress && !progress(done, total)) cancelled = true;
  }
  // On cancel, the prompts started so far, the unfinished ones cut where they stopped.
  append_finished(next_prompt, true);
  return out;
}

TraceSet record_corpus(const LlamaModel& model, std::span<const TokenId> tokens, int32_t window,
                       const TraceOptions& o, const TraceProgress& progress) {
  o.validate();
  const HParams& hp = model.hparams();
  if (o.top_k > hp.n_vocab) throw Error("trace option top_k exceeds the vocabulary");
  if (window < 2) throw Error("record corpus: window must be at least 2 tokens");
  if (window > hp.n_ctx_train)
    throw Error("record corpus: window " + std::to_string(window) +
                " exceeds the model's context of " + std::to_string(hp.n_ctx_train));
  check_tokens(tokens, hp.n_vocab, "record corpus");
  std::vector<std::span<const TokenId>> windows;
  for (size_t s = 0; s + 2 <= tokens.size(); s += static_cast<size_t>(window))
    windows.push_back(
        tokens.subspan(s, std::min<size_t>(static_cast<size_t>(window), tokens.size() - s)));

  kernels::ThreadPool pool(resolve_threads(o.threads));
  TraceSet out = empty_trace(hp, o);
  int64_t total = 0, done = 0;
  for (const auto& w : windows) total += static_cast<int64_t>(w.size());
  bool cancelled = false;
  PassRows rows;
  for (size_t b0 = 0; b0 < windows.size() && !cancelled; b0 += static_cast<size_t>(o.batch)) {
    const size_t b1 = std::min(windows.size(), b0 + static_cast<size_t>(o.batch));
    int32_t n_blocks = 1;
    for (size_t i = b0; i < b1; ++i)
      n_blocks += static_cast<int32_t>((windows[i].size() + kBlockSize - 1) / kBlockSize);
    KvStorage storage(hp, n_blocks, kBlockSize);
    KvManager kv(n_blocks, kBlockSize);
    ModelRunner runner(model, pool, storage);
    runner.set_draft_taps(o.taps);
    const int64_t width = runner.hidden_width();
    std::vector<int64_t> computed(b1 - b0, 0);
    std::vector<SequenceRecord> recs(b1 - b0);
    for (size_t j = 0; j < recs.size(); ++j)
      if (!kv.allocate_sequence(static_cast<SequenceId>(j), windows[b0 + j]))
        throw Error("record corpus: the KV pool is too small (internal error)");
    while (!cancelled) {
      // Chunks of the windows still being read, up to the pass's budget of logit rows.
      std::vector<PassItem> items;
      std::vector<size_t> who;
      int64_t budget = kMaxLogitRowsPerPass;
      for (size_t j = 0; j < recs.size() && budget > 0; ++j) {
        const auto& w = windows[b0 + j];
        const int64_t n = std::min(static_cast<int64_t>(w.size()) - computed[j], budget);
        if (n <= 0) continue;
        items.push_back({static_cast<SequenceId>(j),
                         w.subspan(static_cast<size_t>(computed[j]), static_cast<size_t>(n)),
                         computed[j], true});
        who.push_back(j);
        budget -= n;
      }
      if (items.empty()) break;
      run_pass(runner, kv, items, rows);
      const int64_t n_rows = kMaxLogitRowsPerPass - budget;
      analyse_rows(rows, n_rows, hp.n_vocab, o.top_k, pool);
      int64_t r = 0;
      for (size_t i = 0; i < items.size(); ++i) {
        // The text's next token: inside the window, after it (the next window's first), or at
        // the very end of the text none, where the target's own prediction stands in.
        const size_t w = b0 + who[i];
        const size_t at = w * static_cast<size_t>(window) + static_cast<size_t>(computed[who[i]]);
        for (size_t q = 0; q < items[i].tokens.size(); ++q, ++r)
          take_row(
              rows, r, hp.n_embd, width, o.top_k,
              at + q + 1 < tokens.size() ? tokens[at + q + 1] : rows.pred[static_cast<size_t>(r)],
              recs[who[i]]);
        computed[who[i]] += static_cast<int64_t>(items[i].tokens.size());
      }
      done += n_rows;
      if (progress && !progress(done, total)) cancelled = true;
    }
    for (const SequenceRecord& rec : recs) append_sequence(out, rec);
  }
  return out;
}

}  // namespace tokenfab
