#pragma once
// The proposer: after each step, the drafts each decoding request's next step verifies. From its
// draft head — Medusa levels through one batched LM-head pass on the device; mtp chains and trees
// on the device (a GPU) or step by step on the host, one request per thread — from context lookup
// (context_lookup.h), or both merged into one tree. It chooses an adaptive chain's length from the
// device's measured step and proposal costs and the request's acceptance so far (draft_length.h),
// stops an mtp chain drafted on the host by confidence, and switches an `auto` request's head when
// its live acceptance falls behind another's record (head_switch.h). The verifier (verifier.h)
// judges the drafts; the worker (core/serving) asks both and keeps the request's figures.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/speculative/draft_device.h"
#include "core/speculative/draft_head.h"
#include "core/speculative/draft_length.h"
#include "core/speculative/draft_tree.h"
#include "core/speculative/head_switch.h"

namespace tokenfab {

// What a request asks of speculation (GenerationRequest's fields of the same names).
struct DraftRequest {
  std::shared_ptr<const DraftHead> head;  // the head it starts with; null: none
  std::vector<HeadCandidate> candidates;  // `auto`: the heads it may switch between
  int32_t draft_len = 4;
  bool adaptive_draft = false;
  std::vector<int32_t> tree_shape;
  int32_t tree_nodes = 0;
  int32_t lookup = 0;
};

// One request's drafting state from step to step.
struct DraftState {
  explicit DraftState(DraftRequest r);

  DraftRequest request;
  // The head proposing now: request.head until the switching policy (set when the request has
  // candidates) picks another.
  std::shared_ptr<const DraftHead> head;
  std::optional<HeadSwitchPolicy> head_policy;
  // Adaptive chains: the policy, made at the first proposal (again when a head switch changes
  // the longest chain), and the length it chose for the next step.
  std::optional<DraftLengthPolicy> length_policy;
  int32_t chosen_draft_len = 0;
  std::vector<float> hidden;  // the row the next drafts are proposed from (draft features)
  double proposal_s = 0.0;    // time spent proposing the drafts the next step verifies
  // Adaptive chains of an mtp head drafted on the host stop by confidence (ChainStopRule): the
  // path probabilities of the head drafts the next step verifies, and over the current head's
  // earlier such chains its drafts accepted and the sum of their probabilities (the rule's
  // calibration).
  std::vector<double> chain_probabilities;
  int64_t confident_accepted = 0;
  double confident_predicted = 0.0;

  int32_t max_draft_len() const;
  int32_t draft_len() const;
  // Most nodes of the head's own tree: room is kept for a context lookup branch (as deep as the
  // tree), which is merged in afterwards.
  int32_t head_tree_nodes() const;
  // Head rows a proposal needs: the chain's draft length, or the tree's depth; without a head,
  // the length of the context lookup chain (0 without lookup).
  int32_t draft_levels() const;
  bool drafts() const { return head != nullptr || request.lookup > 0; }

  // After a verifying step whose accepted path is `path` (rows 1… of the chain first): the
  // confidence rule's calibration.
  void on_verified_path(std::span<const int32_t> path);
};

// A head switch the policy made (HeadSwitchPolicy), for the request's figures and the log.
struct HeadSwitchEvent {
  std::string from, to;
  double live_accept_per_step = 0.0;  // the left head's, over the policy's window
  double from_record = 0.0, to_record = 0.0;
};

class Proposer {
 public:
  explicit Proposer(DraftDevice& device) : device_(device) {}

  // The device's measured costs: a decode/verification step by rows (the worker records them),
  // a proposal by draft steps (the proposer does).
  StepCostTable& step_costs() { return step_costs_; }
  const StepCostTable& proposal_costs() const { return proposal_costs_; }

  // A request that may propose now: one token pending, its state holding the hidden row when it
  // has a head.
  struct Candidate {
    DraftState* state = nullptr;
    std::span<const TokenId> context;  // its tokens so far, the last one included
    // Its acceptance so far (SpeculationStats), for adaptive lengths.
    std::span<const int64_t> proposed_at, accepted_at;
  };
  struct Proposal {
    std::vector<TokenId> draft;   // empty: nothing proposed
    std::vector<int32_t> parent;  // a tree's (the lookup branch merged in); empty: a chain
    double seconds = 0.0;         // this request's share of the proposal time
    // Adaptive chains: the length chosen (to count by length; 0: a plain step) and the longest
    // possible, when a choice was made.
    std::optional<int32_t> chosen_length;
    int32_t max_length = 0;
    // A chain stopped by confidence: the length it drafted (count it there instead).
    std::optional<int32_t> drafted_length;
  };
  // `others`: rows the other running sequences add to a step. One proposal per candidate.
  std::vector<Proposal> propose(std::span<const Candidate> candidates, int32_t others);

  // After a verifying step of `s` that emitted `tokens`: the head-switching policy, when the
  // request has candidates. On a switch the state's head changes and the event says how.
  static std::optional<HeadSwitchEvent> on_verified(DraftState& s, int32_t tokens);

 private:
  // Adaptive chains: chooses the next length into s.chosen_draft_len; false when the request
  // proposes nothing this time.
  bool choose_length(const Candidate& c, int32_t others, Proposal& out);
  bool stops_by_confidence(const DraftState& s) const;
  void propose_medusa(std::span<const Candidate> cs, std::span<const size_t> which,
                      std::vector<Proposal>& out);
  void propose_on_device(std::span<const Candidate> cs, std::span<const size_t> which,
                         std::vector<Proposal>& out);
  void propose_on_host(std::span<const Candidate> cs, std::span<const size_t> which, int32_t others,
                       std::vector<Proposal>& out);
  // The context lookup branch merged into a proposal of `length` levels (when asked).
  static void add_lookup(const Candidate& c, int32_t length, Proposal& p);

  DraftDevice& device_;
  StepCostTable step_costs_, proposal_costs_;
};

}  // namespace tokenfab
