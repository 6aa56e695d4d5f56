#include "core/training/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <initializer_list>
#include <numeric>
#include <random>
#include <thread>

#include "core/common/error.h"
#include "core/model/transformer_pass.h"
#include "core/speculative/dense_math.h"
#include "core/training/head_eval.h"
#include "core/training/head_loss.h"

namespace tokenfab {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int resolve_threads(int threads) {
  return threads > 0 ? threads : std::max(1u, std::thread::hardware_concurrency());
}

// Positions with at least one label (i + 1 inside the sequence), of the held-out sequences and of
// the others; sequences are assigned by a seeded shuffle.
struct Split {
  std::vector<int64_t> train, val;
  std::vector<bool> is_val_sequence;
};

Split split_sequences(const TraceSet& t, float validation, uint64_t seed) {
  const int64_t n_seq = t.n_sequences();
  if (n_seq < 2)
    throw Error("training: the traces hold " + std::to_string(n_seq) +
                " sequence(s); at least two are needed to hold one out for validation");
  std::vector<int64_t> order(static_cast<size_t>(n_seq));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  const int64_t n_val = std::clamp<int64_t>(std::llround(validation * double(n_seq)), 1, n_seq - 1);
  Split s;
  s.is_val_sequence.assign(static_cast<size_t>(n_seq), false);
  for (int64_t j = 0; j < n_val; ++j) s.is_val_sequence[static_cast<size_t>(order[j])] = true;
  for (int64_t q = 0; q < n_seq; ++q) {
    auto& out = s.is_val_sequence[static_cast<size_t>(q)] ? s.val : s.train;
    for (int64_t i = t.seq_begin[q]; i + 1 < t.seq_begin[q + 1]; ++i) out.push_back(i);
  }
  return s;
}

// At most `cap` of `v`, evenly spaced.
std::vector<int64_t> evenly_capped(const std::vector<int64_t>& v, int64_t cap) {
  if (static_cast<int64_t>(v.size()) <= cap) return v;
  std::vector<int64_t> out;
  for (int64_t j = 0; j < cap; ++j)
    out.push_back(v[static_cast<size_t>(j * int64_t(v.size()) / cap)]);
  return out;
}

// V': every pred id — and, with_top_k, every top-k id — at the positions of the training
// sequences.
std::vector<TokenId> shortlist_ids(const TraceSet& t, const Split& split, bool with_top_k) {
  const int32_t k = with_top_k ? t.top_k : 0;
  std::vector<TokenId> ids;
  for (int64_t q = 0; q < t.n_sequences(); ++q) {
    if (split.is_val_sequence[static_cast<size_t>(q)]) continue;
    for (int64_t i = t.seq_begin[q]; i < t.seq_begin[q + 1]; ++i) {
      ids.push_back(t.pred[static_cast<size_t>(i)]);
      for (int32_t j = 0; j < k; ++j)
        ids.push_back(t.topk_ids[static_cast<size_t>(i * t.top_k + j)]);
    }
  }
  return ids;
}

struct Adam {
  std::vector<float> m, v;
  explicit Adam(size_t n) : m(n, 0.0f), v(n, 0.0f) {}
  // One AdamW update of p by gradient g (already clipped), bias-corrected for step t (1-based).
  void update(float* p, const float* g, float lr, float weight_decay, int32_t t) {
    constexpr float kB1 = 0.9f, kB2 = 0.999f, kEps = 1e-8f;
    const float c1 = 1.0f - std::pow(kB1, float(t)), c2 = 1.0f - std::pow(kB2, float(t));
    for (size_t i = 0; i < m.size(); ++i) {
      m[i] = kB1 * m[i] + (1.0f - kB1) * g[i];
      v[i] = kB2 * v[i] + (1.0f - kB2) * g[i] * g[i];
      p[i] -= lr * ((m[i] / c1) / (std::sqrt(v[i] / c2) + kEps) + weight_decay * p[i]);
    }
  }
};

float learning_rate(const TrainOptions& o, int32_t step /* 1-based */) {
  const auto warmup = static_cast<int32_t>(std::ceil(o.warmup * float(o.steps)));
  if (step <= warmup) return o.lr * float(step) / float(warmup);
  const float progress = float(step - warmup) / float(std::max(1, o.steps - warmup));
  const float cosine = 0.5f * (1.0f + std::cos(3.14159265358979f * std::min(1.0f, progress)));
  return o.lr * (0.1f + 0.9f * cosine);
}

// One block's rows of a mini-batch, gathered: inputs, labels (shortlist indices), soft targets
// and, for mtp, the hidden state each row should predict.
struct HeadBatch {
  std::vector<float> x;  // (m, in_cols)
  std::vector<int32_t> label, soft_index;
  std::vector<float> soft_prob;
  std::vector<float> hidden;  // mtp: (m, n_embd)
  int64_t m = 0;
  // mtp: the first n_roots rows are teacher-forced, their block input g made by
  // DraftHead::mtp_root from these draft features (n_roots, head.feature_width()).
  int64_t n_roots = 0;
  std::vector<float> root_features;

