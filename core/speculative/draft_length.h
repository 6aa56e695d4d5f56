#pragma once
// Choosing a chain's draft length step by step (adaptive drafting).
//
// Speculation pays only when the tokens a step emits grow faster than what the step costs, and
// both depend on the machine and the text: on a GPU a step of five rows costs about one of one
// row; on a two-core CPU it costs several. So the length is chosen from measurements, never from
// constants:
//   - the device's cost tables: the wall time of its decode steps (the forward pass and sampling)
//     by number of rows in the step, and the time one request's proposal of k drafts takes by k,
//     each an exponential average;
//   - the request's acceptance: P_i, the fraction of its verifying steps that proposed at least i
//     drafts and accepted the first i (Laplace-smoothed, and never above P_(i-1)).
// With R rows from the other running sequences, a length k is expected to emit
// E(k) = 1 + P_1 + … + P_k tokens for a step of R + 1 + k rows plus a proposal of k drafts; the
// policy picks the k in [0, max] with the most E(k) per second of that estimated time.
//
// What is not measured yet is counted at about the least it could cost, so that it gets tried
// when that would pay, and is measured from then on. A proposal of k drafts (k sequential draft
// steps) counts in proportion to the measured lengths, or as free when none is. When the plain
// step's own count (R + 1) is measured, a row count counts as the nearest measured count below
// it (a step of more rows never costs less): where a row costs most of a step (a compute-bound
// CPU), each longer step is tried once and then left; where rows are cheap (a step bound by
// memory, reading the weights), the cheap lengths are found, which a straight line between the
// costs of 1 and of 1 + max rows would hide. When the plain step's count is not measured (the
// rows of a batch vary with everyone's choices), counts are interpolated between measured
// neighbours.
//
// Until some step at most as large as the plain one (R + 1 rows) and some step at least as large
// as the longest (R + 1 + max) are measured, the policy picks that end to measure it (in a batch
// any count on the right side will do); and every kProbeEvery steps it tries the end it is not
// using, so that neither the costs nor the deep positions' acceptance go stale.
//
// Lossless whatever it picks: drafts are verified by the target, and k = 0 is a plain step.

#include <cstdint>
#include <optional>
#include <vector>

namespace tokenfab {

class StepCostTable {
 public:
  static constexpr double kAlpha = 0.25;  // weight of the newest sample in the average

  void record(int32_t rows, double seconds);
  std::optional<double> measured(int32_t rows) const;
  // Whether some count ≤ rows (≥ rows) is measured: the estimate is then an interpolation, not an
  // extrapolation, on that side.
  bool measured_at_or_below(int32_t rows) const;
  bool measured_at_or_above(int32_t rows) const;
  // The measured value, else linear between the nearest measured counts below and above; beyond
  // the largest measured count, that count's value scaled by rows / count (steps grow at most in
  // proportion to their rows); below the smallest, its value. nullopt when nothing is measured.
  std::optional<double> estimate(int32_t rows) const;
  // The measured value, else the value of the nearest measured count below (a lower bound: steps
  // do not get cheaper with more rows); nullopt when nothing at or below is measured.
  std::optional<double> floor_estimate(int32_t rows) const;
  // As estimate(), except below the smallest measured count: in proportion to it (a cost that
  // grows with the count, as a proposal of k drafts does).
  std::optional<double> linear_estimate(int32_t n) const;

 private:
  // The first measured count from `from` on, stepping by `direction` (±1); 0 if none.
  int32_t nearest_measured(int32_t from, int32_t direction) const;

  std::vector<double> seconds_;  // index: rows; 0 = not measured
};

class DraftLengthPolicy {
 public:
  static constexpr int32_t kProbeEvery = 64;

  explicit DraftLengthPolicy(int32_t max_length);

  // The draft length for the request's next step. `proposed_at` / `accepted_at`: its per-depth
  // counts so far (SpeculationStats); `other_rows`: rows the other sequences of the batch add.
  // `proposals`: proposal seconds by draft length.
  int32_t choose(const std::vector<int64_t>& proposed_at, const std::vector<int64_t>& accepted_at,
                 const StepCostTable& costs, const StepCostTable& proposals, int32_t other_rows);

  int32_t max_length() const { return max_; }
  // P_i for i = 1..max as choose() last estimated them.
  const std::vector<double>& acceptance() const { return p_; }

 private:
  int32_t max_;
  int64_t decisions_ = 0;
  int32_t last_ = 0;
  std::vector<double> p_;
};

}  // namespace tokenfab
