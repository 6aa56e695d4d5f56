#include "core/training/head_eval.h"

#include <algorithm>
#include <cmath>

#include "core/speculative/dense_math.h"
#include "kernels/cpu/ops.h"

namespace tokenfab {

namespace {

constexpr int64_t kChunk = 64;  // positions per LM-head call: logits (64, n_vocab) ≈ 12 MiB

}  // namespace

HeadEvaluation evaluate_head(TransformerPass& pass, const MedusaHead& head, const TraceSet& traces,
                             std::span<const int64_t> ends, std::span<const int64_t> positions) {
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
          if (target >= ends[static_cast<size_t>(i)]) continue;
          const float label_logit = l[traces.pred[static_cast<size_t>(target)]];
          const float mx = dense::max_value(l, n_vocab);
          const double sum = dense::exp_shifted_sum(l, n_vocab, mx);
          row_loss[static_cast<size_t>(r)] = double(mx) + std::log(sum) - label_logit;
        }
      });
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = positions[c0 + r], target = i + k + 1;
        if (target >= ends[static_cast<size_t>(i)]) continue;
        loss_sum[static_cast<size_t>(k)] += row_loss[static_cast<size_t>(r)];
        ++counts[static_cast<size_t>(k)];
        hits[static_cast<size_t>(k)] += argmax[static_cast<size_t>(r * n_heads + k)] ==
                                        traces.pred[static_cast<size_t>(target)];
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = positions[c0 + r];
      if (i + n_heads >= ends[static_cast<size_t>(i)]) continue;
      int accepted = 0;
      while (accepted < n_heads && argmax[static_cast<size_t>(r * n_heads + accepted)] ==
                                       traces.pred[static_cast<size_t>(i + accepted + 1)])
        ++accepted;
      accept_sum += 1.0 + accepted;
      ++n_chain;
    }
  }

  HeadEvaluation e;
  e.n_positions = static_cast<int64_t>(positions.size());
  e.n_chain_positions = n_chain;
  int heads_with_labels = 0;
  for (int k = 0; k < n_heads; ++k) {
    const auto n = static_cast<double>(counts[static_cast<size_t>(k)]);
    e.top1.push_back(n > 0 ? double(hits[static_cast<size_t>(k)]) / n : 0.0);
    if (n > 0) {
      e.loss += loss_sum[static_cast<size_t>(k)] / n;
      ++heads_with_labels;
    }
  }
  if (heads_with_labels > 0) e.loss /= heads_with_labels;
  if (n_chain > 0) e.accept_per_step = accept_sum / double(n_chain);
  return e;
}

}  // namespace tokenfab
