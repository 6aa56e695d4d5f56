#include "core/training/head_eval.h"

#include "core/common/error.h"

#include <algorithm>
#include <cmath>

#include "core/speculative/dense_math.h"
#include "kernels/cpu/ops.h"

namespace tokenfab {

namespace {

constexpr int64_t kChunk = 64;  // positions per LM-head call: logits (64, n_vocab) ≈ 12 MiB

// For each of `rows` positions with all k labels in its sequence, where the text goes on with the
// target's own token: the drafts drafts[r·k + j] are accepted while they equal pred[i + 1 + j]
// and the text stays on the target's greedy path (a greedy verifier would have seen the same
// context); adds 1 + accepted to accept_sum and counts it.
void add_chain_accepts(const TraceSet& traces, std::span<const int64_t> ends,
                       std::span<const int64_t> rows, std::span<const TokenId> drafts, int k,
                       double& accept_sum, int64_t& n_chain) {
  for (size_t r = 0; r < rows.size(); ++r) {
    const int64_t i = rows[r];
    if (i + k >= ends[static_cast<size_t>(i)] || !traces.greedy_at(i)) continue;
    int accepted = 0;
    while (accepted < k && (accepted == 0 || traces.greedy_at(i + accepted)) &&
           drafts[r * static_cast<size_t>(k) + static_cast<size_t>(accepted)] ==
               traces.pred[static_cast<size_t>(i + accepted + 1)])
      ++accepted;
    accept_sum += 1.0 + accepted;
    ++n_chain;
  }
}

// Per head (step): mean loss over loss_counts rows, top-1 = hits / counts; the accept mean over
// the n_chain positions with every label.
HeadEvaluation summarize(std::span<const double> loss_sum, std::span<const int64_t> loss_counts,
                         std::span<const int64_t> hits, std::span<const int64_t> counts,
                         double accept_sum, int64_t n_chain, int64_t n_positions) {
  HeadEvaluation e;
  e.n_positions = n_positions;
  e.n_chain_positions = n_chain;
  int with_labels = 0;
  for (size_t k = 0; k < counts.size(); ++k) {
    e.top1.push_back(counts[k] > 0 ? double(hits[k]) / double(counts[k]) : 0.0);
    if (loss_counts[k] > 0) {
      e.loss += loss_sum[k] / double(loss_counts[k]);
      ++with_labels;
    }
  }
  if (with_labels > 0) e.loss /= with_labels;
  if (n_chain > 0) e.accept_per_step = accept_sum / double(n_chain);
  return e;
}

// mtp: for each position i the chain of K steps as inference runs it when every draft before
// step k was accepted — step k reads the hidden state the block predicted at step k − 1 (h_i for
// the first) and the text's token next[i + k] — scored over the head's vocabulary.
HeadEvaluation evaluate_mtp(TransformerPass& pass, const DraftHead& head, const TraceSet& traces,
                            std::span<const int64_t> ends, std::span<const int64_t> positions) {
  const LlamaModel& model = pass.model();
  const int64_t d = traces.n_embd, v = static_cast<int64_t>(head.vocab.size());
  const int n_steps = head.n_heads();
  if (!head.info.taps.empty() && traces.n_taps != static_cast<int32_t>(head.info.taps.size()))
    throw Error("head '" + head.info.name + "' reads " + std::to_string(head.info.taps.size()) +
                " layer taps, the traces hold " + std::to_string(traces.n_taps));
  kernels::ThreadPool& pool = pass.pool();
  std::vector<double> loss_sum(static_cast<size_t>(n_steps), 0.0);
  std::vector<int64_t> hits(static_cast<size_t>(n_steps), 0),
      counts(static_cast<size_t>(n_steps), 0), losses(static_cast<size_t>(n_steps), 0);
  double accept_sum = 0.0;
  int64_t n_chain = 0;

  std::vector<float> z(static_cast<size_t>(kChunk * d)), next(z.size()), emb(z.size());
  std::vector<float> logits(static_cast<size_t>(kChunk * v));
  std::vector<TokenId> best(static_cast<size_t>(kChunk * n_steps));
  std::vector<double> row_loss(static_cast<size_t>(kChunk));
  std::vector<TokenId> inputs(static_cast<size_t>(kChunk));
  std::vector<float> features;
  for (size_t c0 = 0; c0 < positions.size(); c0 += kChunk) {
    const auto rows = static_cast<int64_t>(std::min<size_t>(kChunk, positions.size() - c0));
    // The chains' first states: h_i, or with taps the fused g_i (DraftHead::mtp_root).
    const int64_t width = head.feature_width();
    features.resize(static_cast<size_t>(rows * width));
    for (int64_t r = 0; r < rows; ++r)
      traces.copy_features(positions[c0 + r], width > d, features.data() + r * width);
    head.mtp_root(features.data(), rows, z.data());
    for (int k = 0; k < n_steps; ++k) {
      // Rows whose step-k label lies past their sequence keep computing on a token of their own
      // sequence; their results are not counted.
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = positions[c0 + r];
        const int64_t from = std::min(i + k, ends[static_cast<size_t>(i)] - 1);
        inputs[static_cast<size_t>(r)] = traces.next[static_cast<size_t>(from)];
      }
      pool.run([&](int ti, int nt) {
        int64_t r0 = 0, r1 = 0;
        kernels::ThreadPool::split(rows, 1, ti, nt, r0, r1);
        if (r1 <= r0) return;
        embed_tokens(model, std::span(inputs).subspan(r0, r1 - r0), emb.data() + r0 * d);
        head.mtp_step(z.data() + r0 * d, emb.data() + r0 * d, r1 - r0, next.data() + r0 * d);
        head.vocab_logits(model, next.data() + r0 * d, r1 - r0, logits.data() + r0 * v);
        for (int64_t r = r0; r < r1; ++r) {
          float* l = logits.data() + r * v;
          best[static_cast<size_t>(r * n_steps + k)] = head.vocab[kernels::argmax(l, v)];
          const int64_t i = positions[c0 + r], target = i + k + 1;
          row_loss[static_cast<size_t>(r)] = -1.0;
          if (target >= ends[static_cast<size_t>(i)]) continue;
          const TokenId label = traces.pred[static_cast<size_t>(target)];
          const auto it = std::lower_bound(head.vocab.begin(), head.vocab.end(), label);
          if (it == head.vocab.end() || *it != label) continue;
          const float label_logit = l[it - head.vocab.begin()];
          row_loss[static_cast<size_t>(r)] = dense::log_sum_exp(l, v) - label_logit;
        }
      });
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = positions[c0 + r], target = i + k + 1;
        if (target >= ends[static_cast<size_t>(i)]) continue;
        ++counts[static_cast<size_t>(k)];
        hits[static_cast<size_t>(k)] +=
            best[static_cast<size_t>(r * n_steps + k)] == traces.pred[static_cast<size_t>(target)];
        if (row_loss[static_cast<size_t>(r)] >= 0.0) {
          loss_sum[static_cast<size_t>(k)] += row_loss[static_cast<size_t>(r)];
          ++losses[static_cast<size_t>(k)];
        }
      }
      z.swap(next);
    }
    add_chain_accepts(traces, ends, positions.subspan(c0, static_cast<size_t>(rows)), best, n_steps,
                      accept_sum, n_chain);
  }

