#pragma once
// Engine::Record: one request as the engine and its workers share it. Ownership of the
// worker-side fields moves with the request: the worker holding it (its prefill worker, then
// its decode worker) is the only thread touching them, and the hand-off goes through a queue.
// The public view (`info`) is read by any thread under `mutex`.

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "core/metrics/request_metrics.h"
#include "core/runtime/sampler.h"
#include "core/serving/engine.h"
#include "core/speculative/draft_length.h"

namespace tokenfab {

class Worker;

struct Engine::Record {
  Record(RequestId id, GenerationRequest req, MetricsTime submitted)
      : id(id), request(std::move(req)), sampler(request.sampling), timeline(submitted) {
    info.id = id;
    info.n_prompt = static_cast<int32_t>(request.prompt.size());
    info.entered[static_cast<size_t>(RequestState::kQueued)] = submitted;
    if (request.head) info.head = request.head->info.name;
    for (size_t i = 0; i < request.head_candidates.size(); ++i)
      if (request.head && request.head_candidates[i].head == request.head)
        head_policy.emplace(request.head_candidates.size(), i);
  }

  const RequestId id;
  const GenerationRequest request;
  std::atomic<bool> cancelled{false};
  std::atomic<bool> stopped_by_caller{false};  // cancel(kStopText): finish reason "stop"

  // Worker-side (see above).
  Sampler sampler;
  RequestTimeline timeline;
  Worker* prefill_worker = nullptr;
  Worker* decode_worker = nullptr;
  std::vector<TokenId> generated;  // sampled so far (the prefill device's first token, ...)
  // Where the prompt's KV lies in the prefill device's storage (its blocks' slots:
  // BlockPool::slot).
  std::vector<int32_t> source_blocks;
  // Streamed hand-off (Worker::step): set by the prefill worker before the step that computes the
  // prompt's last chunk, when it hands the request over; layers_ready counts that step's layers
  // whose KV is written (the transfer copies no further). Read by the decode worker from then on.
  bool streamed = false;
  std::shared_ptr<std::atomic<int32_t>> layers_ready;
  int64_t prefill_tokens_left = 0;  // counted in the prefill worker's queued-token load
  std::vector<float> draft_hidden;  // hidden state the next drafts are proposed from
  double proposal_s = 0.0;          // time spent proposing the drafts the next step verifies
  // The draft head proposing now: request.head until the switching policy (set when the request
  // has candidates, head_switch.h) picks another.
  std::shared_ptr<const DraftHead> head = request.head;
  std::optional<HeadSwitchPolicy> head_policy;
  // Adaptive chains (request.adaptive_draft, draft_length.h): the policy, made at the first
  // proposal (again when a head switch changes the longest chain), and the length it chose for
  // the next step.
  std::optional<DraftLengthPolicy> length_policy;
  int32_t chosen_draft_len = 0;
  // Adaptive chains of an mtp head drafted on the host stop by confidence (ChainStopRule): the
  // path probabilities of the head drafts the next step verifies, and over the current head's
  // earlier such chains its drafts accepted and the sum of their probabilities (the rule's
  // calibration).
  std::vector<double> chain_probabilities;
  int64_t confident_accepted = 0;
  double confident_predicted = 0.0;
  int32_t max_draft_len() const {
    if (head) return std::min(request.draft_len, head->n_heads());
    return request.lookup > 0 ? request.draft_len : 0;  // context lookup alone: a chain
  }
  int32_t draft_len() const {
    return length_policy ? std::min(chosen_draft_len, max_draft_len()) : max_draft_len();
  }
  // Most nodes of the head's own tree: room is kept for a context lookup branch (as deep as the
  // tree), which is merged in afterwards (Worker::set_draft).
  int32_t head_tree_nodes() const {
    return GenerationRequest::kMaxTreeNodes - (request.lookup > 0 ? draft_levels() : 0);
  }
  // Head rows a proposal needs: the chain's draft length, or the tree's depth; without a head,
  // the length of the context lookup chain (0 without lookup).
  int32_t draft_levels() const {
    if (!head) return draft_len();
    return request.tree_shape.empty() ? draft_len()
                                      : static_cast<int32_t>(request.tree_shape.size());
  }

  mutable std::mutex mutex;  // guards info
  RequestInfo info;

  RequestState state() const {
    std::lock_guard lock(mutex);
    return info.state;
  }
  void enter(RequestState s, MetricsTime t) {
    std::lock_guard lock(mutex);
    info.state = s;
    info.entered[static_cast<size_t>(s)] = t;
  }
};

}  // namespace tokenfab
