#pragma once
// Cumulative counters and bucket histograms of a serving engine since it started, in the shape
// Prometheus scrapes (GET /metrics, core/api/prometheus_metrics.h): every figure only grows,
// histograms keep a count per fixed upper bound. Unlike ServingSummary (completed requests,
// exact percentiles), every ended request counts here with its finish reason, and tokens count
// as they are emitted.
//
// Not thread-safe by themselves: ServingMetrics owns one under its mutex and hands out copies.

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace tokenfab {

// Prometheus' histogram: counts[i] holds the values <= bounds[i] and > bounds[i − 1]; the last
// count (one more than the bounds) is the +Inf bucket. sum and count over everything added.
class BucketHistogram {
 public:
  // `bounds` strictly ascending and finite; throws Error otherwise.
  explicit BucketHistogram(std::vector<double> bounds);

  void add(double value);

  const std::vector<double>& bounds() const { return bounds_; }
  // Cumulative: values <= bounds[i] (index bounds().size(): all of them).
  std::vector<int64_t> cumulative() const;
  double sum() const { return sum_; }
  int64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // (bounds + 1)
  double sum_ = 0.0;
  int64_t count_ = 0;
};

// Speculative decoding of the requests that used one draft head (or context lookup alone).
struct SpeculationCounters {
  int64_t drafts = 0;                          // verification steps that checked drafts
  int64_t draft_tokens = 0;                    // drafted tokens checked
  int64_t accepted_tokens = 0;                 // of them, accepted
  std::vector<int64_t> accepted_per_position;  // [k]: accepted at draft position k (0 first)
};

// Why a request ended, as vLLM's request_success counter labels it ("stop", "length", "abort"),
// or "error" for a failed one.
inline constexpr const char* kFinishStop = "stop";
inline constexpr const char* kFinishLength = "length";
inline constexpr const char* kFinishAbort = "abort";
inline constexpr const char* kFinishError = "error";

// What the counters need of one ended request.
struct EndedRequest {
  std::string finish_reason;  // one of the kFinish* above
  std::optional<double> ttft_s, e2e_s;
  std::span<const double> itl_s;
  std::string head;  // draft head's name; empty: none (lookup drafts count under "")
  int64_t verify_steps = 0;
  std::span<const int64_t> proposed_at, accepted_at;
};

struct LiveCounters {
  LiveCounters();

  int64_t prompt_tokens = 0;      // of submitted requests
  int64_t generation_tokens = 0;  // emitted so far
  std::map<std::string, int64_t> ended_by_reason;
  BucketHistogram ttft_s, itl_s, e2e_s;
  std::map<std::string, SpeculationCounters> speculation_by_head;

  void on_ended(const EndedRequest& r);

  // The bucket bounds, in seconds: vLLM's with finer ones below 10 ms (a GPU's decode step takes
  // about a millisecond).
  static std::vector<double> ttft_bounds();
  static std::vector<double> itl_bounds();
  static std::vector<double> e2e_bounds();
};

}  // namespace tokenfab