  return summarize(loss_sum, losses, hits, counts, accept_sum, n_chain,
                   static_cast<int64_t>(positions.size()));
}

}  // namespace

HeadEvaluation evaluate_head(TransformerPass& pass, const DraftHead& head, const TraceSet& traces,
                             std::span<const int64_t> ends, std::span<const int64_t> positions) {
  if (head.is_mtp()) return evaluate_mtp(pass, head, traces, ends, positions);
  const int64_t d = traces.n_embd, n_vocab = pass.model().hparams().n_vocab;
  const int n_heads = head.n_heads();
  kernels::ThreadPool& pool = pass.pool();
  std::vector<double> loss_sum(static_cast<size_t>(n_heads), 0.0);
  std::vector<int64_t> hits(static_cast<size_t>(n_heads), 0),
      counts(static_cast<size_t>(n_heads), 0);
  double accept_sum = 0.0;
  int64_t n_chain = 0;

  std::vector<float> h(static_cast<size_t>(kChunk * d)), z(h.size());
  std::vector<float> logits(static_cast<size_t>(kChunk * n_vocab));  // (kChunk, n_vocab)
  std::vector<TokenId> argmax(static_cast<size_t>(kChunk * n_heads));
  std::vector<double> row_loss(static_cast<size_t>(kChunk));
  for (size_t c0 = 0; c0 < positions.size(); c0 += kChunk) {
    const auto rows = static_cast<int64_t>(std::min<size_t>(kChunk, positions.size() - c0));
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(traces.hidden.data() + positions[c0 + r] * d, d, h.data() + r * d);
    for (int k = 0; k < n_heads; ++k) {
      pool.run([&](int ti, int nt) {
        int64_t r0 = 0, r1 = 0;
        kernels::ThreadPool::split(rows, 1, ti, nt, r0, r1);
        if (r1 > r0) head.residual(k, h.data() + r0 * d, r1 - r0, z.data() + r0 * d);
      });
      pass.lm_head(z.data(), rows, logits.data());
      pool.run([&](int ti, int nt) {
        int64_t r0 = 0, r1 = 0;
        kernels::ThreadPool::split(rows, 1, ti, nt, r0, r1);
        for (int64_t r = r0; r < r1; ++r) {
          float* l = logits.data() + r * n_vocab;
          argmax[static_cast<size_t>(r * n_heads + k)] =
              static_cast<TokenId>(kernels::argmax(l, n_vocab));
          const int64_t i = positions[c0 + r], target = i + k + 1;
          row_loss[static_cast<size_t>(r)] = 0.0;
          if (target >= ends[static_cast<size_t>(i)] || !traces.greedy_path(i, target)) continue;
          const float label_logit = l[traces.pred[static_cast<size_t>(target)]];
          row_loss[static_cast<size_t>(r)] = dense::log_sum_exp(l, n_vocab) - label_logit;
        }
      });
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = positions[c0 + r], target = i + k + 1;
        if (target >= ends[static_cast<size_t>(i)] || !traces.greedy_path(i, target)) continue;
        loss_sum[static_cast<size_t>(k)] += row_loss[static_cast<size_t>(r)];
        ++counts[static_cast<size_t>(k)];
        hits[static_cast<size_t>(k)] += argmax[static_cast<size_t>(r * n_heads + k)] ==
                                        traces.pred[static_cast<size_t>(target)];
      }
    }
    add_chain_accepts(traces, ends, positions.subspan(c0, static_cast<size_t>(rows)), argmax,
                      n_heads, accept_sum, n_chain);
  }

  return summarize(loss_sum, counts, hits, counts, accept_sum, n_chain,
                   static_cast<int64_t>(positions.size()));
}

}  // namespace tokenfab
