#pragma once
// Serving-wide metrics: finished requests' latencies, counters (preemptions, prefix cache,
// KV transfers) and the live output-token series, summarized in the serve-bench JSON shape
// (issue 3 "Command line (contract)"):
//   {"requests","completed","failed","preemptions","duration_s","throughput_tok_s",
//    "ttft_ms":{"p50","p95","p99","max"},"itl_ms":{..},"tpot_ms":{..},"e2e_ms":{..},
//    "prefix_hit_rate","transfer":{"count","bytes","gb_s"}}
// Definitions follow vLLM's benchmark: latency percentiles are over completed requests only
// (TPOT over those with >= 2 output tokens; ITL over every gap of every completed request);
// throughput = output tokens of completed requests / duration. A figure with no data behind it
// (no samples, zero duration, no lookups, no transfers) is null in JSON, never 0.
//
// Thread-safe: every method takes one mutex, so workers on several threads may report.
// Memory grows with the work recorded (one double per output token for ITLs, a few per request).

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/metrics/live_counters.h"
#include "core/metrics/percentiles.h"
#include "core/metrics/request_metrics.h"
#include "core/metrics/time_series.h"

namespace tokenfab {

struct TransferTotals {
  int64_t count = 0;
  // Blocks handed over within one storage shared by two partitions (no bytes, no copy time).
  int64_t handed_over_blocks = 0;
  int64_t bytes = 0;
  double seconds = 0.0;  // sum of the transfers' copy times (waits for the producer left out)
  // Streamed transfers: the time spent waiting for the producer's layers, and of all layers
  // copied, how many were copied while the producer was still computing later ones.
  double waited_s = 0.0;
  int64_t layers = 0, layers_overlapped = 0;
  // Decimal GB (1e9 bytes) per second of transfer time; absent when no time was recorded.
  std::optional<double> gb_per_s() const;
};

struct ServingSummary {
  int64_t requests = 0;  // submitted
  int64_t completed = 0;
  int64_t failed = 0;
  int64_t preemptions = 0;
  int64_t output_tokens = 0;  // of completed requests
  double duration_s = 0.0;    // start -> end given to summary()
  std::optional<double> throughput_tok_s;
  PercentileSummary ttft_ms, itl_ms, tpot_ms, e2e_ms;
  int64_t prefix_lookups = 0;
  int64_t prefix_hits = 0;
  std::optional<double> prefix_hit_rate;  // hits / lookups
  TransferTotals transfer;
  std::optional<double> accept_per_step;  // all verification steps of completed requests
  // Accept-length histogram: [n] = steps of completed requests that emitted n tokens (index 0
  // unused; plain decode steps count as 1).
  std::vector<int64_t> steps_by_tokens;
  // Per draft position k (0 = the first drafted token): verification steps of completed requests
  // that proposed / accepted a token there. accepted_at[k] / proposed_at[k] is that position's
  // acceptance rate.
  std::vector<int64_t> draft_proposed_at, draft_accepted_at;
  // Mean per step that verified drafts of a completed request: the time spent proposing them, and
  // the step's own time (DraftTime). Unset without such steps.
  std::optional<double> draft_ms_per_step, verify_ms_per_step;
};

// Service-level objectives, each optional; a request is "good" when it meets every one that is
// set (value <= limit). As in vLLM, a request with one output token has TPOT 0 for this test.
struct Slo {
  std::optional<double> ttft_s;
  std::optional<double> tpot_s;
  std::optional<double> e2e_s;
};

struct Goodput {
  int64_t good = 0;                  // completed requests meeting the SLOs
  int64_t ended = 0;                 // completed + failed; failed ones never count as good
  std::optional<double> fraction;    // good / ended
  std::optional<double> rate_per_s;  // good / duration (vLLM's "request_goodput")
};

// Exactly the serve-bench keys, latencies in milliseconds.
nlohmann::json to_json(const ServingSummary& summary);
// {"good","ended","fraction","rate_per_s"}
nlohmann::json to_json(const Goodput& goodput);

// A request's time in speculative decoding: the steps that verified its drafts, the time spent
// proposing those drafts and the steps' own time (each from its start to its emission).
struct DraftTime {
  int64_t verify_steps = 0;
  double draft_s = 0.0, verify_s = 0.0;
};

class ServingMetrics {
 public:
  static constexpr size_t kDefaultSeriesCapacity = 1 << 16;  // token emissions kept live

  // `start` is when the workload (or engine) began; durations and rates count from it.
  explicit ServingMetrics(MetricsTime start, size_t series_capacity = kDefaultSeriesCapacity);

  void on_submitted(int64_t prompt_tokens = 0);
  // Live view: n_tokens emitted for some request at time t (feeds the tokens/s series).
  void on_emission(MetricsTime t, int32_t n_tokens);
  // `proposed_at` / `accepted_at`: the request's per-draft-position counts (empty without a head).
  void on_completed(const RequestMetrics& request, std::span<const int64_t> proposed_at = {},
                    std::span<const int64_t> accepted_at = {}, const DraftTime& draft_time = {});
  void on_failed();
  // Every ended request (completed, cancelled or failed), for the live counters.
  void on_request_ended(const EndedRequest& request);
  void on_preemption();
  // Prefix-cache lookups and hits, in the caller's unit (blocks); hits <= lookups.
  void on_prefix_lookup(int64_t lookups, int64_t hits);
  // One KV transfer of `bytes` that copied for `seconds` (and waited `waited_s` for its producer,
  // copying `layers_overlapped` of its `layers` layers while the producer was still computing), and
  // handed `handed_over_blocks` blocks over without a copy.
  void on_transfer(int64_t bytes, double seconds, double waited_s = 0.0, int32_t layers = 0,
                   int32_t layers_overlapped = 0, int32_t handed_over_blocks = 0);

  ServingSummary summary(MetricsTime end) const;
  Goodput goodput(const Slo& slo, MetricsTime end) const;
  // Output tokens per second over (now - window, now], from emission timestamps.
  WindowRate output_rate(MetricsTime now, std::chrono::nanoseconds window) const;
  std::vector<TimeSample> emission_snapshot() const { return emissions_.snapshot(); }
  // Live ITL distribution in seconds (1 us .. 100 s, 10 buckets per decade), as a copy.
  LogHistogram itl_histogram() const;
  // The cumulative counters and histograms (GET /metrics), as a copy.
  LiveCounters live_counters() const;

 private:
  struct Finished {  // what goodput and percentiles need of one completed request, seconds
    int64_t output_tokens;
    std::optional<double> ttft_s, tpot_s, e2e_s;
  };

  const MetricsTime start_;
  TimeSeries emissions_;  // has its own lock
  mutable std::mutex mutex_;
  std::vector<Finished> finished_;
  std::vector<double> itl_s_;  // every gap of every completed request
  LogHistogram itl_histogram_{1e-6, 100.0, 10};
  int64_t accepted_tokens_ = 0;  // sum over verification steps
  int64_t verification_steps_ = 0;
  std::vector<int64_t> steps_by_tokens_, proposed_at_, accepted_at_;
  DraftTime draft_time_;  // summed over completed requests
  int64_t submitted_ = 0, failed_ = 0, preemptions_ = 0;
  int64_t prefix_lookups_ = 0, prefix_hits_ = 0;
  TransferTotals transfer_;
  LiveCounters live_;                          // but its generation_tokens: the atomic below
  std::atomic<int64_t> generation_tokens_{0};  // on_emission takes no lock
};

}  // namespace tokenfab
