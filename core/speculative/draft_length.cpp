#include "core/speculative/draft_length.h"

#include <algorithm>
#include <stdexcept>

namespace tokenfab {

void StepCostTable::record(int32_t rows, double seconds) {
  if (rows < 1 || !(seconds > 0.0)) return;
  if (static_cast<size_t>(rows) >= seconds_.size())
    seconds_.resize(static_cast<size_t>(rows) + 1, 0.0);
  double& s = seconds_[static_cast<size_t>(rows)];
  s = s == 0.0 ? seconds : (1.0 - kAlpha) * s + kAlpha * seconds;
}

std::optional<double> StepCostTable::measured(int32_t rows) const {
  if (rows < 1 || static_cast<size_t>(rows) >= seconds_.size()) return std::nullopt;
  const double s = seconds_[static_cast<size_t>(rows)];
  if (s == 0.0) return std::nullopt;
  return s;
}

int32_t StepCostTable::nearest_measured(int32_t from, int32_t direction) const {
  const auto n = static_cast<int32_t>(seconds_.size());
  for (int32_t r = std::clamp(from, 0, n); r >= 1 && r < n; r += direction)
    if (seconds_[static_cast<size_t>(r)] > 0.0) return r;
  return 0;
}

bool StepCostTable::measured_at_or_below(int32_t rows) const {
  return nearest_measured(std::min(rows, static_cast<int32_t>(seconds_.size()) - 1), -1) != 0;
}

bool StepCostTable::measured_at_or_above(int32_t rows) const {
  return nearest_measured(std::max(rows, 1), 1) != 0;
}

std::optional<double> StepCostTable::estimate(int32_t rows) const {
  if (const auto m = measured(rows)) return m;
  const int32_t below =
      nearest_measured(std::min(rows - 1, static_cast<int32_t>(seconds_.size()) - 1), -1);
  const int32_t above = nearest_measured(rows + 1, 1);
  if (below == 0 && above == 0) return std::nullopt;
  if (below == 0) return seconds_[static_cast<size_t>(above)];
  const double lo = seconds_[static_cast<size_t>(below)];
  if (above == 0) return lo * static_cast<double>(rows) / static_cast<double>(below);
  const double hi = seconds_[static_cast<size_t>(above)];
  return lo + (hi - lo) * static_cast<double>(rows - below) / static_cast<double>(above - below);
}

std::optional<double> StepCostTable::floor_estimate(int32_t rows) const {
  if (const auto m = measured(rows)) return m;
  const int32_t below =
      nearest_measured(std::min(rows - 1, static_cast<int32_t>(seconds_.size()) - 1), -1);
  if (below == 0) return std::nullopt;
  return seconds_[static_cast<size_t>(below)];
}

std::optional<double> StepCostTable::linear_estimate(int32_t n) const {
  const int32_t smallest = nearest_measured(1, 1);
  if (smallest == 0 || n >= smallest) return estimate(n);
  return seconds_[static_cast<size_t>(smallest)] * static_cast<double>(n) /
         static_cast<double>(smallest);
}

DraftLengthPolicy::DraftLengthPolicy(int32_t max_length) : max_(max_length) {
  if (max_length < 1) throw std::invalid_argument("draft length policy: max length must be >= 1");
}

int32_t DraftLengthPolicy::choose(const std::vector<int64_t>& proposed_at,
                                  const std::vector<int64_t>& accepted_at,
                                  const StepCostTable& costs, const StepCostTable& proposals,
                                  int32_t other_rows) {
  const int64_t n = decisions_++;
  const int32_t base = std::max(other_rows, 0) + 1;
  p_.assign(static_cast<size_t>(max_), 0.0);
  double prev = 1.0;
  for (int32_t i = 1; i <= max_; ++i) {
    const auto at = static_cast<size_t>(i - 1);
    const double proposed = at < proposed_at.size() ? static_cast<double>(proposed_at[at]) : 0.0;
    const double accepted = at < accepted_at.size() ? static_cast<double>(accepted_at[at]) : 0.0;
    prev = std::min(prev, (accepted + 1.0) / (proposed + 2.0));
    p_[at] = prev;
  }
  // Measure the two ends first; then keep refreshing the end not in use.
  if (!costs.measured_at_or_below(base)) return last_ = 0;
  if (!costs.measured_at_or_above(base + max_)) return last_ = max_;
  if (n % kProbeEvery == kProbeEvery - 1) {  // alternately the longest and the plain step
    const bool longest = (n / kProbeEvery) % 2 == 0;
    if (longest && last_ != max_) return max_;
    if (!longest && last_ != 0) return 0;
  }
  // Untried row counts at their floor only when the plain step itself is measured (a batch whose
  // other rows vary is compared on the straight line instead: there the floor would make every
  // draft look free next to an estimated plain step).
  const bool base_measured = costs.measured(base).has_value();
  int32_t best = 0;
  double best_rate = 0.0, expected = 1.0;
  for (int32_t k = 0; k <= max_; ++k) {
    if (k > 0) expected += p_[static_cast<size_t>(k - 1)];
    const double t = (base_measured ? *costs.floor_estimate(base + k) : *costs.estimate(base + k)) +
                     (k > 0 ? proposals.linear_estimate(k).value_or(0.0) : 0.0);
    const double rate = expected / t;
    if (rate > best_rate) {
      best_rate = rate;
      best = k;
    }
  }
  return last_ = best;
}

ChainStopRule::ChainStopRule(const StepCostTable& costs, const StepCostTable& proposals,
                             int32_t other_rows, int32_t max_length, double calibration)
    : costs_(costs),
      proposals_(proposals),
      base_(std::max(other_rows, 0) + 1),
      max_(std::max(max_length, 1)),
      base_measured_(costs.measured(base_).has_value()),
      calibration_(calibration) {}

std::optional<double> ChainStopRule::step_cost(int32_t drafts) const {
  return base_measured_ ? costs_.floor_estimate(base_ + drafts) : costs_.estimate(base_ + drafts);
}

DraftVerdict ChainStopRule::judge(double path_probability) {
  ++judged_;
  const double q = std::min(1.0, calibration_ * std::max(path_probability, 0.0));
  const auto k = static_cast<int32_t>(kept_.size());
  const double spent = proposals_.linear_estimate(judged_).value_or(0.0);
  const std::optional<double> now = step_cost(k), longer = step_cost(k + 1);
  // The first draft is kept (drafting was the length policy's choice), and so is a draft with
  // nothing measured to weigh it against, so that its cost gets measured.
  if (k > 0 && now && longer && q * (*now + spent) < expected_ * std::max(*longer - *now, 0.0))
    return DraftVerdict::kDrop;
  kept_.push_back(path_probability);
  expected_ += q;
  if (k + 1 >= max_) return DraftVerdict::kKeepLast;
  const std::optional<double> next = step_cost(k + 2),
                              next_spent = proposals_.linear_estimate(judged_ + 1);
  if (longer && next && next_spent) {
    const double more = std::max(*next - *longer, 0.0) + std::max(*next_spent - spent, 0.0);
    if (q * (*longer + spent) < expected_ * more) return DraftVerdict::kKeepLast;
  }
  return DraftVerdict::kKeep;
}

double ChainStopRule::calibration(int64_t accepted, double predicted) {
  return std::clamp((static_cast<double>(accepted) + 2.0) / (std::max(predicted, 0.0) + 2.0), 0.25,
                    4.0);
}

}  // namespace tokenfab
