#include "core/serving/router.h"

#include "core/serving/worker.h"

namespace tokenfab {

Router::Router(std::vector<Worker*> prefill, std::vector<Worker*> long_prefill,
               std::vector<Worker*> decode, int32_t long_prompt_tokens,
               int32_t decode_side_prefill_tokens)
    : prefill_(std::move(prefill)),
      long_prefill_(std::move(long_prefill)),
      decode_(std::move(decode)),
      long_prompt_tokens_(long_prompt_tokens),
      decode_side_prefill_tokens_(decode_side_prefill_tokens) {}

Worker& Router::least_loaded(const std::vector<Worker*>& workers) {
  Worker* best = workers.front();
  for (Worker* w : workers)
    if (w->queued_prefill_tokens() < best->queued_prefill_tokens()) best = w;
  return *best;
}

Worker& Router::route_prompt(std::span<const TokenId> prompt) const {
  const auto n = static_cast<int32_t>(prompt.size());
  if (decode_side_prefill_tokens_ > 0) {
    Worker* best = nullptr;
    int32_t best_cached = 0;
    for (Worker* w : decode_) {
      const int32_t cached = w->cached_prefix_tokens(prompt);
      if (cached > best_cached) {
        best = w;
        best_cached = cached;
      }
    }
    // A shared system prompt alone is no reason to prefill on a decode device: most of the
    // prompt must be there already, as it is for a follow-up turn.
    if (best && n - best_cached <= decode_side_prefill_tokens_ &&
        4 * int64_t{best_cached} >= 3 * int64_t{n})
      return *best;
  }
  if (!long_prefill_.empty() && long_prompt_tokens_ > 0 && n > long_prompt_tokens_)
    return least_loaded(long_prefill_);
  return least_loaded(prefill_);
}

Worker& Router::route_decode() const {
  Worker* best = decode_.front();
  for (Worker* w : decode_)
    if (w->free_blocks() > best->free_blocks()) best = w;
  return *best;
}

}  // namespace tokenfab
