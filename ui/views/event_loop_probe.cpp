#include "ui/views/event_loop_probe.h"

#include <algorithm>

#include "core/metrics/percentiles.h"

namespace tokenfab::ui {

EventLoopProbe::EventLoopProbe(QObject* parent) : QObject(parent) {
  timer_.setSingleShot(true);
  timer_.setTimerType(Qt::PreciseTimer);
  connect(&timer_, &QTimer::timeout, this, &EventLoopProbe::fire);
}

void EventLoopProbe::start() {
  lateness_ms_.clear();
  worst_ms_ = worst_at_s_ = 0;
  clock_.start();
  due_ns_ = clock_.nsecsElapsed() + kIntervalMs * 1'000'000LL;
  timer_.start(kIntervalMs);
}

void EventLoopProbe::stop() {
  timer_.stop();
}

void EventLoopProbe::fire() {
  const qint64 now = clock_.nsecsElapsed();
  const double late_ms = std::max<qint64>(0, now - due_ns_) / 1e6;
  if (lateness_ms_.empty() || late_ms > worst_ms_) {
    worst_ms_ = late_ms;
    worst_at_s_ = due_ns_ / 1e9;
  }
  lateness_ms_.push_back(late_ms);
  due_ns_ = now + kIntervalMs * 1'000'000LL;
  timer_.start(kIntervalMs);
}

LatencySummary summarize_latency(const std::vector<double>& ms) {
  LatencySummary s;
  s.samples = static_cast<int64_t>(ms.size());
  if (ms.empty()) return s;
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  s.p50_ms = percentile_of_sorted(sorted, 50);
  s.p99_ms = percentile_of_sorted(sorted, 99);
  s.max_ms = sorted.back();
  return s;
}

}  // namespace tokenfab::ui
