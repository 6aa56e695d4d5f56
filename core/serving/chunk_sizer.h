#pragma once
// ChunkSizer: how many prompt tokens a colocated step may read while decodes are running, so that
// the step — and with it every running decode's inter-token latency — stays near a target time.
//
// A fixed token budget does not fit every device: 512 prompt tokens are a few milliseconds on a
// GPU and most of a second on one CPU core, where each such chunk stalls every running decode for
// that long. So the worker sizes the chunks by feedback from its own steps: after each step that
// both decoded and read prompt tokens, the limit becomes the tokens it read times
// sqrt(target / step time), the factor kept within [1/2, 2] — a step under the target lets the
// next read more, one over it less. The square root damps the host's step-to-step noise; where
// the step time grows with the chunk (it always does) the limit settles where steps take the
// target. A step whose prompts ran out below the limit and stayed under the target says nothing
// about larger chunks and leaves the limit as it is.
//
// The limit stays within [kMinTokens, the token budget]: the floor keeps prompts moving when the
// decodes alone take the whole target; it is also where the limit starts. Steps without decodes
// are not limited (no one waits for them but the prompt's own request) and do not count.
// Not thread-safe: one per worker.

#include <cstdint>

namespace tokenfab {

class ChunkSizer {
 public:
  static constexpr int32_t kMinTokens = 16;

  // target_s > 0: the step time to keep near; token_budget ≥ 1: the most any step computes.
  // Throws Error otherwise.
  ChunkSizer(double target_s, int32_t token_budget);

  // After each step: its decode rows (including verified drafts), prompt tokens read, wall time.
  void observe(int32_t decode_rows, int32_t prompt_tokens, double seconds);
  // Prompt tokens a step with decodes may read now.
  int32_t limit() const;

  double target_s() const { return target_s_; }

 private:
  double target_s_;
  int32_t token_budget_;
  double limit_;
};

}  // namespace tokenfab
