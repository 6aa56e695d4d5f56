#include "core/tokenizer/chat_template.h"

#include <string_view>

#include "core/common/error.h"
#include "core/gguf/gguf_reader.h"

namespace tokenfab {

namespace {

constexpr std::string_view kImStart = "<|im_start|>";
constexpr std::string_view kImEnd = "<|im_end|>";
constexpr std::string_view kTemplateKey = "tokenizer.chat_template";

// Names a family we recognise but do not format, from a marker its template contains.
std::string describe_family(const std::string& jinja) {
  struct Marker {
    std::string_view text;
    const char* family;
  };
  static constexpr Marker kMarkers[] = {
      {"<|start_header_id|>", "llama3"}, {"[INST]", "llama2/mistral"},
      {"<start_of_turn>", "gemma"},      {"<|START_OF_TURN_TOKEN|>", "command-r"},
      {"<|User|>", "deepseek"},          {"<|user|>", "zephyr/phi3"},
  };
  for (const Marker& m : kMarkers) {
    if (jinja.find(m.text) != std::string::npos) return m.family;
  }
  std::string head = jinja.substr(0, 60);
  for (char& c : head) {
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  }
  return "(unrecognised; the template begins \"" + head + "\")";
}

// The text of a Jinja string literal's body up to (not including) `raw`'s end, with escapes
// resolved; nullopt when the literal closes earlier (the text is then built from variables).
std::optional<std::string> unescape_literal(std::string_view raw, char quote) {
  std::string out;
  for (std::size_t i = 0; i < raw.size(); ++i) {
    const char c = raw[i];
    if (c == quote) return std::nullopt;
    if (c != '\\' || i + 1 == raw.size()) {
      out += c;
      continue;
    }
    const char next = raw[++i];
    out += next == 'n' ? '\n' : next == 't' ? '\t' : next == 'r' ? '\r' : next;
  }
  return out;
}

// A default system prompt written as one literal, '<|im_start|>system\n…<|im_end|>' (SmolLM2 and
// Qwen2 embed theirs like this). The newline may be a real one or the escape "\n".
std::optional<std::string> find_default_system_prompt(const std::string& jinja) {
  const std::string head = std::string(kImStart) + "system";
  for (std::size_t pos = jinja.find(head); pos != std::string::npos;
       pos = jinja.find(head, pos + 1)) {
    if (pos == 0) continue;
    const char quote = jinja[pos - 1];
    if (quote != '\'' && quote != '"') continue;
    std::size_t begin = pos + head.size();
    if (jinja.compare(begin, 1, "\n") == 0) {
      begin += 1;
    } else if (jinja.compare(begin, 2, "\\n") == 0) {
      begin += 2;
    } else {
      continue;
    }
    const std::size_t end = jinja.find(kImEnd, begin);
    if (end == std::string::npos) continue;
    if (auto text = unescape_literal(std::string_view(jinja).substr(begin, end - begin), quote)) {
      return text;
    }
  }
  return std::nullopt;
}

void append_turn(std::string& out, const std::string& role, const std::string& content) {
  out.append(kImStart).append(role).append("\n").append(content).append(kImEnd).append("\n");
}

}  // namespace

ChatTemplate ChatTemplate::chatml(std::optional<std::string> default_system_prompt) {
  ChatTemplate t;
  t.family_ = Family::ChatML;
  t.default_system_ = std::move(default_system_prompt);
  return t;
}

ChatTemplate ChatTemplate::from_template_text(const std::string& jinja, const std::string& source) {
  if (jinja.find(kImStart) != std::string::npos) return chatml(find_default_system_prompt(jinja));
  throw Error(source + ": unsupported chat template family " + describe_family(jinja) +
              " (supported: chatml)");
}

ChatTemplate ChatTemplate::from_gguf(const gguf::GgufFile& file) {
  const gguf::Value* value = file.find(kTemplateKey);
  if (value == nullptr) {
    throw Error(file.name() + ": the model has no chat template (metadata key " +
                std::string(kTemplateKey) + " is missing)");
  }
  const std::string where = file.name() + ": " + std::string(kTemplateKey);
  return from_template_text(value->as_string(where), where);
}

// The SmolLM2 / Qwen2 ChatML template, step for step: the default system turn goes first when
// the conversation does not open with a system message; every message is one turn.
std::string ChatTemplate::apply(const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt) const {
  std::string out;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    if (i == 0 && messages[0].role != "system" && default_system_) {
      append_turn(out, "system", *default_system_);
    }
    append_turn(out, messages[i].role, messages[i].content);
  }
  if (add_generation_prompt) out.append(kImStart).append("assistant\n");
  return out;
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