  void clear() {
    n_roots = 0;
    root_features.clear();
    x.clear();
    label.clear();
    soft_index.clear();
    soft_prob.clear();
    hidden.clear();
    m = 0;
  }
  // The label and (when `soft`) the renormalised top-k targets of trace position `target`.
  void add_targets(const TraceSet& t, const Shortlist& sl, int64_t target, bool soft) {
    label.push_back(sl.index_of(t.pred[static_cast<size_t>(target)]));
    ++m;
    if (!soft) return;
    double total = 0.0;
    for (int32_t j = 0; j < t.top_k; ++j)
      total += t.topk_probs[static_cast<size_t>(target * t.top_k + j)];
    for (int32_t j = 0; j < t.top_k; ++j) {
      const size_t at = static_cast<size_t>(target * t.top_k + j);
      const int32_t index = sl.index_of(t.topk_ids[at]);
      // An mtp vocabulary may lack a top-k id of a position: its share goes nowhere (index 0,
      // weight 0) and the rest is not renormalised, so the target sums to less than 1 there.
      soft_index.push_back(std::max(index, 0));
      soft_prob.push_back(index >= 0 && total > 0 ? static_cast<float>(t.topk_probs[at] / total)
                                                  : 0.0f);
    }
  }
};

void gather_head_batch(const TraceSet& t, std::span<const int64_t> ends, const Shortlist& sl,
                       std::span<const int64_t> batch, int k, bool soft, HeadBatch& out) {
  const int64_t d = t.n_embd;
  out.clear();
  for (int64_t i : batch) {
    const int64_t target = i + k + 1;
    if (target >= ends[static_cast<size_t>(i)] || !t.greedy_path(i, target)) continue;
    out.x.insert(out.x.end(), t.hidden.begin() + i * d, t.hidden.begin() + (i + 1) * d);
    out.add_targets(t, sl, target, soft);
  }
}

// The mtp block's rows of a mini-batch. Each position i (with i + 1 inside its sequence) gives a
// teacher-forced row [h_i; e(next_i)] → pred_{i+1}, h_{i+1}, and then up to `rollout` rows that
// continue from the block's own (current) predictions, as inference does from step 2 on: rollout
// row j (1-based, while i + j + 1 is inside the sequence) is [ĥ_{i+j}; e(next_{i+j})] →
// pred_{i+j+1}, h_{i+j+1}, where ĥ_{i+j} is what the block predicted from row j − 1. No gradient
// flows through ĥ: the rollout rows teach the block to continue from its own predicted hidden
// states. Labels outside the vocabulary are left out (the block cannot draft them), and so is the
// rest of that position's chain.
void gather_mtp_batch(const LlamaModel& model, const DraftHead& head, const TraceSet& t,
                      std::span<const int64_t> ends, const Shortlist& sl,
                      std::span<const int64_t> batch, int32_t rollout, bool soft, HeadBatch& out) {
  const int64_t d = t.n_embd;
  out.clear();
  std::vector<float> e(static_cast<size_t>(d));
  const auto add_row = [&](const float* h, int64_t from, int64_t target) {
    if (sl.index_of(t.pred[static_cast<size_t>(target)]) < 0) return false;
    embed_tokens(model, std::span(&t.next[static_cast<size_t>(from)], 1), e.data());
    out.x.insert(out.x.end(), h, h + d);
    out.x.insert(out.x.end(), e.begin(), e.end());
    out.hidden.insert(out.hidden.end(), t.hidden.begin() + target * d,
                      t.hidden.begin() + (target + 1) * d);
    out.add_targets(t, sl, target, soft);
    return true;
  };
  // The chains that go on after the rows just added: their positions i and the [h; e] of those
  // rows, gathered so that one mtp_step predicts every ĥ at once.
  std::vector<int64_t> chains, next_chains;
  std::vector<float> hs, es, z;
  const auto continue_chain = [&](int64_t i, int64_t depth) {
    if (i + depth + 2 >= ends[static_cast<size_t>(i)]) return;
    next_chains.push_back(i);
    const float* row = out.x.data() + (out.m - 1) * 2 * d;
    hs.insert(hs.end(), row, row + d);
    es.insert(es.end(), row + d, row + 2 * d);
  };
  // Teacher-forced rows first: from the target's own state h_i, or with taps from the fused
  // g_i = h_i + W_f t_i + b_f (DraftHead::mtp_root).
  std::vector<int64_t> roots;
  for (int64_t i : batch)
    if (i + 1 < ends[static_cast<size_t>(i)] &&
        sl.index_of(t.pred[static_cast<size_t>(i + 1)]) >= 0)
      roots.push_back(i);
  const int64_t width = head.feature_width();
  std::vector<float>& f = out.root_features;
  f.resize(roots.size() * static_cast<size_t>(width));
  for (size_t r = 0; r < roots.size(); ++r)
    t.copy_features(roots[r], width > d, f.data() + r * width);
  std::vector<float> g(roots.size() * d);
  head.mtp_root(f.data(), static_cast<int64_t>(roots.size()), g.data());
  for (size_t r = 0; r < roots.size(); ++r)
    if (add_row(g.data() + r * d, roots[r], roots[r] + 1)) continue_chain(roots[r], 0);
  out.n_roots = out.m;
  for (int32_t depth = 1; depth <= rollout && !next_chains.empty(); ++depth) {
    chains.swap(next_chains);
    next_chains.clear();
    z.resize(hs.size());
    head.mtp_step(hs.data(), es.data(), static_cast<int64_t>(chains.size()), z.data());
    hs.clear();
    es.clear();
    for (size_t r = 0; r < chains.size(); ++r)
      if (add_row(z.data() + r * static_cast<size_t>(d), chains[r] + depth, chains[r] + depth + 1))
        continue_chain(chains[r], depth);
  }
}

// One optimisation step over all blocks (Medusa: one per head; mtp: one): per-block mean losses
// and gradients on a mini-batch, global-norm clipping, AdamW. Owns the optimiser state and the
// step's buffers.
class HeadOptimizer {
 public:
  HeadOptimizer(const LlamaModel& model, const TraceSet& traces, std::span<const int64_t> ends,
                const Shortlist& shortlist, const TrainOptions& o, const DraftHead& head)
      : model_(model), traces_(traces), ends_(ends), shortlist_(shortlist), o_(o) {
    for (size_t k = 0; k < head.w.size(); ++k) {
      adam_w_.emplace_back(head.w[k].size());
      adam_b_.emplace_back(head.b[k].size());
      dw_.emplace_back(head.w[k].size());
      db_.emplace_back(head.b[k].size());
    }
    adam_fw_ = Adam(head.fuse_w.size());
    adam_fb_ = Adam(head.fuse_b.size());
    dfw_.resize(head.fuse_w.size());
    dfb_.resize(head.fuse_b.size());
  }

