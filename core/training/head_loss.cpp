#include "core/training/head_loss.h"

#include <algorithm>
#include <cmath>

#include "core/common/error.h"
#include "core/speculative/dense_math.h"
#include "kernels/cpu/quantize.h"

namespace tokenfab {

int32_t Shortlist::index_of(TokenId id) const {
  const auto it = std::lower_bound(ids.begin(), ids.end(), id);
  return it != ids.end() && *it == id ? static_cast<int32_t>(it - ids.begin()) : -1;
}

Shortlist Shortlist::from_model(const LlamaModel& model, std::vector<TokenId> ids) {
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  const WeightMatrix& out = model.output();
  Shortlist s;
  s.n_embd = out.cols;
  s.rows.resize(ids.size() * static_cast<size_t>(out.cols));
  for (size_t j = 0; j < ids.size(); ++j) {
    if (ids[j] < 0 || ids[j] >= out.rows)
      throw Error("shortlist: token id " + std::to_string(ids[j]) + " is outside the vocabulary");
    kernels::dequantize_row(out.type, out.row(ids[j]), s.rows.data() + j * out.cols, out.cols);
  }
  s.ids = std::move(ids);
  return s;
}

Shortlist Shortlist::from_rows(std::vector<TokenId> ids, std::vector<float> rows, int64_t n_embd) {
  if (!std::is_sorted(ids.begin(), ids.end()) ||
      std::adjacent_find(ids.begin(), ids.end()) != ids.end() ||
      rows.size() != ids.size() * static_cast<size_t>(n_embd))
    throw Error("shortlist: ids must be sorted and unique, with one row of n_embd each");
  return {n_embd, std::move(ids), std::move(rows)};
}

namespace {

// Rows [r0, r1): forward, softmax and the backward pass down to dloss/du (in scratch.dz).
double rows_forward_backward(const float* w, const float* b, const Shortlist& sl, const float* x,
                             int64_t in_cols, int64_t r0, int64_t r1, const HeadTargets& t,
                             HeadLossScratch& s, float* dx_h, int64_t dx_rows) {
  const int64_t d = sl.n_embd, n = sl.size(), rows = r1 - r0;
  float* u = s.u.data() + r0 * d;
  float* z = s.z.data() + r0 * d;
  float* logits = s.logits.data() + r0 * n;
  float* dz = s.dz.data() + r0 * d;
  const float* xr = x + r0 * in_cols;
  dense::gemm_nt(rows, d, in_cols, xr, in_cols, w, in_cols, u, d, false);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < d; ++j) {
      const int64_t i = r * d + j;
      const float ui = u[i] + b[j];
      const float sig = 1.0f / (1.0f + std::exp(-ui));
      z[i] = xr[r * in_cols + j] + ui * sig;
      u[i] = sig * (1.0f + ui * (1.0f - sig));  // SiLU'(u)
    }
  }
  dense::gemm_nt(rows, n, d, z, d, sl.rows.data(), d, logits, n, false);

  double loss = 0.0;
  const float hard = 1.0f - t.kl_weight;
  for (int64_t r = 0; r < rows; ++r) {
    float* l = logits + r * n;
    const int64_t row = r0 + r;
    const int32_t label = t.label[static_cast<size_t>(row)];
    double target_logit = hard * double(l[label]);
    for (int32_t j = 0; j < (t.kl_weight > 0.0f ? t.top_k : 0); ++j) {
      const size_t at = static_cast<size_t>(row * t.top_k + j);
      target_logit += double(t.kl_weight) * t.soft_prob[at] * l[t.soft_index[at]];
    }
    const float mx = dense::max_value(l, n);
    const double sum = dense::exp_shifted_sum(l, n, mx);
    // Σ target = 1, so the loss is logZ − Σ target · logit.
    loss += double(mx) + std::log(sum) - target_logit;
    const auto inv = static_cast<float>(1.0 / sum);
    for (int64_t j = 0; j < n; ++j) l[j] *= inv;
    l[label] -= hard;
    for (int32_t j = 0; j < (t.kl_weight > 0.0f ? t.top_k : 0); ++j) {
      const size_t at = static_cast<size_t>(row * t.top_k + j);
      l[t.soft_index[at]] -= t.kl_weight * t.soft_prob[at];
    }
  }
  dense::gemm_nn(rows, d, n, logits, n, sl.rows.data(), d, dz, d, false);
  if (t.hidden_weight > 0.0f) {
    const float* target = t.hidden + r0 * d;
    const float g = 2.0f * t.hidden_weight / static_cast<float>(d);
    double sq = 0.0;
    for (int64_t i = 0; i < rows * d; ++i) {
      const float diff = z[i] - target[i];
      sq += double(diff) * diff;
      dz[i] += g * diff;
    }
    loss += double(t.hidden_weight) * sq / double(d);
  }
  // The residual path's share of dloss/dx[:, :n_embd] is dz itself.
  if (dx_h != nullptr && r0 < dx_rows)
    std::copy_n(dz, (std::min(r1, dx_rows) - r0) * d, dx_h + r0 * d);
  for (int64_t i = 0; i < rows * d; ++i) dz[i] *= u[i];
  // … and the block's is du · W[:, :n_embd].
  if (dx_h != nullptr && r0 < dx_rows)
    dense::gemm_nn(std::min(r1, dx_rows) - r0, d, d, dz, d, w, in_cols, dx_h + r0 * d, d, true);
  return loss;
}

}  // namespace

double head_loss_and_grad(const float* w, const float* b, const Shortlist& sl, const float* x,
                          int64_t in_cols, int64_t m, const HeadTargets& t, float* dw, float* db,
                          kernels::ThreadPool& pool, HeadLossScratch& s, float* dx_h,
                          int64_t dx_rows) {
  const int64_t d = sl.n_embd, n = sl.size();
  if (m <= 0) return 0.0;
  if (in_cols < d) throw Error("head loss: the input has fewer columns than n_embd");
  const auto md = static_cast<size_t>(m * d);
  if (s.u.size() < md) {
    s.u.resize(md);
    s.z.resize(md);
    s.dz.resize(md);
    s.du_t.resize(md);
  }
  if (s.logits.size() < static_cast<size_t>(m * n)) s.logits.resize(static_cast<size_t>(m * n));
  s.loss.assign(static_cast<size_t>(pool.size()), 0.0);

  pool.run([&](int ti, int nt) {
    int64_t r0 = 0, r1 = 0;
    kernels::ThreadPool::split(m, 4, ti, nt, r0, r1);
    if (r1 > r0)
      s.loss[static_cast<size_t>(ti)] =
          rows_forward_backward(w, b, sl, x, in_cols, r0, r1, t, s, dx_h, dx_rows);
  });
  // dW = duᵀ x and db = Σ du, split by output rows of W.
  pool.run([&](int ti, int nt) {
    int64_t o0 = 0, o1 = 0;
    kernels::ThreadPool::split(d, 4, ti, nt, o0, o1);
    if (o1 <= o0) return;
    float* du_t = s.du_t.data() + o0 * m;
    dense::transpose(s.dz.data() + o0, m, o1 - o0, d, du_t, m);
    dense::gemm_nn(o1 - o0, in_cols, m, du_t, m, x, in_cols, dw + o0 * in_cols, in_cols, true);
    for (int64_t o = 0; o < o1 - o0; ++o) {
      double sum = 0.0;
      for (int64_t r = 0; r < m; ++r) sum += du_t[o * m + r];
      db[o0 + o] += static_cast<float>(sum);
    }
  });
  double loss = 0.0;
  for (double l : s.loss) loss += l;
  return loss;
}

}  // namespace tokenfab
