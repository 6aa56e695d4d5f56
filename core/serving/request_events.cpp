#include "core/serving/request_events.h"

namespace tokenfab {

RequestEvents::RequestEvents(Engine& engine) : engine_(engine) {
  subscription_ = engine_.subscribe([this](const TokenEvent& e) {
    std::lock_guard lock(mutex_);
    events_.push_back(e);
    cv_.notify_all();
  });
}

RequestEvents::~RequestEvents() { engine_.unsubscribe(subscription_); }

std::vector<TokenEvent> RequestEvents::take(RequestId id, std::chrono::milliseconds wait) {
  std::unique_lock lock(mutex_);
  cv_.wait_for(lock, wait, [&] { return !events_.empty(); });
  std::vector<TokenEvent> mine;
  for (TokenEvent& e : events_)
    if (e.id == id) mine.push_back(std::move(e));
  events_.clear();
  return mine;
}

}  // namespace tokenfab