  // Returns the step's loss: the mean over blocks of each block's mean loss.
  double step(DraftHead& head, std::span<const int64_t> batch, int32_t step,
              kernels::ThreadPool& pool) {
    double loss = 0.0, norm2 = 0.0;
    int blocks_with_rows = 0;
    const bool soft = o_.kl_weight > 0.0f;
    const int64_t d = traces_.n_embd, in_cols = head.is_mtp() ? 2 * d : d;
    for (size_t k = 0; k < head.w.size(); ++k) {
      std::fill(dw_[k].begin(), dw_[k].end(), 0.0f);
      std::fill(db_[k].begin(), db_[k].end(), 0.0f);
      if (head.is_mtp())
        gather_mtp_batch(model_, head, traces_, ends_, shortlist_, batch,
                         o_.rollout < 0 ? head.n_heads() - 1 : o_.rollout, soft, hb_);
      else
        gather_head_batch(traces_, ends_, shortlist_, batch, static_cast<int>(k), soft, hb_);
      if (hb_.m == 0) continue;
      HeadTargets targets{hb_.label, hb_.soft_index, hb_.soft_prob, traces_.top_k, o_.kl_weight};
      if (head.is_mtp()) {
        targets.hidden = hb_.hidden.data();
        targets.hidden_weight = o_.hidden_weight;
      }
      const bool fused = !head.fuse_w.empty();
      if (fused) dg_.assign(static_cast<size_t>(hb_.n_roots * d), 0.0f);
      loss += head_loss_and_grad(head.w[k].data(), head.b[k].data(), shortlist_, hb_.x.data(),
                                 in_cols, hb_.m, targets, dw_[k].data(), db_[k].data(), pool,
                                 scratch_, fused ? dg_.data() : nullptr, hb_.n_roots) /
              double(hb_.m);
      ++blocks_with_rows;
      if (fused) fuse_grads(hb_.n_roots, d, pool);
      norm2 += scale(k, 1.0f / float(hb_.m));
      if (fused) norm2 += scale_fuse(1.0f / float(hb_.m));
    }
    const double norm = std::sqrt(norm2);
    const float lr = learning_rate(o_, step);
    for (size_t k = 0; k < head.w.size(); ++k) {
      if (norm > o_.clip) scale(k, static_cast<float>(o_.clip / norm));
      adam_w_[k].update(head.w[k].data(), dw_[k].data(), lr, o_.weight_decay, step);
      adam_b_[k].update(head.b[k].data(), db_[k].data(), lr, 0.0f, step);
    }
    if (!head.fuse_w.empty()) {
      if (norm > o_.clip) scale_fuse(static_cast<float>(o_.clip / norm));
      adam_fw_.update(head.fuse_w.data(), dfw_.data(), lr, o_.weight_decay, step);
      adam_fb_.update(head.fuse_b.data(), dfb_.data(), lr, 0.0f, step);
    }
    return loss / std::max(1, blocks_with_rows);
  }

