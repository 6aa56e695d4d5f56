#pragma once
// One caller's view of the engine's token events while it drives its own requests (the CLI's
// generate, the API server's requests): subscribes on construction, unsubscribes on destruction,
// and hands back the events of one request. Events arrive on worker threads, possibly before
// submit() has returned the request's id, so every event is queued and picked here.

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <vector>

#include "core/serving/engine.h"

namespace tokenfab {

class RequestEvents {
 public:
  explicit RequestEvents(Engine& engine);
  ~RequestEvents();
  RequestEvents(const RequestEvents&) = delete;
  RequestEvents& operator=(const RequestEvents&) = delete;

  // The events of request `id` that arrived since the last call, in order, after waiting up to
  // `wait` for any event; the queued events of other requests are dropped.
  std::vector<TokenEvent> take(RequestId id, std::chrono::milliseconds wait);

 private:
  Engine& engine_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<TokenEvent> events_;
  int64_t subscription_;
};

}  // namespace tokenfab
