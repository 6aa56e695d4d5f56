#include "core/metrics/live_counters.h"

#include <algorithm>
#include <cmath>

#include "core/common/error.h"

namespace tokenfab {

BucketHistogram::BucketHistogram(std::vector<double> bounds) : bounds_(std::move(bounds)) {
  for (size_t i = 0; i < bounds_.size(); ++i)
    if (!std::isfinite(bounds_[i]) || (i > 0 && bounds_[i] <= bounds_[i - 1]))
      throw Error("BucketHistogram: the bounds must be finite and strictly ascending");
  counts_.assign(bounds_.size() + 1, 0);
}

void BucketHistogram::add(double value) {
  // The first bound >= value: Prometheus' buckets are "less than or equal".
  const auto it = std::lower_bound(bounds_.begin(), bounds_.end(), value);
  ++counts_[static_cast<size_t>(it - bounds_.begin())];
  sum_ += value;
  ++count_;
}

std::vector<int64_t> BucketHistogram::cumulative() const {
  std::vector<int64_t> out(counts_.size());
  int64_t running = 0;
  for (size_t i = 0; i < counts_.size(); ++i) out[i] = running += counts_[i];
  return out;
}

std::vector<double> LiveCounters::ttft_bounds() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
}

std::vector<double> LiveCounters::itl_bounds() {
  return {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2, 0.3,
          0.4,    0.5,   0.75,   1.0,   2.5,  5.0,   7.5,  10.0,  20.0, 40.0, 80.0};
}

std::vector<double> LiveCounters::e2e_bounds() {
  return {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
          30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
}

LiveCounters::LiveCounters() : ttft_s(ttft_bounds()), itl_s(itl_bounds()), e2e_s(e2e_bounds()) {
  for (const char* reason : {kFinishStop, kFinishLength, kFinishAbort, kFinishError})
    ended_by_reason[reason] = 0;
}

void LiveCounters::on_ended(const EndedRequest& r) {
  ++ended_by_reason[r.finish_reason];
  if (r.ttft_s) ttft_s.add(*r.ttft_s);
  if (r.e2e_s) e2e_s.add(*r.e2e_s);
  for (const double gap : r.itl_s) itl_s.add(gap);
  if (r.verify_steps == 0 && r.proposed_at.empty()) return;
  SpeculationCounters& s = speculation_by_head[r.head];
  s.drafts += r.verify_steps;
  for (const int64_t n : r.proposed_at) s.draft_tokens += n;
  if (s.accepted_per_position.size() < r.accepted_at.size())
    s.accepted_per_position.resize(r.accepted_at.size());
  for (size_t k = 0; k < r.accepted_at.size(); ++k) {
    s.accepted_tokens += r.accepted_at[k];
    s.accepted_per_position[k] += r.accepted_at[k];
  }
}

}  // namespace tokenfab