 private:
  // Scales block k's (or the taps fusion's) gradients by `f`; returns their squared norm after.
  double scale(size_t k, float f) { return scale_grads({&dw_[k], &db_[k]}, f); }
  double scale_fuse(float f) { return scale_grads({&dfw_, &dfb_}, f); }
  static double scale_grads(std::initializer_list<std::vector<float>*> grads, float f) {
    double norm2 = 0.0;
    for (std::vector<float>* g : grads) {
      for (float& x : *g) {
        x *= f;
        norm2 += double(x) * x;
      }
    }
    return norm2;
  }
  // The taps fusion's gradients from dloss/dg of the n teacher-forced rows (dg_): dW_f = dgᵀ T
  // and db_f = Σ dg, T the rows' taps (their features after the hidden state); split by output
  // rows of W_f.
  void fuse_grads(int64_t n, int64_t d, kernels::ThreadPool& pool) {
    std::fill(dfw_.begin(), dfw_.end(), 0.0f);
    std::fill(dfb_.begin(), dfb_.end(), 0.0f);
    if (n == 0) return;
    const int64_t tw = static_cast<int64_t>(dfw_.size()) / d;
    dg_t_.resize(static_cast<size_t>(n * d));
    pool.run([&](int ti, int nt) {
      int64_t o0 = 0, o1 = 0;
      kernels::ThreadPool::split(d, 4, ti, nt, o0, o1);
      if (o1 <= o0) return;
      float* dg_t = dg_t_.data() + o0 * n;
      dense::transpose(dg_.data() + o0, n, o1 - o0, d, dg_t, n);
      dense::gemm_nn(o1 - o0, tw, n, dg_t, n, hb_.root_features.data() + d, d + tw,
                     dfw_.data() + o0 * tw, tw, false);
      for (int64_t o = 0; o < o1 - o0; ++o) {
        double sum = 0.0;
        for (int64_t r = 0; r < n; ++r) sum += dg_t[o * n + r];
        dfb_[static_cast<size_t>(o0 + o)] = static_cast<float>(sum);
      }
    });
  }

