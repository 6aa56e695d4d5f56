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
#include "core/speculative/proposer.h"

namespace tokenfab {

class Worker;

struct Engine::Record {
  Record(RequestId id, GenerationRequest req, MetricsTime submitted)
      : id(id), request(std::move(req)), sampler(request.sampling), timeline(submitted) {
    info.id = id;
    info.n_prompt = static_cast<int32_t>(request.prompt.size());
    info.entered[static_cast<size_t>(RequestState::kQueued)] = submitted;
    if (request.head) info.head = request.head->info.name;
  }

  static DraftRequest draft_request(const GenerationRequest& r) {
    return {r.head,       r.head_candidates, r.draft_len, r.adaptive_draft,
            r.tree_shape, r.tree_nodes,      r.lookup};
  }

  const RequestId id;
  const GenerationRequest request;
  std::atomic<bool> cancelled{false};
  std::atomic<bool> stopped_by_caller{false};  // cancel(kStopText): finish reason "stop"
  Engine::TokenCallback
      on_event;  // submit()'s per-request callback (set before any worker sees it)

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
  // Speculative decoding: the request's drafting state from step to step (proposer.h).
  DraftState draft{draft_request(request)};

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
