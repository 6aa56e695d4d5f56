#pragma once
// One caller's view of its own request while it drives it (the CLI's generate, the API server's
// requests): submits the request with a callback of its own (Engine::submit's on_event), so the
// engine hands this caller only this request's events — never the other requests' — and queues
// them here until take() picks them up. Events arrive on worker threads, possibly before submit()
// has returned; the queue outlives this object for as long as the engine may still call it.

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "core/serving/engine.h"

namespace tokenfab {

class RequestEvents {
 public:
  // Submits `request`; throws as Engine::submit does.
  RequestEvents(Engine& engine, GenerationRequest request);
  RequestEvents(const RequestEvents&) = delete;
  RequestEvents& operator=(const RequestEvents&) = delete;

  RequestId id() const { return id_; }
  // The request's events that arrived since the last call, in order, after waiting up to `wait`
  // for one.
  std::vector<TokenEvent> take(std::chrono::milliseconds wait);

 private:
  struct Queue {
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<TokenEvent> events;
  };
  std::shared_ptr<Queue> queue_ = std::make_shared<Queue>();
  RequestId id_ = 0;
};

}  // namespace tokenfab
