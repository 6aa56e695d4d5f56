#include "core/tokenizer/chat_template.h"

#include <algorithm>
#include <string_view>

#include "core/common/error.h"
#include "core/common/log.h"
#include "core/gguf/gguf_reader.h"
#include "core/tokenizer/jinja_render.h"

namespace tokenfab {

namespace {

constexpr std::string_view kTemplateKey = "tokenizer.chat_template";

// The built-in formats, written from each family's documentation of its prompt format. They are
// Jinja rendered like a model's own template; `bos_token` renders empty when the tokenizer adds
// BOS itself (see ChatTokens).
constexpr const char* kChatMLFormat = R"({%- for message in messages -%}
{%- if loop.first and message.role != 'system' and default_system_prompt is not none -%}
{{- '<|im_start|>system\n' + default_system_prompt + '<|im_end|>\n' -}}
{%- endif -%}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%})";

constexpr const char* kLlama3Format = R"({{- bos_token -}}
{%- for message in messages -%}
{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + message.content | trim + '<|eot_id|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}{%- endif -%})";

// Gemma has no system role: system text opens the next turn. Its assistant role is "model".
constexpr const char* kGemmaFormat = R"({{- bos_token -}}
{%- set pending = namespace(system='') -%}
{%- for message in messages -%}
{%- if message.role == 'system' -%}
{%- set pending.system = pending.system + message.content | trim + '\n\n' -%}
{%- else -%}
{{- '<start_of_turn>' + ('model' if message.role == 'assistant' else message.role) + '\n' + pending.system + message.content | trim + '<end_of_turn>\n' -}}
{%- set pending.system = '' -%}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<start_of_turn>model\n' -}}{%- endif -%})";

// Mistral has no system role either: system text opens the next instruction. The reply follows
// "[/INST]" directly, so there is no generation prompt to add.
constexpr const char* kMistralFormat = R"({{- bos_token -}}
{%- set pending = namespace(system='') -%}
{%- for message in messages -%}
{%- if message.role == 'system' -%}
{%- set pending.system = pending.system + message.content + '\n\n' -%}
{%- elif message.role == 'assistant' -%}
{{- ' ' + message.content + eos_token -}}
{%- else -%}
{{- '[INST] ' + pending.system + message.content + ' [/INST]' -}}
{%- set pending.system = '' -%}
{%- endif -%}
{%- endfor -%})";

constexpr const char* kPhi3Format = R"({%- for message in messages -%}
{{- '<|' + message.role + '|>\n' + message.content + '<|end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|assistant|>\n' -}}{%- endif -%})";

const char* format_text(ChatTemplate::Family family) {
  switch (family) {
    case ChatTemplate::Family::ChatML:
      return kChatMLFormat;
    case ChatTemplate::Family::Llama3:
      return kLlama3Format;
    case ChatTemplate::Family::Gemma:
      return kGemmaFormat;
    case ChatTemplate::Family::Mistral:
      return kMistralFormat;
    case ChatTemplate::Family::Phi3:
      return kPhi3Format;
    case ChatTemplate::Family::Jinja:
      break;
  }
  throw Error("ChatTemplate::builtin: the jinja family has no built-in format");
}

// The special tokens that mark each family's turns, most specific first.
struct Marker {
  std::string_view token;
  ChatTemplate::Family family;
};
constexpr Marker kMarkers[] = {
    {"<|im_start|>", ChatTemplate::Family::ChatML},
    {"<|start_header_id|>", ChatTemplate::Family::Llama3},
    {"<start_of_turn>", ChatTemplate::Family::Gemma},
    {"<|user|>", ChatTemplate::Family::Phi3},
    {"[INST]", ChatTemplate::Family::Mistral},
};

std::optional<ChatTemplate::Family> family_from_text(const std::string& jinja) {
  for (const Marker& m : kMarkers) {
    if (jinja.find(m.token) != std::string::npos) return m.family;
  }
  return std::nullopt;
}