  const LlamaModel& model_;
  const TraceSet& traces_;
  std::span<const int64_t> ends_;
  const Shortlist& shortlist_;
  const TrainOptions& o_;
  std::vector<Adam> adam_w_, adam_b_;
  std::vector<std::vector<float>> dw_, db_;  // per block: W, b
  Adam adam_fw_{0}, adam_fb_{0};             // the taps fusion (mtp with taps)
  std::vector<float> dfw_, dfb_, dg_, dg_t_;
  HeadLossScratch scratch_;
  HeadBatch hb_;
};

void check_inputs(const LlamaModel& target, const DraftHead& head, const TraceSet& traces,
                  const TrainOptions& o) {
  o.validate();
  traces.validate("training traces");
  const HParams& hp = target.hparams();
  if (head.info.n_embd != hp.n_embd || head.info.n_vocab != hp.n_vocab)
    throw Error("training: head '" + head.info.name + "' has n_embd " +
                std::to_string(head.info.n_embd) + " and n_vocab " +
                std::to_string(head.info.n_vocab) + ", the model " + std::to_string(hp.n_embd) +
                " and " + std::to_string(hp.n_vocab));
  if (traces.n_embd != hp.n_embd)
    throw Error("training: the traces have n_embd " + std::to_string(traces.n_embd) +
                ", the model " + std::to_string(hp.n_embd));
  if (!head.info.taps.empty() && traces.n_taps != static_cast<int32_t>(head.info.taps.size()))
    throw Error("training: head '" + head.info.name + "' reads " +
                std::to_string(head.info.taps.size()) + " layer taps, the traces hold " +
                std::to_string(traces.n_taps) + " (record them with the taps)");
  if (!head.info.taps.empty() && head.info.taps != draft_tap_layers(hp.n_layer))
    throw Error("training: head '" + head.info.name +
                "' reads other layers than the model's draft taps");
  const auto d = static_cast<size_t>(hp.n_embd);
  const size_t blocks = head.is_mtp() ? 1 : static_cast<size_t>(head.n_heads());
  const size_t in_cols = head.is_mtp() ? 2 * d : d;
  if (head.n_heads() < 1 || head.w.size() != blocks || head.b.size() != blocks)
    throw Error("training: head '" + head.info.name + "' is inconsistent (n_heads)");
  for (size_t k = 0; k < blocks; ++k)
    if (head.w[k].size() != d * in_cols || head.b[k].size() != d)
      throw Error("training: head '" + head.info.name + "' has weights of the wrong size");
  if (head.is_mtp() && head.vocab.empty())
    throw Error("training: mtp head '" + head.info.name + "' has no draft vocabulary");
  if (o.kl_weight > 0.0f && traces.top_k == 0)
    throw Error("training: kl_weight > 0 needs traces recorded with top_k > 0");
}

}  // namespace

void TrainOptions::validate() const {
  const auto bad = [](const std::string& what) { throw Error("training option " + what); };
  if (steps < 1) bad("steps must be at least 1");
  if (batch < 1) bad("batch must be at least 1");
  if (!(lr > 0.0f) || !std::isfinite(lr)) bad("lr must be positive");
  if (!(weight_decay >= 0.0f)) bad("weight_decay must be ≥ 0");
  if (!(warmup >= 0.0f && warmup < 1.0f)) bad("warmup must be in [0, 1)");
  if (!(clip > 0.0f)) bad("clip must be positive");
  if (!(kl_weight >= 0.0f && kl_weight <= 1.0f)) bad("kl_weight must be in [0, 1]");
  if (!(hidden_weight >= 0.0f) || !std::isfinite(hidden_weight)) bad("hidden_weight must be ≥ 0");
  if (!(validation > 0.0f && validation < 1.0f)) bad("validation must be in (0, 1)");
  if (patience < 0) bad("patience must be ≥ 0");
  if (eval_every < 1) bad("eval_every must be at least 1");
  if (rollout < -1 || rollout > 16) bad("rollout must be in −1..16 (−1: heads − 1)");
  if (threads < 0) bad("threads must be ≥ 0");
}

