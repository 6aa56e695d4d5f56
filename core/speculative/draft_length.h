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

#include "core/speculative/draft_head.h"  // DraftVerdict

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

// Confidence stops: where a chain's drafts are proposed one draft step at a time (an mtp head
// drafted on the host), each step's token comes with the head's probability for the path so far
// (the product of its softmax top-1 probabilities over the draft vocabulary), and the chain
// can stop where the next draft is unlikely enough that verifying it costs more than it is
// expected to bring. A draft with path probability p is counted as accepted with
// q = min(1, c · p), where c calibrates the head on the request's own record (calibration()). With
// E tokens expected from the drafts kept so far (1 + the sum of their q) for an estimated step of
// C seconds (the verifying step's rows, as DraftLengthPolicy estimates them, and the proposal
// time spent so far), a draft is kept when it raises the expected tokens per second: q · C ≥ E · Δ,
// Δ the extra row's cost. The first draft is always kept: its proposal is paid for, and the length
// policy chose to draft from the request's measured acceptance. After keeping a draft, the chain
// drafts further only when a next draft as likely as this one (no path gets likelier with depth)
// would pay for both its row and its draft step. Where rows cost nearly nothing (a GPU step bound
// by reading the weights) every draft is kept; where a row costs a good part of a step (a two-core
// CPU) only likely ones are. Unmeasured costs count as DraftLengthPolicy counts them, so the
// lengths that could pay get tried.
class ChainStopRule {
 public:
  // `max_length`: the longest chain; `other_rows`: rows the other sequences of the batch add;
  // `proposals`: proposal seconds by number of draft steps.
  ChainStopRule(const StepCostTable& costs, const StepCostTable& proposals, int32_t other_rows,
                int32_t max_length, double calibration);

  // The verdict on the next drafted token (one more draft step computed), whose path
  // probability is `path_probability`.
  DraftVerdict judge(double path_probability);

  int32_t kept() const { return static_cast<int32_t>(kept_.size()); }
  int32_t steps() const { return judged_; }  // draft steps computed: the tokens judged
  // The kept drafts' path probabilities, uncalibrated, in chain order.
  const std::vector<double>& kept_probabilities() const { return kept_; }

  // c: (accepted + 2) / (predicted + 2) over the request's earlier confidence-stopped chains —
  // `accepted` head drafts accepted, `predicted` the sum of their path probabilities — clamped to
  // [1/4, 4]: 1 before any evidence, then the head's own over- or under-confidence.
  static double calibration(int64_t accepted, double predicted);

 private:
  std::optional<double> step_cost(int32_t drafts) const;

  const StepCostTable& costs_;
  const StepCostTable& proposals_;
  int32_t base_ = 1;  // rows of a plain step: the other sequences' and this request's one
  int32_t max_ = 1;
  bool base_measured_ = false;
  double calibration_ = 1.0;
  double expected_ = 1.0;  // E: tokens the kept drafts are expected to emit, the bonus included
  int32_t judged_ = 0;
  std::vector<double> kept_;
};

}  // namespace tokenfab
