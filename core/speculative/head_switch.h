#pragma once
// Switching draft heads mid-generation (the `auto` head policy's second half).
//
// A request chosen automatically carries its candidates: every registered head evaluated on the
// request's domain, with the chain ACCEPT/STEP recorded for it there, best first (the first is
// the head it starts with). While it decodes, the live ACCEPT/STEP of the current head is the mean
// of the tokens emitted per verifying step (accepted drafts + the target's token) over the last
// kWindow such steps. The policy, checked after every verifying step:
//   - nothing changes before the current head has verified kWindow steps;
//   - when live < kRatio × the current head's record, the head underperforms on this text: switch
//     to the best-recorded candidate not tried yet in this request whose record exceeds live;
//   - a head switched away from is not tried again, so a request switches at most
//     (candidates − 1) times and never oscillates.
// The worker applies the decision from the next proposal on (the output is unaffected: drafts are
// verified whichever head made them), logs it (logger "heads") and records it in the request's
// speculation statistics.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "core/speculative/draft_head.h"

namespace tokenfab {

struct HeadCandidate {
  std::shared_ptr<const DraftHead> head;
  double recorded_accept_per_step = 0.0;  // chain ACCEPT/STEP recorded on the request's domain
};

class HeadSwitchPolicy {
 public:
  static constexpr int32_t kWindow = 16;
  static constexpr double kRatio = 0.8;

  // `current`: the index of the head the request starts with.
  HeadSwitchPolicy(size_t n_candidates, size_t current);

  // After a verifying step of the current head that emitted `tokens` (≥ 1). Returns the index of
  // the candidate to switch to, or nullopt; on a switch the window starts afresh.
  std::optional<size_t> on_step(const std::vector<HeadCandidate>& candidates, int32_t tokens);

  size_t current() const { return current_; }
  // The mean over the window; 0 before any step.
  double live_accept_per_step() const;
  // The live ACCEPT/STEP that made the last switch.
  double live_at_last_switch() const { return live_at_switch_; }

 private:
  std::vector<bool> tried_;
  size_t current_;
  std::vector<int32_t> window_;  // ring buffer of tokens per step
  size_t next_ = 0;
  int64_t sum_ = 0;
  double live_at_switch_ = 0.0;
};

}  // namespace tokenfab