// From the vocabulary's special tokens, else the architecture. `why` says which decided.
std::optional<ChatTemplate::Family> family_from_model(const gguf::GgufFile& file,
                                                      std::string& why) {
  if (const gguf::Value* tokens = file.find("tokenizer.ggml.tokens");
      tokens != nullptr && tokens->type() == gguf::ValueType::Array) {
    for (const Marker& m : kMarkers) {
      for (const gguf::Value& t : tokens->as_array()) {
        if (t.type() == gguf::ValueType::String && t.as_string() == m.token) {
          why = "recognised from the token " + std::string(m.token) + " in its vocabulary";
          return m.family;
        }
      }
    }
  }
  const gguf::Value* arch = file.find("general.architecture");
  if (arch == nullptr || arch->type() != gguf::ValueType::String) return std::nullopt;
  const std::string& a = arch->as_string();
  why = "recognised from general.architecture " + a;
  if (a.starts_with("gemma")) return ChatTemplate::Family::Gemma;
  if (a == "phi3") return ChatTemplate::Family::Phi3;
  if (a.starts_with("qwen")) return ChatTemplate::Family::ChatML;
  return std::nullopt;
}

std::string token_text(const gguf::GgufFile& file, std::string_view id_key) {
  const gguf::Value* id = file.find(id_key);
  const gguf::Value* tokens = file.find("tokenizer.ggml.tokens");
  if (id == nullptr || !id->is_integer() || tokens == nullptr ||
      tokens->type() != gguf::ValueType::Array) {
    return {};
  }
  const int64_t i = id->as_int();
  const gguf::Value::Array& all = tokens->as_array();
  if (i < 0 || i >= static_cast<int64_t>(all.size()) ||
      all[static_cast<size_t>(i)].type() != gguf::ValueType::String) {
    return {};
  }
  return all[static_cast<size_t>(i)].as_string();
}

ChatTokens chat_tokens(const gguf::GgufFile& file) {
  ChatTokens tokens;
  tokens.bos_token = token_text(file, "tokenizer.ggml.bos_token_id");
  tokens.eos_token = token_text(file, "tokenizer.ggml.eos_token_id");
  if (const gguf::Value* add_bos = file.find("tokenizer.ggml.add_bos_token");
      add_bos != nullptr && add_bos->type() == gguf::ValueType::Bool) {
    tokens.tokenizer_adds_bos = add_bos->as_bool();
  }
  return tokens;
}

jinja::Value message_list(const std::vector<ChatMessage>& messages) {
  std::vector<jinja::Value> items;
  for (const ChatMessage& m : messages) {
    jinja::DictData d;
    d.set(jinja::Value("role"), jinja::Value(m.role));
    d.set(jinja::Value("content"), jinja::Value(m.content));
    items.push_back(jinja::Value::dict(std::move(d)));
  }
  return jinja::Value::list(std::move(items));
}

std::string one_line(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

}  // namespace

ChatTemplate::ChatTemplate(Family family, std::shared_ptr<const jinja::Template> jinja,
                           ChatTokens tokens)
    : family_(family), template_(std::move(jinja)), tokens_(std::move(tokens)) {}

const char* ChatTemplate::family_name(Family family) {
  switch (family) {
    case Family::ChatML:
      return "chatml";
    case Family::Llama3:
      return "llama3";
    case Family::Gemma:
      return "gemma";
    case Family::Mistral:
      return "mistral";
    case Family::Phi3:
      return "phi3";
    case Family::Jinja:
      return "jinja";
  }
  return "unknown";
}

ChatTemplate ChatTemplate::builtin(Family family, ChatTokens tokens) {
  const std::string source = std::string("built-in ") + family_name(family) + " chat format";
  auto jinja =
      std::make_shared<const jinja::Template>(jinja::Template::parse(format_text(family), source));
  return ChatTemplate(family, std::move(jinja), std::move(tokens));
}

ChatTemplate ChatTemplate::chatml(std::optional<std::string> default_system_prompt) {
  ChatTemplate t = builtin(Family::ChatML);
  t.default_system_ = std::move(default_system_prompt);
  return t;
}

ChatTemplate ChatTemplate::from_template_text(const std::string& jinja, const std::string& source,
                                              ChatTokens tokens) {
  auto parsed = std::make_shared<const jinja::Template>(jinja::Template::parse(jinja, source));
  ChatTemplate t(Family::Jinja, std::move(parsed), std::move(tokens));
  try {
    t.apply({{"user", "Hello!"}, {"assistant", "Hi. How can I help?"}, {"user", "Say hi."}}, true);
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (while rendering a short user/assistant conversation)");
  }
  t.default_system_ = t.find_default_system_prompt();
  return t;
}

