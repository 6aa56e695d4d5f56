#include "core/serving/chunk_sizer.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/common/error.h"

namespace tokenfab {

ChunkSizer::ChunkSizer(double target_s, int32_t token_budget)
    : target_s_(target_s), token_budget_(token_budget) {
  if (!(target_s > 0.0) || !std::isfinite(target_s))
    throw Error("chunk sizer: the step target must be a positive time (got " +
                std::to_string(target_s) + " s)");
  if (token_budget < 1)
    throw Error("chunk sizer: the token budget must be >= 1 (got " + std::to_string(token_budget) +
                ")");
  limit_ = std::min(kMinTokens, token_budget_);
}

void ChunkSizer::observe(int32_t decode_rows, int32_t prompt_tokens, double seconds) {
  if (decode_rows <= 0 || prompt_tokens <= 0) return;
  if (!(seconds > 0.0) || !std::isfinite(seconds)) return;
  if (prompt_tokens < limit() && seconds <= target_s_) return;  // the limit did not bind
  const double factor = std::clamp(std::sqrt(target_s_ / seconds), 0.5, 2.0);
  const double floor = std::min(kMinTokens, token_budget_);
  limit_ = std::clamp(prompt_tokens * factor, floor, static_cast<double>(token_budget_));
}

int32_t ChunkSizer::limit() const {
  return static_cast<int32_t>(limit_);
}

}  // namespace tokenfab
