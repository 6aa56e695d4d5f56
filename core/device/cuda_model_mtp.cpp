// The CUDA Device's mtp drafting (cuda_model_impl.h; Device::mtp_propose): the proposals grouped
// by head; the drafts' first states (upload_root_states, with the head's layer-tap fusion); one
// step of the head over a set of rows (mtp_step_rows); and the three ways a group drafts:
// chains whose tokens stay on the GPU, trees a level at a time, best-first trees.

#if TOKENFAB_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "core/common/error.h"
#include "core/device/cuda_model_impl.h"
#include "kernels/cuda/add_inplace.cuh"
#include "kernels/cuda/argmax.cuh"
#include "kernels/cuda/draft_residual.cuh"
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/gather_rows.cuh"
#include "kernels/cuda/row_logsumexp.cuh"

namespace tokenfab::cuda_backend {

namespace {

// The `take` best (logit, column) of a row of n logits as filter_rows returned it (candidates
// under top-k = take, or the whole row), best first, ties to the lower column.
std::vector<std::pair<float, int32_t>> best_columns(const LogitRow& row, int64_t n, int32_t take) {
  std::vector<std::pair<float, int32_t>> ranked;
  if (row.whole()) {
    for (const int32_t c : top_tokens(row.logits.data(), n, take))
      ranked.emplace_back(row.logits[static_cast<size_t>(c)], c);
    return ranked;
  }
  for (size_t c = 0; c < row.ids.size(); ++c) ranked.emplace_back(row.logits[c], row.ids[c]);
  if (!row.ranked)  // every token, in column order (top-k did not limit the row)
    std::stable_sort(ranked.begin(), ranked.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
  if (static_cast<int32_t>(ranked.size()) > take) ranked.resize(static_cast<size_t>(take));
  return ranked;
}

}  // namespace

void CudaDevice::mtp_propose(std::span<const MtpProposal> proposals,
                             std::vector<std::vector<int32_t>>& drafts,
                             std::vector<std::vector<int32_t>>& parents) {
  check(cudaSetDevice(spec_.index), name_, "selecting the device");
  drafts.assign(proposals.size(), {});
  parents.assign(proposals.size(), {});
  // The proposals by head: each head's drafts step together, one row per proposal (a chain) or
  // per node of the level being expanded (a tree).
  std::map<const DraftHead*, std::vector<size_t>> by_head;
  for (size_t i = 0; i < proposals.size(); ++i) {
    const MtpProposal& p = proposals[i];
    if (!p.head->is_mtp() || p.head->info.n_embd != hp_.n_embd || p.max_nodes < 0 ||
        p.head->feature_width() > hidden_width() ||
        std::any_of(p.widths.begin(), p.widths.end(), [](int32_t w) { return w < 1; }))
      throw Error(name_ + ": draft head '" + p.head->info.name +
                  "' cannot draft that mtp tree for this model");
    if (!p.widths.empty() && p.max_nodes > 0) by_head[p.head.get()].push_back(i);
  }
  for (const auto& [key, all] : by_head) {
    const DraftWeights& weights = draft_weights(proposals[all.front()].head);
    // Chains (every width 1; a best-first chain is the chain itself) take the chain path, whose
    // tokens stay on the GPU; static and best-first trees go a level at a time.
    std::vector<size_t> chains, trees, best_first;
    for (const size_t i : all) {
      const MtpProposal& p = proposals[i];
      const bool chain =
          std::all_of(p.widths.begin(), p.widths.end(), [](int32_t w) { return w == 1; });
      (chain ? chains : p.best_first ? best_first : trees).push_back(i);
    }
    if (!chains.empty()) mtp_chain_group(proposals, chains, weights, drafts, parents);
    if (!trees.empty()) mtp_tree_group(proposals, trees, weights, drafts, parents);
    if (!best_first.empty()) mtp_best_first_group(proposals, best_first, weights, drafts, parents);
  }
  evict_draft_heads();  // every head's drafts have synced
}

void CudaDevice::upload_root_states(std::span<const MtpProposal> proposals,
                                    const std::vector<size_t>& members,
                                    const DraftWeights& weights) {
  const DraftHead& head = *weights.head;
  const auto d = static_cast<size_t>(hp_.n_embd);
  const auto m = members.size();
  const auto t_width = static_cast<size_t>(head.feature_width()) - d;  // 0 without taps
  h_roots_.resize(m * d);
  h_root_taps_.resize(m * t_width);
  for (size_t t = 0; t < m; ++t) {
    const float* f = proposals[members[t]].hidden;  // the head's features: h, then the taps
    float* root = h_roots_.data() + t * d;
    std::copy_n(f, d, root);
    if (t_width == 0) continue;
    for (size_t j = 0; j < d; ++j) root[j] += head.fuse_b[j];
    std::copy_n(f + d, t_width, h_root_taps_.data() + t * t_width);
  }
  check(cudaMemcpyAsync(xg_.get(), h_roots_.data(), h_roots_.size() * sizeof(float),
                        cudaMemcpyHostToDevice, stream_),
        name_, "uploading draft states");
  if (t_width == 0) return;
  root_taps_.reserve(m * t_width, name_, "draft features");
  if (act16_.reserve(m * t_width, name_, "draft features")) drop_graphs();  // linear's bf16 input
  check(cudaMemcpyAsync(root_taps_.get(), h_root_taps_.data(), h_root_taps_.size() * sizeof(float),
                        cudaMemcpyHostToDevice, stream_),
        name_, "uploading draft features");
  // g = (h + b_f) + W_f taps: the product into xgn_ (free until the first step writes z there).
  const auto rows = static_cast<int64_t>(m);
  linear(root_taps_.get(), weights.fuse_w.get(), xgn_.get(), rows, hp_.n_embd,
         static_cast<int64_t>(t_width));
  launch(name_, "fusing layer taps", [&] {
    kernels::launch_add_inplace(xg_.get(), xgn_.get(), rows * hp_.n_embd, stream_, overlap_);
  });
}

void CudaDevice::upload_draft_rows(const DraftWeights& weights, std::span<const int32_t> tokens,
                                   std::span<const int32_t> src) {
  const auto n = tokens.size();
  mtp_tokens_.reserve(n, name_, "draft tokens");
  medusa_w_.reserve(n, name_, "draft-head rows");
  medusa_b_.reserve(n, name_, "draft-head rows");
  medusa_src_.reserve(n, name_, "draft-head rows");
  const std::vector<const float*> h_w(n, weights.w.get());
  const std::vector<const float*> h_b(n, weights.b.get());
  auto upload = [&](auto* dst, const auto* host, const char* what) {
    check(cudaMemcpyAsync(dst, host, n * sizeof(*host), cudaMemcpyHostToDevice, stream_), name_,
          what);
  };
  upload(mtp_tokens_.get(), tokens.data(), "uploading draft tokens");
  upload(medusa_src_.get(), src.data(), "uploading draft-head rows");
  upload(medusa_w_.get(), h_w.data(), "uploading draft-head rows");
  upload(medusa_b_.get(), h_b.data(), "uploading draft-head rows");
}

void CudaDevice::mtp_step_rows(const DraftWeights& weights, const float* h, float* z, int64_t n) {
  const int64_t d = hp_.n_embd;
  // ĥ = h + SiLU(W [h; e(x)] + b) of each row's parent state and token, then its logits over V.
  kernels::launch_embedding(w_->embd_type, w_->embd.get(), mtp_tokens_.get(), x_.get(), n, d,
                            stream_, hp_.arch.embedding_scale);  // LlamaModel::embed's input
  kernels::launch_draft_residual(medusa_w_.get(), medusa_b_.get(), h, medusa_src_.get(), x_.get(),
                                 z, n, d, stream_);
  linear(z, weights.vocab_rows.get(), logits_.get(), n,
         static_cast<int64_t>(weights.head->vocab.size()), d);
}

void CudaDevice::mtp_chain_group(std::span<const MtpProposal> proposals,
                                 const std::vector<size_t>& members, const DraftWeights& weights,
                                 std::vector<std::vector<int32_t>>& drafts,
                                 std::vector<std::vector<int32_t>>& parents) {
  const auto m = static_cast<int64_t>(members.size());
  const auto v = static_cast<int64_t>(weights.head->vocab.size());
  auto length = [&](size_t i) {
    return std::min(static_cast<int32_t>(proposals[i].widths.size()), proposals[i].max_nodes);
  };
  int32_t steps = 0;
  for (const size_t i : members) steps = std::max(steps, length(i));
  // Rows: xg_ / xgn_ the states (h, then z: they swap each step), x_ the embeddings of the rows'
  // tokens, logits_ (m, |V|), argmax_ each row's best index into V. The tokens stay on the GPU
  // from step to step; all the drafts come down at the end.
  reserve_draft_rows(m, v);
  mtp_drafts_.reserve(static_cast<size_t>(m * steps), name_, "draft tokens");
  upload_root_states(proposals, members, weights);
  std::vector<int32_t> last, src;
  for (const size_t i : members) {
    src.push_back(static_cast<int32_t>(last.size()));
    last.push_back(proposals[i].last);
  }
  upload_draft_rows(weights, last, src);
  float* h = xg_.get();
  float* z = xgn_.get();
  launch(name_, "mtp chains", [&] {
    for (int32_t step = 0; step < steps; ++step) {
      mtp_step_rows(weights, h, z, m);
      kernels::launch_argmax_rows(logits_.get(), argmax_.get(), m, v, stream_);
      kernels::launch_gather_i32(weights.vocab.get(), argmax_.get(), m, mtp_tokens_.get(), stream_);
      check(cudaMemcpyAsync(mtp_drafts_.get() + static_cast<int64_t>(step) * m, mtp_tokens_.get(),
                            static_cast<size_t>(m) * sizeof(int32_t), cudaMemcpyDeviceToDevice,
                            stream_),
            name_, "keeping draft tokens");
      std::swap(h, z);
    }
  });
  std::vector<int32_t> all(static_cast<size_t>(m * steps));  // (steps, m)
  check(cudaMemcpyAsync(all.data(), mtp_drafts_.get(), all.size() * sizeof(int32_t),
                        cudaMemcpyDeviceToHost, stream_),
        name_, "downloading draft tokens");
  sync("drafting mtp chains");
  for (int64_t r = 0; r < m; ++r) {
    const size_t i = members[static_cast<size_t>(r)];
    for (int32_t step = 0; step < length(i); ++step) {
      drafts[i].push_back(all[static_cast<size_t>(step * m + r)]);
      parents[i].push_back(step - 1);
    }
  }
}

void CudaDevice::mtp_tree_group(std::span<const MtpProposal> proposals,
                                const std::vector<size_t>& members, const DraftWeights& weights,
                                std::vector<std::vector<int32_t>>& drafts,
                                std::vector<std::vector<int32_t>>& parents) {
  const auto v = static_cast<int64_t>(weights.head->vocab.size());
  const std::vector<int32_t>& vocab = weights.head->vocab;
  // Level by level: the frontier's rows (one per node whose children are drafted next) step
  // together; their best columns come back, and the host grows each proposal's tree in level
  // order exactly as DraftHead::mtp_propose does, stopping a proposal at its max_nodes.
  struct Row {
    size_t proposal;
    int32_t index;  // in drafts[proposal]; −1: the root (the last token)
    int32_t token;
  };
  // A level's rows: per proposal at most min(max_nodes, the widths' product above the level).
  int64_t most_rows = 0;
  for (size_t level = 0;; ++level) {
    int64_t level_rows = 0;
    bool any = false;
    for (const size_t i : members) {
      const MtpProposal& p = proposals[i];
      if (level >= p.widths.size()) continue;
      any = true;
      int64_t nodes = 1;
      for (size_t l = 0; l < level && nodes < p.max_nodes; ++l) nodes *= p.widths[l];
      level_rows += std::min<int64_t>(nodes, level == 0 ? 1 : p.max_nodes);
    }
    if (!any) break;
    most_rows = std::max(most_rows, level_rows);
  }
  reserve_draft_rows(most_rows, v);
  std::vector<Row> frontier;
  std::vector<int32_t> tokens, src;
  upload_root_states(proposals, members, weights);
  for (const size_t i : members) {
    src.push_back(static_cast<int32_t>(frontier.size()));
    frontier.push_back({i, -1, proposals[i].last});
  }
  std::vector<bool> full(proposals.size(), false);
  float* h = xg_.get();
  float* z = xgn_.get();
  for (size_t level = 0; !frontier.empty(); ++level) {
    const auto n = static_cast<int64_t>(frontier.size());
    tokens.clear();
    for (const Row& row : frontier) tokens.push_back(row.token);
    upload_draft_rows(weights, tokens, src);
    std::vector<kernels::CandidateFilter> filters;
    for (const Row& row : frontier)
      filters.push_back(kernels::best_of(proposals[row.proposal].widths[level]));
    FilteredRows best;
    launch(name_, "an mtp tree level", [&] { mtp_step_rows(weights, h, z, n); });
    filter_rows(n, v, filters, best);  // ends with the stream's sync
    std::vector<Row> next;
    std::vector<int32_t> next_src;
    for (size_t j = 0; j < frontier.size(); ++j) {
      const Row& row = frontier[j];
      const size_t p = row.proposal;
      if (full[p]) continue;
      const MtpProposal& proposal = proposals[p];
      const int32_t take = static_cast<int32_t>(std::min<int64_t>(proposal.widths[level], v));
      // The row's best `take` columns, best first, ties to the lower column.
      const LogitRow candidates = best.row(static_cast<int64_t>(j));
      for (const auto& [logit, column] : best_columns(candidates, v, take)) {
        if (static_cast<int32_t>(drafts[p].size()) == proposal.max_nodes) {
          full[p] = true;
          break;
        }
        const int32_t token = vocab[static_cast<size_t>(column)];
        if (level + 1 < proposal.widths.size()) {
          next.push_back({p, static_cast<int32_t>(drafts[p].size()), token});
          next_src.push_back(static_cast<int32_t>(j));
        }
        drafts[p].push_back(token);
        parents[p].push_back(row.index);
      }
    }
    frontier = std::move(next);
    src = std::move(next_src);
    std::swap(h, z);
  }
}

void CudaDevice::mtp_best_first_group(std::span<const MtpProposal> proposals,
                                      const std::vector<size_t>& members,
                                      const DraftWeights& weights,
                                      std::vector<std::vector<int32_t>>& drafts,
                                      std::vector<std::vector<int32_t>>& parents) {
  const auto v = static_cast<int64_t>(weights.head->vocab.size());
  const std::vector<int32_t>& vocab = weights.head->vocab;
  // Level by level, the nodes of the whole `widths` tree that can still be among a proposal's
  // max_nodes most probable ones (path probability: the product of the head's softmax over its
  // vocabulary from the last token down) are expanded together. A deeper node is never more
  // probable than its parent, so the best max_nodes so far only get better as nodes are found:
  // a node ranked below them now never enters, and the final best max_nodes are the ones
  // DraftHead::mtp_propose_best_first grows one by one (ties aside).
  struct Node {
    double log_p;
    int64_t order;  // ties: the node found first
    int32_t token;
    int32_t parent;     // index in the proposal's nodes; −1: the last token
    int32_t depth;      // 1: a child of the last token
    int32_t state_row;  // the row of its parent's state at the level that found it
  };
  const auto better = [](const Node& a, const Node& b) {
    return a.log_p > b.log_p || (a.log_p == b.log_p && a.order < b.order);
  };
  std::vector<std::vector<Node>> found(members.size());
  struct Row {
    size_t member;
    int32_t node;  // −1: the root
    double log_p;
    int32_t depth;
  };
  // A level expands at most max_nodes nodes per proposal (those ranking among its best).
  int64_t most_rows = 0;
  for (const size_t i : members) most_rows += std::max(proposals[i].max_nodes, 1);
  reserve_draft_rows(most_rows, v);
  row_lse_.reserve(static_cast<size_t>(most_rows), name_, "draft normalisers");
  std::vector<Row> rows;
  std::vector<int32_t> tokens, src;
  upload_root_states(proposals, members, weights);
  for (size_t t = 0; t < members.size(); ++t) {
    const MtpProposal& p = proposals[members[t]];
    rows.push_back({t, -1, 0.0, 0});
    tokens.push_back(p.last);
    src.push_back(static_cast<int32_t>(t));
  }
  float* h = xg_.get();
  float* z = xgn_.get();
  std::vector<float> lse;
  while (!rows.empty()) {
    const auto n = static_cast<int64_t>(rows.size());
    upload_draft_rows(weights, tokens, src);
    std::vector<kernels::CandidateFilter> filters(rows.size());
    for (size_t j = 0; j < rows.size(); ++j)
      filters[j] = kernels::best_of(
          proposals[members[rows[j].member]].widths[static_cast<size_t>(rows[j].depth)]);
    lse.resize(rows.size());
    launch(name_, "a best-first mtp tree level", [&] {
      mtp_step_rows(weights, h, z, n);
      kernels::launch_row_logsumexp(logits_.get(), n, v, row_lse_.get(), stream_);
    });
    check(cudaMemcpyAsync(lse.data(), row_lse_.get(), lse.size() * sizeof(float),
                          cudaMemcpyDeviceToHost, stream_),
          name_, "downloading draft normalisers");
    FilteredRows best;
    filter_rows(n, v, filters, best);  // ends with the stream's sync (lse is down too)
    // Each row's children, best first.
    std::vector<size_t> fresh_from(members.size());
    for (size_t t = 0; t < members.size(); ++t) fresh_from[t] = found[t].size();
    for (size_t j = 0; j < rows.size(); ++j) {
      const Row& row = rows[j];
      const int32_t take = static_cast<int32_t>(std::min<int64_t>(filters[j].top_k, v));
      const LogitRow candidates = best.row(static_cast<int64_t>(j));
      std::vector<Node>& nodes = found[row.member];
      for (const auto& [logit, column] : best_columns(candidates, v, take)) {
        // A child is never more probable than its parent, also after rounding (the pruning
        // relies on it); NaN (infinite logits) ranks last.
        double log_p = std::min(
            row.log_p, row.log_p + (static_cast<double>(logit) - static_cast<double>(lse[j])));
        if (std::isnan(log_p)) log_p = -std::numeric_limits<double>::infinity();
        nodes.push_back({log_p, static_cast<int64_t>(nodes.size()),
                         vocab[static_cast<size_t>(column)], row.node, row.depth + 1,
                         static_cast<int32_t>(j)});
      }
    }
    // The next level: the nodes just found that rank among their proposal's best max_nodes and
    // have children to draft.
    std::vector<Row> next;
    std::vector<int32_t> next_tokens, next_src;
    for (size_t t = 0; t < members.size(); ++t) {
      const MtpProposal& p = proposals[members[t]];
      std::vector<Node>& nodes = found[t];
      std::vector<int32_t> by_rank(nodes.size());
      std::iota(by_rank.begin(), by_rank.end(), 0);
      std::sort(by_rank.begin(), by_rank.end(), [&](int32_t a, int32_t b) {
        return better(nodes[static_cast<size_t>(a)], nodes[static_cast<size_t>(b)]);
      });
      const size_t keep = std::min(by_rank.size(), static_cast<size_t>(p.max_nodes));
      for (size_t r = 0; r < keep; ++r) {
        const auto at = static_cast<size_t>(by_rank[r]);
        const Node& node = nodes[at];
        if (at < fresh_from[t] || node.depth >= static_cast<int32_t>(p.widths.size())) continue;
        next.push_back({t, static_cast<int32_t>(at), node.log_p, node.depth});
        next_tokens.push_back(node.token);
        next_src.push_back(node.state_row);
      }
    }
    rows = std::move(next);
    tokens = std::move(next_tokens);
    src = std::move(next_src);
    std::swap(h, z);
  }
  // Each proposal's best max_nodes in level order: by depth, then by the parent's place, then
  // best first.
  for (size_t t = 0; t < members.size(); ++t) {
    const size_t i = members[t];
    std::vector<Node>& nodes = found[t];
    std::vector<int32_t> chosen(nodes.size());
    std::iota(chosen.begin(), chosen.end(), 0);
    std::sort(chosen.begin(), chosen.end(), [&](int32_t a, int32_t b) {
      return better(nodes[static_cast<size_t>(a)], nodes[static_cast<size_t>(b)]);
    });
    chosen.resize(std::min(chosen.size(), static_cast<size_t>(proposals[i].max_nodes)));
    std::vector<int32_t> place(nodes.size(), -1);
    std::vector<int32_t> ordered;
    for (int32_t depth = 1; ordered.size() < chosen.size(); ++depth) {
      std::vector<int32_t> level;
      for (const int32_t c : chosen)
        if (nodes[static_cast<size_t>(c)].depth == depth) level.push_back(c);
      // chosen is best first, so a stable sort by the parent's place keeps each parent's
      // children best first.
      std::stable_sort(level.begin(), level.end(), [&](int32_t a, int32_t b) {
        const int32_t pa = nodes[static_cast<size_t>(a)].parent;
        const int32_t pb = nodes[static_cast<size_t>(b)].parent;
        return (pa < 0 ? -1 : place[static_cast<size_t>(pa)]) <
               (pb < 0 ? -1 : place[static_cast<size_t>(pb)]);
      });
      for (const int32_t c : level) {
        place[static_cast<size_t>(c)] = static_cast<int32_t>(ordered.size());
        ordered.push_back(c);
      }
    }
    for (const int32_t c : ordered) {
      const Node& node = nodes[static_cast<size_t>(c)];
      drafts[i].push_back(node.token);
      parents[i].push_back(node.parent < 0 ? -1 : place[static_cast<size_t>(node.parent)]);
    }
  }
}

}  // namespace tokenfab::cuda_backend

#endif  // TOKENFAB_HAVE_CUDA