TrainResult train_head(const LlamaModel& target, DraftHead head, const TraceSet& traces,
                       const TrainOptions& o,
                       const std::function<bool(const TrainProgress&)>& progress) {
  const auto t0 = Clock::now();
  check_inputs(target, head, traces, o);
  const std::vector<int64_t> ends = traces.sequence_ends();
  const Split split = split_sequences(traces, o.validation, o.seed);
  if (split.train.empty() || split.val.empty())
    throw Error("training: the traces have no labelled positions on one side of the split");
  const std::vector<int64_t> val = evenly_capped(split.val, kMaxEvalPositions);
  // mtp: the softmax runs over the head's own draft vocabulary, exactly as in inference.
  const Shortlist shortlist = Shortlist::from_model(
      target, head.is_mtp() ? head.vocab : shortlist_ids(traces, split, true));

  kernels::ThreadPool pool(resolve_threads(o.threads));
  TransformerPass pass(target, pool);
  std::mt19937_64 rng(o.seed ^ 0x9e3779b97f4a7c15ull);
  std::vector<int64_t> order = split.train;
  size_t cursor = order.size();  // reshuffle before the first batch

  TrainResult result;
  result.shortlist_size = shortlist.size();
  result.train_positions = static_cast<int64_t>(split.train.size());
  result.val_positions = static_cast<int64_t>(val.size());
  HeadOptimizer optimizer(target, traces, ends, shortlist, o, head);
  std::vector<int64_t> batch;

  HeadEvaluation best = evaluate_head(pass, head, traces, ends, val);
  result.initial_val_loss = best.loss;
  result.initial_accept_per_step = best.accept_per_step;
  DraftHead best_head = head;
  int32_t evals_without_improvement = 0;
  if (progress) {
    TrainProgress p{0, o.steps, best.loss, best.loss, best.top1, best.accept_per_step, 0.0, 0.0};
    if (!progress(p)) result.cancelled = true;
  }

  double train_seconds = 0.0;
  int32_t step = 0;
  while (!result.cancelled && step < o.steps) {
    ++step;
    const auto ts = Clock::now();
    batch.clear();
    while (static_cast<int32_t>(batch.size()) < o.batch) {
      if (cursor == order.size()) {
        std::shuffle(order.begin(), order.end(), rng);
        cursor = 0;
      }
      batch.push_back(order[cursor++]);
    }
    const double loss = optimizer.step(head, batch, step, pool);
    train_seconds += seconds_since(ts);

    TrainProgress p;
    p.step = step;
    p.steps = o.steps;
    p.loss = loss;
    p.positions_per_s = double(step) * o.batch / std::max(train_seconds, 1e-9);
    p.eta_s = seconds_since(t0) / step * (o.steps - step);
    if (step % o.eval_every == 0 || step == o.steps) {
      const HeadEvaluation e = evaluate_head(pass, head, traces, ends, val);
      p.val_loss = e.loss;
      p.val_top1 = e.top1;
      p.simulated_accept_per_step = e.accept_per_step;
      if (e.loss < best.loss) {
        best = e;
        best_head = head;
        evals_without_improvement = 0;
      } else if (o.patience > 0 && 2 * step > o.steps &&
                 ++evals_without_improvement >= o.patience) {
        // Only the second half's evaluations count: in the first, at a high learning rate, the
        // validation loss wanders for hundreds of steps before the decay brings it down (code
        // traces, 4000 steps: counting every evaluation stopped the run at step 1000 with a
        // chain of 4 accepting 1.710 per step on held-out prompts; counting the second half's,
        // at step 2650 with 1.804).
        result.stopped_early = step < o.steps;
      }
    }
    if (progress && !progress(p)) result.cancelled = true;
    if (result.stopped_early) break;
  }

  result.head = std::move(best_head);
  result.steps_run = step;
  result.final_val_loss = best.loss;
  result.val_top1 = best.top1;
  result.simulated_accept_per_step = best.accept_per_step;
  result.seconds = seconds_since(t0);
  result.positions_per_s = step > 0 ? double(step) * o.batch / std::max(train_seconds, 1e-9) : 0.0;
  return result;
}

std::vector<TokenId> draft_vocabulary(const TraceSet& traces, const TrainOptions& options) {
  traces.validate("traces");
  // Without the KL term only the pred ids are ever a label; the other top-k ids would only be
  // negatives, which cost a softmax over three times as many rows in training and drafting.
  std::vector<TokenId> ids = shortlist_ids(
      traces, split_sequences(traces, options.validation, options.seed), options.kl_weight > 0.0f);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

double simulated_accept_per_step(const LlamaModel& target, const DraftHead& head,
                                 const TraceSet& traces, std::span<const int64_t> positions) {
  traces.validate("traces");
  if (head.info.n_embd != traces.n_embd || head.info.n_embd != target.hparams().n_embd)
    throw Error("simulated accept: head '" + head.info.name +
                "', traces and model disagree on n_embd");
  for (int64_t i : positions)
    if (i < 0 || i >= traces.n_pos()) throw Error("simulated accept: position out of range");
  kernels::ThreadPool pool(resolve_threads(0));
  TransformerPass pass(target, pool);
  return evaluate_head(pass, head, traces, traces.sequence_ends(), positions).accept_per_step;
}

}  // namespace tokenfab
