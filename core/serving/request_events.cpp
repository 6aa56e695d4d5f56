#include "core/serving/request_events.h"

namespace tokenfab {

RequestEvents::RequestEvents(Engine& engine, GenerationRequest request) {
  id_ = engine.submit(std::move(request), [queue = queue_](const TokenEvent& e) {
    std::lock_guard lock(queue->mutex);
    queue->events.push_back(e);
    queue->cv.notify_one();
  });
}

std::vector<TokenEvent> RequestEvents::take(std::chrono::milliseconds wait) {
  std::unique_lock lock(queue_->mutex);
  queue_->cv.wait_for(lock, wait, [&] { return !queue_->events.empty(); });
  std::vector<TokenEvent> mine(std::make_move_iterator(queue_->events.begin()),
                               std::make_move_iterator(queue_->events.end()));
  queue_->events.clear();
  return mine;
}

}  // namespace tokenfab
