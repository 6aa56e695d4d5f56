#include "core/speculative/proposer.h"

#include <algorithm>
#include <chrono>

#include "core/speculative/context_lookup.h"

namespace tokenfab {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

// ---- DraftState --------------------------------------------------------------------------------

DraftState::DraftState(DraftRequest r) : request(std::move(r)), head(request.head) {
  for (size_t i = 0; i < request.candidates.size(); ++i)
    if (request.head && request.candidates[i].head == request.head)
      head_policy.emplace(request.candidates.size(), i);
}

int32_t DraftState::max_draft_len() const {
  if (head) return std::min(request.draft_len, head->n_heads());
  return request.lookup > 0 ? request.draft_len : 0;  // context lookup alone: a chain
}

int32_t DraftState::draft_len() const {
  return length_policy ? std::min(chosen_draft_len, max_draft_len()) : max_draft_len();
}

int32_t DraftState::head_tree_nodes() const {
  return kMaxDraftTreeNodes - (request.lookup > 0 ? draft_levels() : 0);
}

int32_t DraftState::draft_levels() const {
  if (!head) return draft_len();
  return request.tree_shape.empty() ? draft_len() : static_cast<int32_t>(request.tree_shape.size());
}

void DraftState::on_verified_path(std::span<const int32_t> path) {
  if (chain_probabilities.empty()) return;
  // The head's chain is the draft's first nodes (rows 1, 2, …), whatever a context lookup branch
  // added after them.
  int64_t hits = 0;
  while (hits < static_cast<int64_t>(chain_probabilities.size()) &&
         hits < static_cast<int64_t>(path.size()) && path[static_cast<size_t>(hits)] == hits + 1)
    ++hits;
  confident_accepted += hits;
  for (const double p : chain_probabilities) confident_predicted += p;
  chain_probabilities.clear();
}

// ---- Proposer ----------------------------------------------------------------------------------

std::optional<HeadSwitchEvent> Proposer::on_verified(DraftState& s, int32_t tokens) {
  if (!s.head_policy) return std::nullopt;
  const std::vector<HeadCandidate>& candidates = s.request.candidates;
  const size_t from = s.head_policy->current();
  const std::optional<size_t> to = s.head_policy->on_step(candidates, tokens);
  if (!to) return std::nullopt;
  HeadSwitchEvent change;
  change.from = candidates[from].head->info.name;
  change.to = candidates[*to].head->info.name;
  change.from_record = candidates[from].recorded_accept_per_step;
  change.to_record = candidates[*to].recorded_accept_per_step;
  change.live_accept_per_step = s.head_policy->live_at_last_switch();
  s.head = candidates[*to].head;
  s.confident_accepted = 0;  // the new head's calibration starts afresh
  s.confident_predicted = 0.0;
  return change;
}

bool Proposer::stops_by_confidence(const DraftState& s) const {
  return s.request.adaptive_draft && s.request.tree_shape.empty() && s.head && s.head->is_mtp() &&
         !device_.mtp_on_device();
}

bool Proposer::choose_length(const Candidate& c, int32_t others, Proposal& out) {
  DraftState& s = *c.state;
  if (!s.request.adaptive_draft || !s.request.tree_shape.empty()) return s.draft_levels() > 0;
  const int32_t max = s.max_draft_len();
  if (max < 1) return false;
  if (!s.length_policy || s.length_policy->max_length() != max) s.length_policy.emplace(max);
  const std::vector<int64_t> proposed(c.proposed_at.begin(), c.proposed_at.end());
  const std::vector<int64_t> accepted(c.accepted_at.begin(), c.accepted_at.end());
  int32_t k = s.length_policy->choose(proposed, accepted, step_costs_, proposal_costs_, others);
  // A chain that stops by confidence drafts up to the longest; the rule cuts it per step (the
  // proposal then says the length it drafted).
  if (k > 0 && stops_by_confidence(s)) k = max;
  s.chosen_draft_len = k;
  out.chosen_length = k;
  out.max_length = max;
  return k > 0;
}

void Proposer::add_lookup(const Candidate& c, int32_t length, Proposal& p) {
  if (c.state->request.lookup > 0) {
    const std::vector<TokenId> branch =
        lookup_continuation(c.context, c.state->request.lookup, length);
    merge_draft_branch(p.draft, p.parent, branch, kMaxDraftTreeNodes);
  }
}

std::vector<Proposer::Proposal> Proposer::propose(std::span<const Candidate> cs, int32_t others) {
  std::vector<Proposal> out(cs.size());
  // Every length is chosen before any proposal's cost is recorded. Medusa heads: K residual rows
  // each, then one LM-head pass over all of them. mtp heads: on the device when it drafts them
  // itself (a GPU), else their own sequential steps, one request per host thread.
  std::vector<size_t> medusa, on_host, on_device;
  for (size_t i = 0; i < cs.size(); ++i) {
    DraftState& s = *cs[i].state;
    if (!s.head) {  // context lookup alone, when the request asks for it
      if (s.request.lookup > 0 && choose_length(cs[i], others, out[i])) {
        s.proposal_s = 0.0;  // copied from the context: no model work
        add_lookup(cs[i], s.draft_levels(), out[i]);
      }
      continue;
    }
    if (s.hidden.empty()) continue;
    if (!choose_length(cs[i], others, out[i])) {
      s.hidden.clear();
      continue;
    }
    if (s.head->is_mtp())
      (device_.mtp_on_device() ? on_device : on_host).push_back(i);
    else
      medusa.push_back(i);
  }
  if (!on_device.empty()) propose_on_device(cs, on_device, out);
  if (!on_host.empty()) propose_on_host(cs, on_host, others, out);
  if (!medusa.empty()) propose_medusa(cs, medusa, out);
  return out;
}

void Proposer::propose_medusa(std::span<const Candidate> cs, std::span<const size_t> which,
                              std::vector<Proposal>& out) {
  std::vector<MedusaProposal> proposals;
  for (const size_t i : which) {
    const DraftState& s = *cs[i].state;
    proposals.push_back({s.head, s.hidden.data(), s.draft_levels()});
  }
  const Clock::time_point start = Clock::now();
  int64_t rows = 0;
  for (const MedusaProposal& p : proposals) rows += p.levels;
  // Each head row's top tokens: one for a chain, tree_shape[level] for a tree.
  std::vector<int32_t> wanted(static_cast<size_t>(rows), 1);
  size_t at = 0;
  for (const size_t i : which) {
    const DraftState& s = *cs[i].state;
    for (int32_t level = 0; level < s.draft_levels(); ++level, ++at)
      if (!s.request.tree_shape.empty())
        wanted[at] = s.request.tree_shape[static_cast<size_t>(level)];
  }
  std::vector<std::vector<TokenId>> best;
  device_.medusa_top(proposals, wanted, best);
  proposals.clear();
  for (const size_t i : which) cs[i].state->hidden.clear();
  const double seconds = seconds_since(start);
  size_t next = 0;
  for (const size_t i : which) {
    DraftState& s = *cs[i].state;
    Proposal& p = out[i];
    const int32_t k = s.draft_levels();
    if (s.request.tree_shape.empty()) {
      for (int32_t level = 0; level < k; ++level) p.draft.push_back(best[next + level].front());
    } else {
      build_draft_tree(std::span(best).subspan(next, static_cast<size_t>(k)), p.draft, p.parent,
                       s.head_tree_nodes());
    }
    add_lookup(cs[i], k, p);
    next += static_cast<size_t>(k);
    s.proposal_s = seconds * k / static_cast<double>(rows);
    proposal_costs_.record(k, s.proposal_s);
    p.seconds = s.proposal_s;
  }
}

void Proposer::propose_on_device(std::span<const Candidate> cs, std::span<const size_t> which,
                                 std::vector<Proposal>& out) {
  const Clock::time_point start = Clock::now();
  std::vector<MtpProposal> proposals;
  for (const size_t i : which) {
    const DraftState& s = *cs[i].state;
    const std::vector<int32_t>& shape = s.request.tree_shape;
    const auto levels = static_cast<size_t>(s.draft_levels());
    MtpProposal& p = proposals.emplace_back();
    p.head = s.head;
    p.hidden = s.hidden.data();
    p.last = cs[i].context.back();
    if (shape.empty())
      p.widths.assign(levels, 1);
    else
      p.widths.assign(shape.begin(), shape.begin() + static_cast<ptrdiff_t>(levels));
    p.max_nodes = s.head_tree_nodes();
    if (!shape.empty() && s.request.tree_nodes > 0) {
      p.best_first = true;
      p.max_nodes = std::min(s.request.tree_nodes, p.max_nodes);
    }
  }
  std::vector<std::vector<TokenId>> drafts, parents;
  device_.mtp_propose(proposals, drafts, parents);
  // One pass drafted them all: each request's share of its time is by its levels.
  const double seconds = seconds_since(start);
  int64_t total = 0;
  for (const size_t i : which) total += cs[i].state->draft_levels();
  for (size_t j = 0; j < which.size(); ++j) {
    DraftState& s = *cs[which[j]].state;
    Proposal& p = out[which[j]];
    const double share = seconds * s.draft_levels() / static_cast<double>(total);
    s.hidden.clear();
    s.proposal_s = share;
    proposal_costs_.record(s.draft_levels(), share);
    if (s.request.tree_shape.empty()) parents[j].clear();  // a chain
    p.draft = std::move(drafts[j]);
    p.parent = std::move(parents[j]);
    add_lookup(cs[which[j]], s.draft_levels(), p);
    p.seconds = share;
  }
}

void Proposer::propose_on_host(std::span<const Candidate> cs, std::span<const size_t> which,
                               int32_t others, std::vector<Proposal>& out) {
  struct Work {
    std::vector<TokenId> draft;
    std::vector<int32_t> parent;
    double seconds = 0.0;
    int32_t steps = 0;                       // draft steps computed
    std::optional<ChainStopRule> stop_rule;  // adaptive mtp chains: stopping by confidence
  };
  std::vector<Work> work(which.size());
  for (size_t j = 0; j < which.size(); ++j) {
    const DraftState& s = *cs[which[j]].state;
    if (stops_by_confidence(s))
      work[j].stop_rule.emplace(
          step_costs_, proposal_costs_, others, s.draft_levels(),
          ChainStopRule::calibration(s.confident_accepted, s.confident_predicted));
  }
  // One request per host thread when there are enough of them; fewer requests than threads
  // propose one after another, each draft step's products split over all the device's threads
  // (the drafts are the same either way).
  const int64_t threads = device_.threads();
  const bool one_by_one = static_cast<int64_t>(which.size()) < threads;
  const DraftSplit split = [this](int64_t parts, const std::function<void(int64_t)>& fn) {
    device_.parallel_for(parts, fn);
  };
  const DraftSplit* step_split = one_by_one ? &split : nullptr;
  const int64_t parts = one_by_one ? threads : 1;
  const auto propose = [&](int64_t j) {
    const Candidate& c = cs[which[static_cast<size_t>(j)]];
    const DraftState& s = *c.state;
    const TokenId last = c.context.back();
    const Clock::time_point start = Clock::now();
    const std::vector<int32_t> chain(static_cast<size_t>(s.draft_levels()), 1);
    const std::vector<int32_t>& shape = s.request.tree_shape.empty() ? chain : s.request.tree_shape;
    Work& w = work[static_cast<size_t>(j)];
    const auto levels = std::span(shape).first(static_cast<size_t>(s.draft_levels()));
    if (!s.request.tree_shape.empty() && s.request.tree_nodes > 0) {
      s.head->mtp_propose_best_first(device_.model(), s.hidden.data(), last, levels,
                                     std::min(s.request.tree_nodes, s.head_tree_nodes()), w.draft,
                                     w.parent, step_split, parts);
    } else if (w.stop_rule) {
      ChainStopRule& rule = *w.stop_rule;
      const ChainStop stop = [&rule](double path_probability) {
        return rule.judge(path_probability);
      };
      s.head->mtp_propose(device_.model(), s.hidden.data(), last, levels, s.head_tree_nodes(),
                          w.draft, w.parent, step_split, parts, &stop);
    } else {
      s.head->mtp_propose(device_.model(), s.hidden.data(), last, levels, s.head_tree_nodes(),
                          w.draft, w.parent, step_split, parts);
    }
    if (s.request.tree_shape.empty()) w.parent.clear();  // a chain
    w.steps = w.stop_rule ? w.stop_rule->steps() : s.draft_levels();
    w.seconds = seconds_since(start);
  };
  if (one_by_one) {
    for (int64_t j = 0; j < static_cast<int64_t>(which.size()); ++j) propose(j);
  } else {
    device_.parallel_for(static_cast<int64_t>(which.size()), propose);
  }
  for (size_t j = 0; j < which.size(); ++j) {
    DraftState& s = *cs[which[j]].state;
    Work& w = work[j];
    Proposal& p = out[which[j]];
    s.hidden.clear();
    s.proposal_s = w.seconds;
    proposal_costs_.record(w.steps, w.seconds);
    const int32_t chosen = s.draft_levels();
    const auto drafted = static_cast<int32_t>(w.draft.size());
    if (w.stop_rule) {
      const std::vector<double>& kept = w.stop_rule->kept_probabilities();
      s.chain_probabilities.assign(kept.begin(),
                                   kept.begin() + std::min<ptrdiff_t>(drafted, std::ssize(kept)));
    }
    p.draft = std::move(w.draft);
    p.parent = std::move(w.parent);
    add_lookup(cs[which[j]], chosen, p);
    p.seconds = w.seconds;
    if (w.stop_rule && drafted != chosen) p.drafted_length = drafted;
  }
}

}  // namespace tokenfab
