#include "core/metrics/time_series.h"

#include <algorithm>

#include "core/common/error.h"

namespace tokenfab {

TimeSeries::TimeSeries(size_t capacity, MetricsTime origin) : capacity_(capacity), origin_(origin) {
  if (capacity == 0) throw Error("TimeSeries: capacity must be >= 1");
  ring_.resize(capacity);
}

void TimeSeries::append(MetricsTime t, double value) {
  std::lock_guard lock(mutex_);
  if (appended_ >= static_cast<int64_t>(capacity_)) {
    const MetricsTime dropped = ring_[next_].time;
    if (!latest_dropped_ || dropped > *latest_dropped_) latest_dropped_ = dropped;
  }
  ring_[next_] = {t, value};
  next_ = (next_ + 1) % capacity_;
  ++appended_;
}

std::vector<TimeSample> TimeSeries::snapshot() const {
  std::lock_guard lock(mutex_);
  std::vector<TimeSample> out;
  const size_t n = std::min(static_cast<size_t>(appended_), capacity_);
  out.reserve(n);
  const size_t first = n < capacity_ ? 0 : next_;
  for (size_t i = 0; i < n; ++i) out.push_back(ring_[(first + i) % capacity_]);
  return out;
}

size_t TimeSeries::size() const {
  std::lock_guard lock(mutex_);
  return std::min(static_cast<size_t>(appended_), capacity_);
}

int64_t TimeSeries::total_appended() const {
  std::lock_guard lock(mutex_);
  return appended_;
}

WindowRate TimeSeries::rate(MetricsTime now, std::chrono::nanoseconds window) const {
  std::lock_guard lock(mutex_);
  WindowRate r;
  MetricsTime start = std::max(now - window, origin_);
  // Events at or before a dropped sample's time may be missing, so the window starts there.
  if (latest_dropped_ && *latest_dropped_ > start) {
    start = *latest_dropped_;
    r.truncated = true;
  }
  if (now <= start) return r;
  r.span_s = seconds_between(start, now);
  const size_t n = std::min(static_cast<size_t>(appended_), capacity_);
  for (size_t i = 0; i < n; ++i) {
    const TimeSample& s = ring_[i];
    if (s.time > start && s.time <= now) {
      r.sum += s.value;
      ++r.events;
    }
  }
  r.per_second = r.sum / r.span_s;
  return r;
}

}  // namespace tokenfab
