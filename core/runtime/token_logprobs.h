#pragma once
// Log-probabilities of sampled tokens, as OpenAI's `logprobs` reports them: under the model's own
// distribution — the log-softmax of the raw logits, before temperature, top-k/top-p/min-p or any
// other filter — with the most probable tokens of the same row beside it.

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "core/kvcache/block_pool.h"  // TokenId

namespace tokenfab {

struct TokenLogprob {
  float logprob = 0.0f;                        // of the emitted token
  std::vector<std::pair<TokenId, float>> top;  // most probable first; ties: lower id first
};

// The log-softmax of `logits` at `token`, and the `top_n` (0..) most probable tokens. Computed in
// double precision: log p(t) = logit(t) − (m + log Σ exp(logit − m)), m the largest logit.
TokenLogprob token_logprob(std::span<const float> logits, TokenId token, int32_t top_n);

}  // namespace tokenfab
