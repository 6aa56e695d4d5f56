#include "core/metrics/request_metrics.h"

#include <numeric>
#include <string>

#include "core/common/error.h"

namespace tokenfab {

std::optional<double> RequestMetrics::accept_per_step() const {
  if (tokens_per_step.empty()) return std::nullopt;
  const double total = std::accumulate(tokens_per_step.begin(), tokens_per_step.end(), 0.0);
  return total / static_cast<double>(tokens_per_step.size());
}

RequestTimeline::RequestTimeline(MetricsTime submitted) : submitted_(submitted) {}

void RequestTimeline::on_emission(MetricsTime t, int32_t n_tokens) {
  if (n_tokens < 1) {
    throw Error("RequestTimeline::on_emission: n_tokens must be >= 1, got " +
                std::to_string(n_tokens));
  }
  const MetricsTime previous = emissions_.empty() ? submitted_ : emissions_.back().time;
  if (t < previous) {
    throw Error("RequestTimeline::on_emission: emission time is earlier than the " +
                std::string(emissions_.empty() ? "submit time" : "previous emission"));
  }
  emissions_.push_back({t, n_tokens});
  output_tokens_ += n_tokens;
}

RequestMetrics RequestTimeline::compute() const {
  RequestMetrics m;
  m.output_tokens = output_tokens_;
  if (emissions_.empty()) return m;

  const MetricsTime first = emissions_.front().time;
  const MetricsTime last = emissions_.back().time;
  m.ttft_s = seconds_between(submitted_, first);
  m.e2e_s = seconds_between(submitted_, last);
  if (output_tokens_ >= 2) {
    m.tpot_s = seconds_between(first, last) / static_cast<double>(output_tokens_ - 1);
  }

  m.itl_s.reserve(static_cast<size_t>(output_tokens_ - 1));
  m.itl_s.insert(m.itl_s.end(), static_cast<size_t>(emissions_.front().n_tokens - 1), 0.0);
  for (size_t i = 1; i < emissions_.size(); ++i) {
    m.itl_s.push_back(seconds_between(emissions_[i - 1].time, emissions_[i].time));
    m.itl_s.insert(m.itl_s.end(), static_cast<size_t>(emissions_[i].n_tokens - 1), 0.0);
    m.tokens_per_step.push_back(emissions_[i].n_tokens);
  }
  return m;
}

}  // namespace tokenfab
