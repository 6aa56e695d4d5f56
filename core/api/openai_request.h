#pragma once
// An OpenAI request body (/v1/chat/completions, /v1/completions) read and checked: every field
// the engine honours is taken, every field OpenAI defines that it cannot do (tools, n > 1,
// response_format, …) and every unknown field is refused with a 400 naming it — never silently
// ignored.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/runtime/sampler.h"
#include "core/tokenizer/chat_template.h"

namespace tokenfab::api {

enum class Endpoint { kChat, kCompletion };

struct OpenAiRequest {
  Endpoint endpoint = Endpoint::kChat;
  std::string model;                  // empty: not given
  std::vector<ChatMessage> messages;  // chat
  std::string prompt;                 // completion
  std::optional<int32_t> max_tokens;  // max_tokens or max_completion_tokens; unset: to the context
  // OpenAI's defaults (temperature 1, top_p 1, no top-k or min-p) unless given; a random seed
  // unless given.
  SamplingParams sampling{.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f};
  std::vector<std::string> stop;  // non-empty strings, at most kMaxStop
  bool stream = false;
  // `ignore_eos` (an extension vLLM and llama.cpp's server share): generate max_tokens even past
  // the model's end-of-generation tokens (benchmarks that need every reply at the same length).
  bool ignore_eos = false;
  bool include_usage = false;  // stream_options.include_usage
  // Log-probabilities of the output tokens, with this many alternatives each (chat: logprobs true
  // and top_logprobs; completions: logprobs N); unset: none.
  std::optional<int32_t> logprobs;
  // The Tokenfab extension (`tokenfab`); unset: the server's own settings.
  std::optional<std::string> head;  // auto | none | NAME
  std::optional<std::string> spec;  // chain | tree
  std::optional<int32_t> lookup;    // context lookup drafts: 0 off, else up to kMaxLookup tokens
  std::optional<int32_t> draft_len;

  static constexpr size_t kMaxStop = 4;
  static constexpr int32_t kMaxTopLogprobs = 20;
  static constexpr int32_t kMaxLookup = 8;
};

// Parses `body` for `endpoint`. Throws ApiError (400) naming the field: malformed JSON, a wrong
// type, a value out of range, an unsupported or unknown field, empty messages or prompt.
OpenAiRequest parse_openai_request(const std::string& body, Endpoint endpoint);

}  // namespace tokenfab::api