ChatTemplate ChatTemplate::from_gguf(const gguf::GgufFile& file) {
  const ChatTokens tokens = chat_tokens(file);
  std::string reason, why;
  std::optional<Family> family;
  if (const gguf::Value* value = file.find(kTemplateKey)) {
    const std::string where = file.name() + ": " + std::string(kTemplateKey);
    const std::string& text = value->as_string(where);
    try {
      return from_template_text(text, where, tokens);
    } catch (const Error& e) {
      reason = "its chat template cannot be used: " + one_line(e.what());
    }
    family = family_from_text(text);
    why = "recognised from the template's text";
  } else {
    reason = "it has no chat template (metadata key " + std::string(kTemplateKey) + ")";
  }
  if (!family) family = family_from_model(file, why);
  if (!family) {
    throw Error(file.name() + ": " + reason +
                ", and its chat format is not one Tokenfab knows (built in: chatml, llama3, "
                "gemma, mistral, phi3)");
  }
  logger("tokenizer")
      ->warn("{}: {}; using the built-in {} chat format ({})", file.name(), reason,
             family_name(*family), why);
  return builtin(*family, tokens);
}

std::string ChatTemplate::apply(const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt) const {
  jinja::DictData variables;
  variables.set(jinja::Value("messages"), message_list(messages));
  variables.set(jinja::Value("add_generation_prompt"), jinja::Value(add_generation_prompt));
  variables.set(jinja::Value("bos_token"), jinja::Value(tokens_.bos_token));
  variables.set(jinja::Value("eos_token"), jinja::Value(tokens_.eos_token));
  // HF passes these as None when the request has none.
  variables.set(jinja::Value("tools"), jinja::Value::none());
  variables.set(jinja::Value("documents"), jinja::Value::none());
  if (family_ == Family::ChatML) {
    variables.set(jinja::Value("default_system_prompt"),
                  default_system_ ? jinja::Value(*default_system_) : jinja::Value::none());
  }
  std::string text = template_->render(variables);
  const std::string& bos = tokens_.bos_token;
  if (tokens_.tokenizer_adds_bos && !bos.empty() && text.starts_with(bos))
    text.erase(0, bos.size());
  return text;
}

// The text the template puts where a system message's content would go, when the conversation
// has none: render with a probe system message and without one, and compare around the probe.
std::optional<std::string> ChatTemplate::find_default_system_prompt() const {
  static constexpr std::string_view kProbe = "SYSTEM-PROBE-6a1f";
  std::string with, without;
  try {
    with = apply({{"system", std::string(kProbe)}, {"user", "Hello!"}}, false);
    without = apply({{"user", "Hello!"}}, false);
  } catch (const Error&) {
    return std::nullopt;  // e.g. a template that refuses system messages
  }
  const size_t at = with.find(kProbe);
  if (at == std::string::npos) return std::nullopt;
  const std::string_view before = std::string_view(with).substr(0, at);
  const std::string_view after = std::string_view(with).substr(at + kProbe.size());
  if (without.size() <= before.size() + after.size() || !without.starts_with(before) ||
      !without.ends_with(after)) {
    return std::nullopt;
  }
  return without.substr(before.size(), without.size() - before.size() - after.size());
}

FittedPrompt fit_chat_prompt(const Tokenizer& tokenizer, const ChatTemplate& chat_template,
                             std::span<const ChatMessage> messages, int64_t reserve,
                             int64_t limit) {
  // The messages that may be left out, oldest first.
  std::vector<size_t> droppable;
  for (size_t i = 0; i + 1 < messages.size(); ++i)
    if (messages[i].role != "system") droppable.push_back(i);
  const auto prompt_without = [&](size_t k) {  // the k oldest droppable ones left out
    std::vector<ChatMessage> kept;
    for (size_t i = 0, next = 0; i < messages.size(); ++i) {
      if (next < k && droppable[next] == i) {
        ++next;
        continue;
      }
      kept.push_back(messages[i]);
    }
    return tokenizer.encode(chat_template.apply(kept, true), tokenizer.add_bos_token(), true);
  };
  const auto fits = [&](const std::vector<TokenId>& prompt) {
    return limit <= 0 || static_cast<int64_t>(prompt.size()) + reserve <= limit;
  };
  FittedPrompt fit;
  fit.tokens = prompt_without(0);
  if (fits(fit.tokens) || droppable.empty()) return fit;
  // Leaving out more never lengthens the prompt, so the fewest is found by halving.
  size_t low = 0, high = droppable.size();  // low does not fit; high does, or is all of them
  while (high - low > 1) {
    const size_t middle = low + (high - low) / 2;
    (fits(prompt_without(middle)) ? high : low) = middle;
  }
  while (high < droppable.size() && messages[droppable[high]].role == "assistant") ++high;
  fit.tokens = prompt_without(high);
  fit.left_out = static_cast<int>(high);
  return fit;
}

}  // namespace tokenfab
