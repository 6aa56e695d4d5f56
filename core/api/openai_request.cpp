#include "core/api/openai_request.h"

#include <cmath>
#include <limits>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "core/api/api_error.h"

namespace tokenfab::api {

namespace {

using nlohmann::json;

// Fields OpenAI defines that the engine cannot do. A value that asks for nothing (false, 0, 1
// where 1 is the default) is accepted; see unsupported_value().
const std::set<std::string> kUnsupported = {
    "tools",      "tool_choice", "functions",        "function_call",     "response_format",
    "logit_bias", "n",           "presence_penalty", "frequency_penalty", "parallel_tool_calls",
    "audio",      "modalities",  "prediction",       "reasoning_effort",  "web_search_options",
    "best_of",    "echo",        "suffix",           "service_tier",      "store",
    "metadata"};

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    default:
      return "a number";
  }
}

[[noreturn]] void bad(const std::string& field, const std::string& message) {
  throw ApiError(400, field + ": " + message, field);
}

[[noreturn]] void wrong_type(const std::string& field, const json& v, const char* expected) {
  bad(field, std::string("expected ") + expected + ", got " + type_name(v));
}

// True when an unsupported field's value asks for nothing the engine would have to do.
bool asks_nothing(const std::string& key, const json& v) {
  if (v.is_null()) return true;
  if (key == "n" || key == "best_of") return v.is_number_integer() && v.get<int64_t>() == 1;
  if (key == "echo" || key == "store" || key == "parallel_tool_calls")
    return v.is_boolean() && !v.get<bool>();
  if (key == "presence_penalty" || key == "frequency_penalty")
    return v.is_number() && v.get<double>() == 0.0;
  if (key == "metadata" || key == "logit_bias") return v.is_object() && v.empty();
  if (key == "tools" || key == "functions") return v.is_array() && v.empty();
  if (key == "tool_choice") return v.is_string() && v.get<std::string>() == "none";
  if (key == "service_tier") return v.is_string() && v.get<std::string>() == "auto";
  return false;
}

double number(const std::string& field, const json& v) {
  if (!v.is_number()) wrong_type(field, v, "a number");
  const double d = v.get<double>();
  if (!std::isfinite(d)) bad(field, "expected a finite number");
  return d;
}

int64_t integer(const std::string& field, const json& v) {
  if (!v.is_number_integer()) wrong_type(field, v, "an integer");
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{std::numeric_limits<int64_t>::max()})
    bad(field, "out of range");
  return v.get<int64_t>();
}

bool boolean(const std::string& field, const json& v) {
  if (!v.is_boolean()) wrong_type(field, v, "a boolean");
  return v.get<bool>();
}

std::string string(const std::string& field, const json& v) {
  if (!v.is_string()) wrong_type(field, v, "a string");
  return v.get<std::string>();
}

// A message's content: a string, or an array of {"type":"text","text":…} parts joined.
std::string message_content(const std::string& field, const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) wrong_type(field, v, "a string or an array of text parts");
  std::string text;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string part = field + "[" + std::to_string(i) + "]";
    const json& p = v[i];
    if (!p.is_object()) wrong_type(part, p, "an object");
    const auto type = p.find("type");
    if (type == p.end()) bad(part + ".type", "missing");
    if (string(part + ".type", *type) != "text")
      bad(part + ".type",
          "only \"text\" parts are supported, got \"" + type->get<std::string>() + "\"");
    const auto t = p.find("text");
    if (t == p.end()) bad(part + ".text", "missing");
    text += string(part + ".text", *t);
  }
  return text;
}

