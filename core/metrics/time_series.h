#pragma once
// A bounded series of timestamped samples (a ring buffer) and the rate over a sliding window,
// e.g. output tokens per second over the last W seconds. The rate is computed from the event
// timestamps themselves — sum of the values of events in (start, now] divided by (now - start) —
// with no smoothing. `start` is now - W, moved later when the window reaches back before the
// series' origin (the engine had not started) or before samples the ring has already dropped;
// WindowRate says which span was used, so a view can show it.
//
// Thread-safe: append and the readers take one mutex; snapshot() returns a copy.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "core/metrics/request_metrics.h"

namespace tokenfab {

struct TimeSample {
  MetricsTime time;
  double value = 0.0;  // e.g. tokens emitted at `time`
};

struct WindowRate {
  double per_second = 0.0;  // sum / span_s; 0 when span_s == 0
  double sum = 0.0;         // sum of values of the events counted
  int64_t events = 0;       // number of events counted
  double span_s = 0.0;      // length of the window actually used, <= the requested window
  bool truncated = false;   // true when dropped samples made the span shorter than requested
};

class TimeSeries {
 public:
  // capacity >= 1 samples are kept (the oldest are dropped first). `origin` is when counting
  // began (engine or benchmark start); no window reaches before it.
  TimeSeries(size_t capacity, MetricsTime origin);

  // Samples should come in time order; an out-of-order sample is kept in arrival order but
  // still counted by its own time.
  void append(MetricsTime t, double value);

  std::vector<TimeSample> snapshot() const;  // oldest first
  size_t size() const;
  size_t capacity() const { return capacity_; }
  int64_t total_appended() const;

  // Rate over (now - window, now]; events after `now` are ignored.
  WindowRate rate(MetricsTime now, std::chrono::nanoseconds window) const;

 private:
  const size_t capacity_;
  const MetricsTime origin_;
  mutable std::mutex mutex_;
  std::vector<TimeSample> ring_;  // (capacity_), valid entries: min(appended_, capacity_)
  size_t next_ = 0;               // slot of the next append
  int64_t appended_ = 0;
  std::optional<MetricsTime> latest_dropped_;  // latest time among dropped samples
};

}  // namespace tokenfab
