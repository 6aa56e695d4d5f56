#include "core/metrics/aggregate.h"

#include <nlohmann/json.hpp>

#include <string>
#include <utility>

#include "core/common/error.h"

namespace tokenfab {

namespace {

constexpr double kMsPerS = 1e3;
constexpr double kBytesPerGb = 1e9;

std::vector<double> scaled(std::vector<double> values, double factor) {
  for (double& v : values) v *= factor;
  return values;
}

nlohmann::json optional_json(const std::optional<double>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

nlohmann::json percentiles_json(const PercentileSummary& p) {
  return {{"p50", optional_json(p.p50)},
          {"p95", optional_json(p.p95)},
          {"p99", optional_json(p.p99)},
          {"max", optional_json(p.max)}};
}

}  // namespace

std::optional<double> TransferTotals::gb_per_s() const {
  if (seconds <= 0.0) return std::nullopt;
  return static_cast<double>(bytes) / kBytesPerGb / seconds;
}

nlohmann::json to_json(const ServingSummary& s) {
  return {
      {"requests", s.requests},
      {"completed", s.completed},
      {"failed", s.failed},
      {"preemptions", s.preemptions},
      {"duration_s", s.duration_s},
      {"throughput_tok_s", optional_json(s.throughput_tok_s)},
      {"ttft_ms", percentiles_json(s.ttft_ms)},
      {"itl_ms", percentiles_json(s.itl_ms)},
      {"tpot_ms", percentiles_json(s.tpot_ms)},
      {"e2e_ms", percentiles_json(s.e2e_ms)},
      {"prefix_hit_rate", optional_json(s.prefix_hit_rate)},
      {"transfer",
       {{"count", s.transfer.count},
        {"handed_over_blocks", s.transfer.handed_over_blocks},
        {"bytes", s.transfer.bytes},
        {"gb_s", optional_json(s.transfer.gb_per_s())},
        {"copy_s", s.transfer.seconds},
        {"waited_s", s.transfer.waited_s},
        {"layers_overlapped_fraction",
         s.transfer.layers > 0 ? nlohmann::json(static_cast<double>(s.transfer.layers_overlapped) /
                                                static_cast<double>(s.transfer.layers))
                               : nlohmann::json()}}},
  };
}

nlohmann::json to_json(const Goodput& g) {
  return {{"good", g.good},
          {"ended", g.ended},
          {"fraction", optional_json(g.fraction)},
          {"rate_per_s", optional_json(g.rate_per_s)}};
}

ServingMetrics::ServingMetrics(MetricsTime start, size_t series_capacity)
    : start_(start), emissions_(series_capacity, start) {}

void ServingMetrics::on_submitted(int64_t prompt_tokens) {
  std::lock_guard lock(mutex_);
  ++submitted_;
  live_.prompt_tokens += prompt_tokens;
}

void ServingMetrics::on_emission(MetricsTime t, int32_t n_tokens) {
  emissions_.append(t, static_cast<double>(n_tokens));
  generation_tokens_.fetch_add(n_tokens, std::memory_order_relaxed);
}

// Adds `from` into `into` element-wise, growing `into` as needed.
static void add_counts(std::vector<int64_t>& into, std::span<const int64_t> from) {
  if (into.size() < from.size()) into.resize(from.size());
  for (size_t i = 0; i < from.size(); ++i) into[i] += from[i];
}

void ServingMetrics::on_completed(const RequestMetrics& r, std::span<const int64_t> proposed_at,
                                  std::span<const int64_t> accepted_at,
                                  const DraftTime& draft_time) {
  std::lock_guard lock(mutex_);
  finished_.push_back({r.output_tokens, r.ttft_s, r.tpot_s, r.e2e_s});
  itl_s_.insert(itl_s_.end(), r.itl_s.begin(), r.itl_s.end());
  for (double gap : r.itl_s) itl_histogram_.add(gap);
  for (int32_t n : r.tokens_per_step) {
    accepted_tokens_ += n;
    if (n < 1) continue;
    if (steps_by_tokens_.size() <= static_cast<size_t>(n)) steps_by_tokens_.resize(n + 1);
    ++steps_by_tokens_[static_cast<size_t>(n)];
  }
  verification_steps_ += static_cast<int64_t>(r.tokens_per_step.size());
  add_counts(proposed_at_, proposed_at);
  add_counts(accepted_at_, accepted_at);
  draft_time_.verify_steps += draft_time.verify_steps;
  draft_time_.draft_s += draft_time.draft_s;
  draft_time_.verify_s += draft_time.verify_s;
}

void ServingMetrics::on_failed() {
  std::lock_guard lock(mutex_);
  ++failed_;
}

void ServingMetrics::on_request_ended(const EndedRequest& request) {
  std::lock_guard lock(mutex_);
  live_.on_ended(request);
}

void ServingMetrics::on_preemption() {
  std::lock_guard lock(mutex_);
  ++preemptions_;
}

void ServingMetrics::on_prefix_lookup(int64_t lookups, int64_t hits) {
  if (lookups < 0 || hits < 0 || hits > lookups) {
    throw Error("ServingMetrics::on_prefix_lookup: need 0 <= hits <= lookups, got hits=" +
                std::to_string(hits) + " lookups=" + std::to_string(lookups));
  }
  std::lock_guard lock(mutex_);
  prefix_lookups_ += lookups;
  prefix_hits_ += hits;
}

void ServingMetrics::on_transfer(int64_t bytes, double seconds, double waited_s, int32_t layers,
                                 int32_t layers_overlapped, int32_t handed_over_blocks) {
  if (bytes < 0 || !(seconds >= 0.0) || !(waited_s >= 0.0) || layers < 0 || layers_overlapped < 0 ||
      layers_overlapped > layers || handed_over_blocks < 0) {
    throw Error(
        "ServingMetrics::on_transfer: bytes, seconds and waits must be >= 0, and the overlapped "
        "layers between 0 and the layers");
  }
  std::lock_guard lock(mutex_);
  ++transfer_.count;
  transfer_.handed_over_blocks += handed_over_blocks;
  transfer_.bytes += bytes;
  transfer_.seconds += seconds;
  transfer_.waited_s += waited_s;
  transfer_.layers += layers;
  transfer_.layers_overlapped += layers_overlapped;
}

ServingSummary ServingMetrics::summary(MetricsTime end) const {
  std::lock_guard lock(mutex_);
  ServingSummary s;
  s.requests = submitted_;
  s.completed = static_cast<int64_t>(finished_.size());
  s.failed = failed_;
  s.preemptions = preemptions_;
  s.duration_s = seconds_between(start_, end);

  std::vector<double> ttft, tpot, e2e;
  for (const Finished& f : finished_) {
    s.output_tokens += f.output_tokens;
    if (f.ttft_s) ttft.push_back(*f.ttft_s * kMsPerS);
    if (f.tpot_s) tpot.push_back(*f.tpot_s * kMsPerS);
    if (f.e2e_s) e2e.push_back(*f.e2e_s * kMsPerS);
  }
  if (s.duration_s > 0.0) s.throughput_tok_s = static_cast<double>(s.output_tokens) / s.duration_s;
  s.ttft_ms = summarize_percentiles(std::move(ttft));
  s.itl_ms = summarize_percentiles(scaled(itl_s_, kMsPerS));
  s.tpot_ms = summarize_percentiles(std::move(tpot));
  s.e2e_ms = summarize_percentiles(std::move(e2e));

  s.prefix_lookups = prefix_lookups_;
  s.prefix_hits = prefix_hits_;
  if (prefix_lookups_ > 0) {
    s.prefix_hit_rate = static_cast<double>(prefix_hits_) / static_cast<double>(prefix_lookups_);
  }
  s.transfer = transfer_;
  if (verification_steps_ > 0) {
    s.accept_per_step =
        static_cast<double>(accepted_tokens_) / static_cast<double>(verification_steps_);
  }
  s.steps_by_tokens = steps_by_tokens_;
  s.draft_proposed_at = proposed_at_;
  s.draft_accepted_at = accepted_at_;
  if (draft_time_.verify_steps > 0) {
    const auto steps = static_cast<double>(draft_time_.verify_steps);
    s.draft_ms_per_step = draft_time_.draft_s * kMsPerS / steps;
    s.verify_ms_per_step = draft_time_.verify_s * kMsPerS / steps;
  }
  return s;
}

Goodput ServingMetrics::goodput(const Slo& slo, MetricsTime end) const {
  std::lock_guard lock(mutex_);
  Goodput g;
  for (const Finished& f : finished_) {
    // A completed request with no token has no TTFT/E2E and cannot meet a TTFT/E2E SLO.
    const bool ttft_ok = !slo.ttft_s || (f.ttft_s && *f.ttft_s <= *slo.ttft_s);
    const bool tpot_ok = !slo.tpot_s || f.tpot_s.value_or(0.0) <= *slo.tpot_s;
    const bool e2e_ok = !slo.e2e_s || (f.e2e_s && *f.e2e_s <= *slo.e2e_s);
    if (ttft_ok && tpot_ok && e2e_ok) ++g.good;
  }
  g.ended = static_cast<int64_t>(finished_.size()) + failed_;
  if (g.ended > 0) g.fraction = static_cast<double>(g.good) / static_cast<double>(g.ended);
  const double duration_s = seconds_between(start_, end);
  if (duration_s > 0.0) g.rate_per_s = static_cast<double>(g.good) / duration_s;
  return g;
}

WindowRate ServingMetrics::output_rate(MetricsTime now, std::chrono::nanoseconds window) const {
  return emissions_.rate(now, window);
}

LiveCounters ServingMetrics::live_counters() const {
  std::lock_guard lock(mutex_);
  LiveCounters c = live_;
  c.generation_tokens = generation_tokens_.load(std::memory_order_relaxed);
  return c;
}

LogHistogram ServingMetrics::itl_histogram() const {
  std::lock_guard lock(mutex_);
  return itl_histogram_;
}

}  // namespace tokenfab