std::vector<ChatMessage> messages(const json& v) {
  if (!v.is_array()) wrong_type("messages", v, "an array");
  if (v.empty()) bad("messages", "give at least one message");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string field = "messages[" + std::to_string(i) + "]";
    const json& m = v[i];
    if (!m.is_object()) wrong_type(field, m, "an object");
    ChatMessage message;
    bool has_content = false;
    for (const auto& [key, value] : m.items()) {
      if (key == "role") {
        message.role = string(field + ".role", value);
        if (message.role == "developer") message.role = "system";
        if (message.role != "system" && message.role != "user" && message.role != "assistant")
          bad(field + ".role",
              "\"" + message.role + "\" is not supported (system, developer, user or assistant)");
      } else if (key == "content") {
        if (!value.is_null()) message.content = message_content(field + ".content", value);
        has_content = true;
      } else if (key == "name") {
        string(field + ".name", value);  // accepted; chat templates do not render it
      } else {
        bad(field + "." + key, "not supported by this server");
      }
    }
    if (message.role.empty()) bad(field + ".role", "missing");
    if (!has_content) bad(field + ".content", "missing");
    out.push_back(std::move(message));
  }
  return out;
}

std::vector<std::string> stop_strings(const json& v) {
  std::vector<std::string> out;
  if (v.is_string()) {
    out.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    for (size_t i = 0; i < v.size(); ++i)
      out.push_back(string("stop[" + std::to_string(i) + "]", v[i]));
  } else {
    wrong_type("stop", v, "a string or an array of strings");
  }
  if (out.size() > OpenAiRequest::kMaxStop)
    bad("stop", "at most " + std::to_string(OpenAiRequest::kMaxStop) + " stop strings");
  std::erase_if(out, [](const std::string& s) { return s.empty(); });
  return out;
}

void tokenfab_extension(const json& v, OpenAiRequest& r) {
  if (!v.is_object()) wrong_type("tokenfab", v, "an object");
  for (const auto& [key, value] : v.items()) {
    if (key == "head") {
      r.head = string("tokenfab.head", value);
      if (r.head->empty()) bad("tokenfab.head", "expected auto, none or a head's id, name or path");
    } else if (key == "spec") {
      r.spec = string("tokenfab.spec", value);
      if (*r.spec != "chain" && *r.spec != "tree") bad("tokenfab.spec", "expected chain or tree");
    } else if (key == "lookup") {
      const int64_t n = integer("tokenfab.lookup", value);
      if (n < 0 || n > OpenAiRequest::kMaxLookup)
        bad("tokenfab.lookup",
            "expected 0 (off) to " + std::to_string(OpenAiRequest::kMaxLookup) + " tokens");
      r.lookup = static_cast<int32_t>(n);
    } else if (key == "draft_len") {
      const int64_t n = integer("tokenfab.draft_len", value);
      if (n < 1 || n > 16) bad("tokenfab.draft_len", "expected 1 to 16");
      r.draft_len = static_cast<int32_t>(n);
    } else {
      bad("tokenfab." + key, "unknown field (the extension takes: head, spec, lookup, draft_len)");
    }
  }
}

// The sampling fields; false when `key` is not one of them.
bool take_sampling(const std::string& key, const json& v, SamplingParams& s, bool& has_seed) {
  if (key == "temperature") {
    const double t = number(key, v);
    if (t < 0.0 || t > 2.0) bad(key, "expected a value in [0, 2]");
    s.temperature = static_cast<float>(t);
  } else if (key == "top_p") {
    const double p = number(key, v);
    if (!(p > 0.0 && p <= 1.0)) bad(key, "expected a value in (0, 1]");
    s.top_p = static_cast<float>(p);
  } else if (key == "top_k") {
    const int64_t k = integer(key, v);
    if (k < 0 || k > std::numeric_limits<int32_t>::max()) bad(key, "expected 0 (off) or more");
    s.top_k = static_cast<int32_t>(k);
  } else if (key == "min_p") {
    const double p = number(key, v);
    if (p < 0.0 || p > 1.0) bad(key, "expected a value in [0, 1]");
    s.min_p = static_cast<float>(p);
  } else if (key == "seed") {
    s.seed = static_cast<uint64_t>(integer(key, v));
    has_seed = true;
  } else {
    return false;
  }
  return true;
}

}  // namespace

