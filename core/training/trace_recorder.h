#pragma once
// Records what the target computes (trace.h) by running it through the batched ModelRunner over
// a paged KV pool, several sequences per pass.

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/model/llama_model.h"
#include "core/runtime/sampler.h"
#include "core/training/trace.h"

namespace tokenfab {

struct TraceOptions {
  int32_t top_k = 8;                 // top-k ids and probabilities kept per position (0..1024)
  int32_t continuation_tokens = 96;  // tokens the target generates after each prompt
  int threads = 0;                   // 0: all hardware threads
  int32_t batch = 16;                // sequences live at once
  // Continuations: 0 continues greedily; above 0 draws each token with these sampling settings
  // (the seed of prompt j is seed + j), so that the traces leave the greedy path.
  SamplingParams sampling{.temperature = 0.0f};
  bool taps = false;      // also record the layer taps (draft_tap_layers) of every position
  void validate() const;  // throws Error naming the option
};

// Called after each pass; return false to cancel. Units are recorded positions.
using TraceProgress = std::function<bool(int64_t done_tokens, int64_t total_tokens)>;

// Self-distillation traces: for each prompt (token ids), the target continues it for
// `continuation_tokens` tokens (greedily, or sampled: options.sampling), stopping early after a
// token for which `is_end_of_generation` is true. One sequence per prompt, in prompt order, of the
// positions from the LAST prompt token through the continuation (the last generated token
// excluded: its prediction was not made): row j holds the hidden state that produced generated
// token j = next[j]; pred[j] is the target's argmax there (= next[j] when greedy).
// Up to `batch` prompts run at once, one pass per decode step for all of them; a prompt takes a
// finished one's place at the next pass (its prefill in the same pass), so the result does not
// depend on `batch`. On cancel, returns what was recorded so far (sequences cut where they
// stopped).
// Throws Error for an empty prompt, a token outside the vocabulary, or a prompt plus continuation
// longer than the model's training context.
TraceSet record_continuations(const LlamaModel& model,
                              std::span<const std::vector<TokenId>> prompts,
                              const TraceOptions& options,
                              std::function<bool(TokenId)> is_end_of_generation,
                              const TraceProgress& progress);

// Corpus traces: `tokens` cut into consecutive windows of `window` tokens (a last window shorter
// than two tokens is dropped), each a sequence recording every position; pred is the target's
// prediction, next the text's next token (after a window's last position: the next window's
// first token, or pred at the end of the text). On cancel, returns what was recorded so far.
// Throws Error for window < 2, a window longer than the training context or a bad token.
TraceSet record_corpus(const LlamaModel& model, std::span<const TokenId> tokens, int32_t window,
                       const TraceOptions& options, const TraceProgress& progress);

}  // namespace tokenfab
