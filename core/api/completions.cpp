// POST /v1/chat/completions and /v1/completions: an OpenAI request → a GenerationRequest → the
// Engine → one response object, or a stream of server-sent events.

#include <memory>

#include "core/api/openai_response.h"
#include "core/api/request_runner.h"
#include "core/api/server_state.h"
#include "core/common/log.h"

namespace tokenfab::api {

namespace {

std::vector<TokenId> prompt_tokens(Backend& b, const OpenAiRequest& r) {
  const Tokenizer& tok = b.tokenizer;
  if (r.endpoint == Endpoint::kCompletion) return tok.encode(r.prompt, tok.add_bos_token(), false);
  std::string text;
  try {
    std::lock_guard lock(b.chat_mutex);
    if (!b.chat_template) b.chat_template = ChatTemplate::from_gguf(b.model.file());
    text = b.chat_template->apply(r.messages, true);
  } catch (const Error& e) {
    throw ApiError(400,
                   std::string("messages: the model's chat template refused them: ") + e.what(),
                   "messages");
  }
  return tok.encode(text, tok.add_bos_token(), true);
}

// max_tokens within the context: unset → what is left of it; a prompt or a request that does
// not fit → 400 with the numbers.
int32_t fitted_max_tokens(const Backend& b, const OpenAiRequest& r, int64_t n_prompt) {
  const int64_t limit = b.context;
  const std::string input = r.endpoint == Endpoint::kChat ? "messages" : "prompt";
  if (limit <= 0) return r.max_tokens.value_or(256);
  if (n_prompt >= limit)
    throw ApiError(400,
                   "This model's maximum context length is " + std::to_string(limit) +
                       " tokens, but the " + input + " has " + std::to_string(n_prompt) +
                       " tokens (at least one token must be left for the reply).",
                   input, "invalid_request_error", "context_length_exceeded");
  if (r.max_tokens && n_prompt + *r.max_tokens > limit)
    throw ApiError(400,
                   "This model's maximum context length is " + std::to_string(limit) +
                       " tokens, but " + std::to_string(n_prompt + *r.max_tokens) +
                       " were requested (" + std::to_string(n_prompt) + " in the " + input + ", " +
                       std::to_string(*r.max_tokens) + " for the reply).",
                   "max_tokens", "invalid_request_error", "context_length_exceeded");
  return r.max_tokens ? *r.max_tokens : static_cast<int32_t>(limit - n_prompt);
}

// The request's draft head (tokenfab.head, else the server's --head), resolved once per name, and
// its speculation switches (tokenfab.spec, lookup, draft_len over the server's).
void choose_head(const ServerState& state, Backend& b, const OpenAiRequest& r,
                 GenerationRequest& g) {
  HeadOptions o = state.config.head;
  if (r.head) o.head = *r.head;
  if (r.spec) o.spec = *r.spec;
  if (r.lookup) o.lookup = *r.lookup;
  if (r.draft_len) o.draft_len = *r.draft_len;
  if (o.head == "none" && o.lookup == 0) return;
  std::lock_guard lock(b.heads_mutex);
  // A chooser per head name and spec: the tree shape is resolved with the head.
  const std::string key = o.head + "\n" + o.spec;
  auto it = b.heads.find(key);
  if (it == b.heads.end()) {
    try {
      it = b.heads.emplace(key, std::make_unique<HeadChooser>(o, b.model, b.tokenizer)).first;
    } catch (const Error& e) {
      throw ApiError(400, std::string("tokenfab.head: ") + e.what(), "tokenfab.head");
    }
  }
  HeadChoice choice = it->second->choose(g.prompt);
  g.head = std::move(choice.head);
  g.head_candidates = std::move(choice.candidates);
  g.draft_len = o.draft_len;
  g.adaptive_draft = o.adaptive_draft();
  g.tree_shape = o.request_tree();
  g.tree_nodes = o.request_tree_nodes();
  g.lookup = o.lookup;
}

GenerationRequest engine_request(const ServerState& state, Backend& b, const OpenAiRequest& r) {
  GenerationRequest g;
  g.prompt = prompt_tokens(b, r);
  if (g.prompt.empty()) throw ApiError(400, "prompt: it encodes to no tokens", "prompt");
  g.max_tokens = fitted_max_tokens(b, r, static_cast<int64_t>(g.prompt.size()));
  g.sampling = r.sampling;
  g.logprobs = r.logprobs.value_or(-1);
  g.stop_at_end_of_generation = !r.ignore_eos;
  try {
    g.sampling.validate();
  } catch (const Error& e) {
    throw ApiError(400, e.what());
  }
  choose_head(state, b, r, g);
  if ((g.lookup > 0 || !g.tree_shape.empty()) && g.sampling.temperature > 0.0f)
    throw ApiError(400,
                   "tokenfab: context lookup and tree drafts are verified greedily; use "
                   "temperature 0",
                   "temperature");
  return g;
}

void stream_response(ServerState& state, std::shared_ptr<Backend> b, httplib::Response& res,
                     const OpenAiRequest& r, GenerationRequest g,
                     std::shared_ptr<InFlightSlot> slot) {
  const ResponseIdentity who = new_identity(r.endpoint, b->model_id);
  auto shared = std::make_shared<GenerationRequest>(std::move(g));
  res.set_chunked_content_provider(
      "text/event-stream", [&state, b, r, who, shared, slot](size_t, httplib::DataSink& sink) {
        auto write = [&sink](const nlohmann::json& j) {
          const std::string event = sse_event(j);
          return sink.write(event.data(), event.size());
        };
        if (r.endpoint == Endpoint::kChat && !write(chunk_json(who, "", true, ""))) return false;
        const bool asked = r.logprobs.has_value();
        size_t text_offset = 0;  // completions' text_offset: bytes streamed before this piece
        RunResult result;
        try {
          result = run_request(
              b->engine, b->tokenizer, std::move(*shared), r.stop,
              [&](const std::string& piece, std::span<const LogprobEntry> entries) {
                const nlohmann::json lp = logprobs_json(r.endpoint, asked, entries, text_offset);
                text_offset += piece.size();
                return write(chunk_json(who, piece, false, "", lp));
              },
              [&state, &b] { return state.serving(*b); });
        } catch (const Error& e) {
          write(error_json(e.what(), "server_error", "", ""));
          sink.done();
          return true;
        }
        if (result.client_gone) {
          logger("api")->info("{}: {} after {} tokens; request cancelled", who.id,
                              state.serving(*b) ? "the client went away" : "the server is stopping",
                              result.usage.completion_tokens);
          return false;
        }
        write(chunk_json(who, "", false, result.finish_reason));
        if (r.include_usage) write(usage_chunk_json(who, result.usage, result.figures));
        const std::string done = "data: [DONE]\n\n";
        sink.write(done.data(), done.size());
        sink.done();
        logger("api")->debug("{}: streamed {} tokens, finish {}", who.id,
                             result.usage.completion_tokens, result.finish_reason);
        return true;
      });
}

}  // namespace

void handle_completion(ServerState& state, const httplib::Request& req, httplib::Response& res,
                       Endpoint endpoint) {
  const OpenAiRequest r = parse_openai_request(req.body, endpoint);
  std::shared_ptr<Backend> b = state.backend();
  if (!r.model.empty() && r.model != b->model_id)
    throw ApiError(
        404, "The model `" + r.model + "` does not exist; this server runs `" + b->model_id + "`.",
        "model", "invalid_request_error", "model_not_found");
  auto slot = std::make_shared<InFlightSlot>(state);
  GenerationRequest g = engine_request(state, *b, r);
  if (r.stream) {
    stream_response(state, std::move(b), res, r, std::move(g), std::move(slot));
    return;
  }
  const ResponseIdentity who = new_identity(endpoint, b->model_id);
  RunResult result;
  try {
    result = run_request(b->engine, b->tokenizer, std::move(g), r.stop, {},
                         [&state, &b] { return state.serving(*b); });
  } catch (const Error& e) {
    throw ApiError(500, std::string("the engine failed the request: ") + e.what(), "",
                   "server_error");
  }
  send_json(res, 200,
            completion_json(who, result.text, result.finish_reason, result.usage, result.figures,
                            logprobs_json(endpoint, r.logprobs.has_value(), result.logprobs)));
}

}  // namespace tokenfab::api
