#include "core/speculative/head_switch.h"

namespace tokenfab {

HeadSwitchPolicy::HeadSwitchPolicy(size_t n_candidates, size_t current)
    : tried_(n_candidates, false), current_(current) {
  if (current_ < tried_.size()) tried_[current_] = true;
}

double HeadSwitchPolicy::live_accept_per_step() const {
  return window_.empty() ? 0.0 : static_cast<double>(sum_) / static_cast<double>(window_.size());
}

std::optional<size_t> HeadSwitchPolicy::on_step(const std::vector<HeadCandidate>& candidates,
                                                int32_t tokens) {
  if (static_cast<int32_t>(window_.size()) < kWindow) {
    window_.push_back(tokens);
  } else {
    sum_ -= window_[next_];
    window_[next_] = tokens;
    next_ = (next_ + 1) % window_.size();
  }
  sum_ += tokens;
  if (static_cast<int32_t>(window_.size()) < kWindow || current_ >= candidates.size())
    return std::nullopt;
  const double live = live_accept_per_step();
  if (live >= kRatio * candidates[current_].recorded_accept_per_step) return std::nullopt;
  std::optional<size_t> best;
  for (size_t i = 0; i < candidates.size() && i < tried_.size(); ++i) {
    if (tried_[i] || !candidates[i].head || candidates[i].recorded_accept_per_step <= live)
      continue;
    if (!best ||
        candidates[i].recorded_accept_per_step > candidates[*best].recorded_accept_per_step)
      best = i;
  }
  if (!best) return std::nullopt;
  tried_[*best] = true;
  current_ = *best;
  live_at_switch_ = live;
  window_.clear();
  next_ = 0;
  sum_ = 0;
  return best;
}

}  // namespace tokenfab
