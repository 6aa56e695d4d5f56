#include "core/metrics/percentiles.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/common/error.h"

namespace tokenfab {

namespace {

void check_q(double q) {
  if (!(q >= 0.0 && q <= 100.0)) {
    throw Error("percentile: q must be in [0, 100], got " + std::to_string(q));
  }
}

// numpy's _lerp: a + (b - a) * t, evaluated from the nearer end so that t == 1 gives b exactly.
double lerp_like_numpy(double a, double b, double t) {
  const double diff = b - a;
  return t >= 0.5 ? b - diff * (1.0 - t) : a + diff * t;
}

}  // namespace

double percentile_of_sorted(std::span<const double> sorted, double q) {
  check_q(q);
  if (sorted.empty()) throw Error("percentile: empty sample");
  const size_t n = sorted.size();
  // numpy divides q by 100 first, then scales by (n - 1).
  const double h = static_cast<double>(n - 1) * (q / 100.0);
  const double lo_f = std::floor(h);
  const size_t lo = std::min(static_cast<size_t>(lo_f), n - 1);
  const size_t hi = std::min(lo + 1, n - 1);
  return lerp_like_numpy(sorted[lo], sorted[hi], h - lo_f);
}

double percentile(std::span<const double> values, double q) {
  std::vector<double> sorted(values.begin(), values.end());
  std::sort(sorted.begin(), sorted.end());
  return percentile_of_sorted(sorted, q);
}

PercentileSummary summarize_percentiles(std::vector<double> values) {
  PercentileSummary s;
  s.count = static_cast<int64_t>(values.size());
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  s.p50 = percentile_of_sorted(values, 50.0);
  s.p95 = percentile_of_sorted(values, 95.0);
  s.p99 = percentile_of_sorted(values, 99.0);
  s.max = values.back();
  return s;
}

LogHistogram::LogHistogram(double min_value, double max_value, int buckets_per_decade)
    : min_value_(min_value) {
  if (!(min_value > 0.0 && max_value > min_value) || buckets_per_decade < 1) {
    throw Error("LogHistogram: need 0 < min_value < max_value and buckets_per_decade >= 1");
  }
  log_ratio_ = std::log(10.0) / buckets_per_decade;
  n_regular_ = static_cast<int>(std::ceil(std::log(max_value / min_value) / log_ratio_ - 1e-9));
  counts_.assign(static_cast<size_t>(n_regular_) + 2, 0);
}

int LogHistogram::bucket_index(double value) const {
  if (!(value >= min_value_)) return 0;  // also NaN
  const double k = std::floor(std::log(value / min_value_) / log_ratio_);
  if (k >= n_regular_) return n_regular_ + 1;
  int i = static_cast<int>(k) + 1;
  // log() rounding can put a value on an edge into the neighbour bucket; fix by the edges.
  if (value < bucket_lower(i))
    --i;
  else if (value >= bucket_upper(i))
    ++i;
  return std::clamp(i, 1, n_regular_ + 1);
}

double LogHistogram::bucket_lower(int i) const {
  if (i <= 0) return -std::numeric_limits<double>::infinity();
  return min_value_ * std::exp(log_ratio_ * (i - 1));
}

double LogHistogram::bucket_upper(int i) const {
  if (i > n_regular_) return std::numeric_limits<double>::infinity();
  return min_value_ * std::exp(log_ratio_ * i);
}

void LogHistogram::add(double value) {
  ++counts_[static_cast<size_t>(bucket_index(value))];
  ++total_;
}

void LogHistogram::clear() {
  std::fill(counts_.begin(), counts_.end(), 0);
  total_ = 0;
}

std::optional<double> LogHistogram::approx_percentile(double q) const {
  check_q(q);
  if (total_ == 0) return std::nullopt;
  const auto rank = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(q / 100.0 * total_)));
  int64_t seen = 0;
  int i = 0;
  for (; i < bucket_count(); ++i) {
    seen += counts_[static_cast<size_t>(i)];
    if (seen >= rank) break;
  }
  return std::clamp(bucket_upper(i), min_value_, bucket_lower(n_regular_ + 1));
}

}  // namespace tokenfab
