#pragma once
// One API request through the Engine: its text detokenized on UTF-8 boundaries, cut at a stop
// string (the engine request is cancelled there, freeing its KV blocks), streamed piece by piece
// to a callback that says whether the client is still there. A client that has gone cancels the
// request.

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/api/openai_response.h"
#include "core/serving/engine.h"
#include "core/tokenizer/tokenizer.h"

namespace tokenfab::api {

struct RunResult {
  std::string text;           // the whole text (what was streamed), stop string excluded
  std::string finish_reason;  // "stop" (end of generation or a stop string) or "length"
  Usage usage;
  TokenfabFigures figures;
  // Per output token up to the stop (end-of-generation tokens left out), when the request asked.
  std::vector<LogprobEntry> logprobs;
  bool client_gone = false;  // the callback said so; the request was cancelled
};

// Returns false when the client has gone (the write failed). `logprobs`: the entries of the
// tokens read since the previous piece (empty unless the request asked).
using PieceSink =
    std::function<bool(const std::string& piece, std::span<const LogprobEntry> logprobs)>;

// Submits `request` (its logprobs field says whether log-probabilities come back) and waits for its
// end. `on_piece` (when set) receives each non-empty piece of text; `alive` (when set) is polled
// while nothing is sent. Throws Error when the engine rejects the request, or it fails.
RunResult run_request(Engine& engine, const Tokenizer& tokenizer, GenerationRequest request,
                      const std::vector<std::string>& stop, const PieceSink& on_piece,
                      const std::function<bool()>& alive = {});

}  // namespace tokenfab::api
