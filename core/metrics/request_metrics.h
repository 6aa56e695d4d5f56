#pragma once
// One request's latency figures, computed from the real timestamps of its token emissions
// (definitions follow vLLM's benchmark conventions; see DESIGN.md "Metrics"):
//   TTFT  = first token time - submit time
//   ITL   = gap between consecutive output tokens; one entry per token after the first
//   TPOT  = (last token time - first token time) / (output tokens - 1); absent for < 2 tokens
//   E2E   = last token time - submit time
//   tokens per step = tokens emitted by each decode / verification step (ACCEPT/STEP samples)
//
// An emission is what one engine step hands out for one request: 1 token for plain decode,
// 1..K+1 for speculative decoding (accepted draft tokens plus the bonus token). Tokens of one
// emission leave at the same instant, so the first of them gets the gap since the previous
// emission and the rest get gaps of 0. This keeps len(ITL) == output tokens - 1 and
// mean(ITL) == TPOT exactly. (vLLM's HTTP benchmark client instead records one gap per streamed
// chunk; per token is the choice here so that ITL percentiles weigh every token.)
// The first emission comes from prefill and is not a verification step; every later emission is
// one decode / verification step.

#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

namespace tokenfab {

using MetricsClock = std::chrono::steady_clock;
using MetricsTime = MetricsClock::time_point;

// Seconds between two time points, as a double (negative when `to` is earlier).
inline double seconds_between(MetricsTime from, MetricsTime to) {
  return std::chrono::duration<double>(to - from).count();
}

// All durations in seconds.
struct RequestMetrics {
  int64_t output_tokens = 0;
  std::optional<double> ttft_s;          // absent when no token was emitted
  std::vector<double> itl_s;             // (output_tokens - 1) gaps, in emission order
  std::optional<double> tpot_s;          // absent when output_tokens < 2
  std::optional<double> e2e_s;           // absent when no token was emitted
  std::vector<int32_t> tokens_per_step;  // one entry per decode / verification step

  // Mean tokens per verification step (bonus token included); absent when no step ran.
  std::optional<double> accept_per_step() const;
};

// Records the emissions of one request as they happen. Not thread-safe: the worker that owns
// the request records into it (one writer); hand a finished copy to ServingMetrics.
class RequestTimeline {
 public:
  explicit RequestTimeline(MetricsTime submitted);

  // Records n_tokens (>= 1) emitted together at time t. Emissions must come in time order;
  // throws Error on n_tokens < 1 or a time earlier than the previous emission or the submit.
  void on_emission(MetricsTime t, int32_t n_tokens);

  MetricsTime submitted() const { return submitted_; }
  int64_t output_tokens() const { return output_tokens_; }
  RequestMetrics compute() const;

 private:
  struct Emission {
    MetricsTime time;
    int32_t n_tokens;
  };
  MetricsTime submitted_;
  int64_t output_tokens_ = 0;
  std::vector<Emission> emissions_;  // time order
};

}  // namespace tokenfab
