#include "core/api/openai_response.h"

#include <chrono>
#include <cstdio>
#include <random>

namespace tokenfab::api {

using nlohmann::json;

ResponseIdentity new_identity(Endpoint endpoint, const std::string& model) {
  thread_local std::mt19937_64 rng{std::random_device{}() ^
                                   (uint64_t{std::random_device{}()} << 32)};
  char hex[25];
  std::snprintf(hex, sizeof hex, "%016llx%08llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng() & 0xffffffffu));
  ResponseIdentity who;
  who.endpoint = endpoint;
  who.id = (endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-") + std::string(hex);
  who.created = std::chrono::duration_cast<std::chrono::seconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count();
  who.model = model;
  return who;
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

json figures_json(const TokenfabFigures& f) {
  json switches = json::array();
  for (const TokenfabFigures::Switch& s : f.switches)
    switches.push_back({{"at_token", s.at_token}, {"from", s.from}, {"to", s.to}});
  return {{"ttft_ms", f.ttft_ms},
          {"decode_tok_s", f.decode_tok_s},
          {"accept_per_step", f.accept_per_step ? json(*f.accept_per_step) : json()},
          {"head", f.head.empty() ? json() : json(f.head)},
          {"head_switches", switches}};
}

namespace {

json bytes_of(const std::string& s) {
  json out = json::array();
  for (const char c : s) out.push_back(static_cast<unsigned char>(c));
  return out;
}

}  // namespace

json logprobs_json(Endpoint endpoint, bool asked, std::span<const LogprobEntry> entries,
                   size_t text_offset) {
  if (!asked) return nullptr;
  if (endpoint == Endpoint::kChat) {
    json content = json::array();
    for (const LogprobEntry& e : entries) {
      json top = json::array();
      for (const auto& [token, logprob] : e.top)
        top.push_back({{"token", token}, {"logprob", logprob}, {"bytes", bytes_of(token)}});
      content.push_back({{"token", e.token},
                         {"logprob", e.logprob},
                         {"bytes", bytes_of(e.token)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(),
       offsets = json::array();
  size_t offset = text_offset;
  for (const LogprobEntry& e : entries) {
    tokens.push_back(e.token);
    token_logprobs.push_back(e.logprob);
    json alternatives = json::object();
    for (const auto& [token, logprob] : e.top) alternatives[token] = logprob;
    top.push_back(alternatives);
    offsets.push_back(offset);
    offset += e.token.size();
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_logprobs},
          {"top_logprobs", top},
          {"text_offset", offsets}};
}

namespace {

json finish(const std::string& reason) {
  return reason.empty() ? json() : json(reason);
}

json head_of(const ResponseIdentity& who, const char* object) {
  return {{"id", who.id}, {"object", object}, {"created", who.created}, {"model", who.model}};
}

}  // namespace

json completion_json(const ResponseIdentity& who, const std::string& text,
                     const std::string& finish_reason, const Usage& usage,
                     const TokenfabFigures& figures, const json& logprobs) {
  const bool chat = who.endpoint == Endpoint::kChat;
  json j = head_of(who, chat ? "chat.completion" : "text_completion");
  json choice = {{"index", 0}, {"finish_reason", finish(finish_reason)}, {"logprobs", logprobs}};
  if (chat)
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  else
    choice["text"] = text;
  j["choices"] = json::array({choice});
  j["usage"] = usage_json(usage);
  j["tokenfab"] = figures_json(figures);
  return j;
}

json chunk_json(const ResponseIdentity& who, const std::string& text, bool role,
                const std::string& finish_reason, const json& logprobs) {
  const bool chat = who.endpoint == Endpoint::kChat;
  json j = head_of(who, chat ? "chat.completion.chunk" : "text_completion");
  json choice = {{"index", 0}, {"finish_reason", finish(finish_reason)}, {"logprobs", logprobs}};
  if (chat) {
    json delta = json::object();
    if (role) delta["role"] = "assistant";
    if (role || !text.empty()) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  j["choices"] = json::array({choice});
  return j;
}

json usage_chunk_json(const ResponseIdentity& who, const Usage& usage,
                      const TokenfabFigures& figures) {
  json j =
      head_of(who, who.endpoint == Endpoint::kChat ? "chat.completion.chunk" : "text_completion");
  j["choices"] = json::array();
  j["usage"] = usage_json(usage);
  j["tokenfab"] = figures_json(figures);
  return j;
}

json error_json(const std::string& message, const std::string& type, const std::string& param,
                const std::string& code) {
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param.empty() ? json() : json(param)},
            {"code", code.empty() ? json() : json(code)}}}};
}

json models_json(const std::string& model_id, int64_t created) {
  return {{"object", "list"},
          {"data", json::array({{{"id", model_id},
                                 {"object", "model"},
                                 {"created", created},
                                 {"owned_by", "tokenfab"}}})}};
}

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string sse_event(const json& j) {
  return "data: " + dump(j) + "\n\n";
}

}  // namespace tokenfab::api
