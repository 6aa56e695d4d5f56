#pragma once
// OpenAI's response shapes: chat.completion / text_completion objects, their streamed chunks
// (chat.completion.chunk; a text_completion per piece), the usage object, errors and the model
// list. Pure JSON building; the server sends them.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/api/openai_request.h"

namespace tokenfab::api {

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

// The Tokenfab extension of a response (`tokenfab`): the request's own figures.
struct TokenfabFigures {
  double ttft_ms = 0.0;                   // submitted → first token
  double decode_tok_s = 0.0;              // 1 / TPOT; 0 with fewer than two tokens
  std::optional<double> accept_per_step;  // with a head or lookup
  std::string head;                       // the draft head's name (the last, after switches)
  struct Switch {
    int32_t at_token = 0;  // output tokens before it
    std::string from, to;
  };
  std::vector<Switch> switches;  // mid-generation head switches (tokenfab.head auto)
};

// One output token's log-probability and its most probable alternatives, as bytes.
struct LogprobEntry {
  std::string token;  // the token's bytes
  float logprob = 0.0f;
  std::vector<std::pair<std::string, float>> top;
};

// What every object of one response shares.
struct ResponseIdentity {
  Endpoint endpoint = Endpoint::kChat;
  std::string id;       // chatcmpl-… or cmpl-…
  int64_t created = 0;  // unix seconds
  std::string model;
};

// "chatcmpl-" or "cmpl-" and 24 random hex digits; `created` now.
ResponseIdentity new_identity(Endpoint endpoint, const std::string& model);

nlohmann::json usage_json(const Usage& usage);
nlohmann::json figures_json(const TokenfabFigures& figures);
// A choice's `logprobs`: chat {"content":[{"token","logprob","bytes","top_logprobs"}]},
// completions {"tokens","token_logprobs","top_logprobs","text_offset"} (offsets counted from
// `text_offset` bytes). Null when `asked` is false.
nlohmann::json logprobs_json(Endpoint endpoint, bool asked, std::span<const LogprobEntry> entries,
                             size_t text_offset = 0);
// The whole (non-streamed) response.
nlohmann::json completion_json(const ResponseIdentity& who, const std::string& text,
                               const std::string& finish_reason, const Usage& usage,
                               const TokenfabFigures& figures,
                               const nlohmann::json& logprobs = nullptr);
// One streamed chunk: text (or, for chat, the opening role delta when `role`), and the
// finish_reason on the last one (empty: null).
nlohmann::json chunk_json(const ResponseIdentity& who, const std::string& text, bool role,
                          const std::string& finish_reason,
                          const nlohmann::json& logprobs = nullptr);
// The usage chunk (choices empty), with the Tokenfab figures.
nlohmann::json usage_chunk_json(const ResponseIdentity& who, const Usage& usage,
                                const TokenfabFigures& figures);
nlohmann::json error_json(const std::string& message, const std::string& type,
                          const std::string& param, const std::string& code);
nlohmann::json models_json(const std::string& model_id, int64_t created);

// A JSON value as one `data:` line of an SSE stream ("data: …\n\n"); invalid UTF-8 replaced.
std::string sse_event(const nlohmann::json& j);
// JSON text with invalid UTF-8 replaced (generated text may hold a lone byte at the very end).
std::string dump(const nlohmann::json& j);

}  // namespace tokenfab::api