OpenAiRequest parse_openai_request(const std::string& body, Endpoint endpoint) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::parse_error& e) {
    throw ApiError(400, std::string("the body is not valid JSON: ") + e.what());
  }
  if (!j.is_object())
    throw ApiError(400, std::string("the body must be a JSON object, got ") + type_name(j));
  OpenAiRequest r;
  r.endpoint = endpoint;
  const bool chat = endpoint == Endpoint::kChat;
  bool has_input = false, has_seed = false;
  std::optional<int64_t> max_tokens;
  std::optional<int32_t> top_logprobs;
  for (const auto& [key, v] : j.items()) {
    if (kUnsupported.contains(key)) {
      if (asks_nothing(key, v)) continue;
      bad(key, "not supported by this server");
    }
    if (v.is_null() && key != "messages" && key != "prompt") continue;  // null: not given
    if (take_sampling(key, v, r.sampling, has_seed)) continue;
    if (key == "model") {
      r.model = string(key, v);
    } else if (chat && key == "messages") {
      r.messages = messages(v);
      has_input = true;
    } else if (!chat && key == "prompt") {
      if (v.is_array()) bad(key, "only a single prompt string is supported");
      r.prompt = string(key, v);
      if (r.prompt.empty()) bad(key, "must not be empty");
      has_input = true;
    } else if (key == "max_tokens" || (chat && key == "max_completion_tokens")) {
      const int64_t n = integer(key, v);
      if (n < 1) bad(key, "must be at least 1, got " + std::to_string(n));
      if (max_tokens && *max_tokens != n) bad(key, "max_tokens and max_completion_tokens disagree");
      max_tokens = n;
    } else if (key == "stop") {
      r.stop = stop_strings(v);
    } else if (key == "stream") {
      r.stream = boolean(key, v);
    } else if (key == "ignore_eos") {
      r.ignore_eos = boolean(key, v);
    } else if (key == "stream_options") {
      if (!v.is_object()) wrong_type(key, v, "an object");
      for (const auto& [k, o] : v.items()) {
        if (k != "include_usage") bad("stream_options." + k, "unknown field");
        if (!o.is_null()) r.include_usage = boolean("stream_options.include_usage", o);
      }
    } else if (key == "logprobs") {
      if (chat) {
        if (boolean(key, v)) r.logprobs = std::max(r.logprobs.value_or(0), 0);
      } else {
        const int64_t n = integer(key, v);
        if (n < 0 || n > OpenAiRequest::kMaxTopLogprobs)
          bad(key, "expected 0 to " + std::to_string(OpenAiRequest::kMaxTopLogprobs));
        r.logprobs = static_cast<int32_t>(n);
      }
    } else if (chat && key == "top_logprobs") {
      const int64_t n = integer(key, v);
      if (n < 0 || n > OpenAiRequest::kMaxTopLogprobs)
        bad(key, "expected 0 to " + std::to_string(OpenAiRequest::kMaxTopLogprobs));
      top_logprobs = static_cast<int32_t>(n);
    } else if (key == "user") {
      string(key, v);  // an end-user id for abuse monitoring: accepted, not used
    } else if (key == "tokenfab") {
      tokenfab_extension(v, r);
    } else {
      bad(key, "unknown field");
    }
  }
  if (!has_input) {
    const std::string field = chat ? "messages" : "prompt";
    throw ApiError(400, field + ": missing", field);
  }
  if (j.contains("stream_options") && !j["stream_options"].is_null() && !r.stream)
    bad("stream_options", "only allowed when stream is true");
  if (top_logprobs) {
    if (!r.logprobs) bad("top_logprobs", "only allowed when logprobs is true");
    r.logprobs = *top_logprobs;
  }
  if (max_tokens) r.max_tokens = static_cast<int32_t>(std::min<int64_t>(*max_tokens, 1 << 30));
  if (!has_seed)
    r.sampling.seed = std::random_device{}() | (uint64_t{std::random_device{}()} << 32);
  return r;
}

}  // namespace tokenfab::api
