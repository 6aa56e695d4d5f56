#pragma once
// Exact percentiles over a sample, and a streaming log-bucketed histogram for live views.
//
// Exact percentile definition (numpy's default, method='linear', Hyndman & Fan type 7): sort the
// n values ascending into v[0..n-1]; for q in [0, 100] let h = (n - 1) * q / 100,
// lo = floor(h), g = h - lo; the result is v[lo] + g * (v[lo + 1] - v[lo]) (v[lo] when
// lo == n - 1). The interpolation is evaluated as numpy evaluates it, so results agree to the
// last bit or so.

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace tokenfab {

// q in [0, 100]. `sorted` must be ascending and non-empty; throws Error otherwise (q or empty).
double percentile_of_sorted(std::span<const double> sorted, double q);

// Copies and sorts, then as above. Throws Error on an empty sample or q outside [0, 100].
double percentile(std::span<const double> values, double q);

// p50 / p95 / p99 and the largest value of one sample, sorted once. All absent for an empty
// sample.
struct PercentileSummary {
  int64_t count = 0;
  std::optional<double> p50;
  std::optional<double> p95;
  std::optional<double> p99;
  std::optional<double> max;
};
PercentileSummary summarize_percentiles(std::vector<double> values);

// Fixed log-spaced buckets for values that span decades (latencies in seconds, say).
// Bucket 0 is underflow [-inf, min_value); buckets 1..n cover [min * r^(i-1), min * r^i) with
// r = 10^(1 / buckets_per_decade); the last bucket is overflow [max_value', +inf) where max_value'
// is max_value rounded up to a whole number of buckets. Quantiles read from it are approximate:
// the true value lies in the reported bucket, i.e. within a factor r. Not thread-safe: its owner
// synchronizes (ServingMetrics does).
class LogHistogram {
 public:
  // Throws Error unless 0 < min_value < max_value and buckets_per_decade >= 1.
  LogHistogram(double min_value, double max_value, int buckets_per_decade);

  void add(double value);
  void clear();

  int64_t count() const { return total_; }
  int bucket_count() const { return static_cast<int>(counts_.size()); }  // underflow + overflow
  int64_t bucket_value(int i) const { return counts_[static_cast<size_t>(i)]; }
  double bucket_lower(int i) const;  // -inf for the underflow bucket
  double bucket_upper(int i) const;  // +inf for the overflow bucket
  int bucket_index(double value) const;

  // Upper edge of the bucket holding the ceil(q/100 * count)-th smallest value (the smallest
  // value for q == 0), clamped to the finite range; absent when empty. An upper bound on the
  // exact nearest-rank percentile, within a factor r of it for in-range values.
  std::optional<double> approx_percentile(double q) const;

 private:
  double min_value_;
  double log_ratio_;             // ln(r)
  int n_regular_;                // buckets between underflow and overflow
  std::vector<int64_t> counts_;  // (n_regular_ + 2)
  int64_t total_ = 0;
};

}  // namespace tokenfab
