#pragma once
// Model-written prompts: more requests of a domain, written by the target itself. A draft head
// generalises with the number of distinct prompts it has seen the target answer (README, "Draft
// heads"), and a user may have only a few dozen; the target can write many more in the same vein.
//
// Request i opens the chat template's user turn with the first words of examples[i mod n] (2, 3
// or 4 words: 2 on the first round over the examples, 3 on the second, 4 on the third, then
// again), and the target samples the rest of the turn until its end-of-turn token. Only turns it
// ends itself within max_tokens are kept, valid UTF-8 with no control token inside, at least three
// words beyond the opening and at most 80 words in all, and none equal to an example or to an
// earlier written one. The answers to them are then traced like any prompt's: the head learns from
// the target's own text only.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/model/llama_model.h"
#include "core/tokenizer/chat_template.h"
#include "core/tokenizer/tokenizer.h"
#include "core/training/trace_recorder.h"

namespace tokenfab {

struct PromptWriting {
  int32_t count = 0;         // requests to write (fewer may be kept)
  int32_t max_tokens = 96;   // a turn not ended within this many tokens is dropped
  float temperature = 1.0f;  // with the sampler's default top-k / top-p / min-p filters
  uint64_t seed = 0;         // request i draws with seed + i
  int threads = 0;           // 0: all hardware threads
  void validate() const;     // throws Error naming the option
};

// The opening of `text`: its first `words` whitespace-separated words, as written (inner
// spacing kept, no trailing space); the whole text trimmed when it has no more words than that.
std::string opening_words(const std::string& text, int words);

// Writes up to options.count requests (see above), in the order of i; deterministic for a model,
// examples and options. Throws Error for no examples or a chat template that does not place the
// user's text verbatim. `progress` (positions sampled, out of count · max_tokens) may cancel:
// then the requests finished so far are returned and *cancelled is set.
std::vector<std::string> write_prompts(const LlamaModel& model, const Tokenizer& tokenizer,
                                       const ChatTemplate& chat_template,
                                       std::span<const std::string> examples,
                                       const PromptWriting& options, const TraceProgress& progress,
                                       bool* cancelled = nullptr);

}  // namespace tokenfab
