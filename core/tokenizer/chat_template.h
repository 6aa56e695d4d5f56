#pragma once
// Chat templates. The family is recognised from `tokenizer.chat_template` (a Jinja text we do not
// execute); ChatML (SmolLM2, Qwen2) is supported, with the model's default system prompt taken
// from the template text when the conversation has none.

#include <optional>
#include <string>
#include <vector>

namespace tokenfab::gguf {
class GgufFile;
}

namespace tokenfab {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

class ChatTemplate {
 public:
  enum class Family { ChatML };

  // Throws Error when the file has no template or one of an unsupported family.
  static ChatTemplate from_gguf(const gguf::GgufFile& file);
  static ChatTemplate chatml(std::optional<std::string> default_system_prompt);
  // Recognises the family of a Jinja template text; `source` names it in error messages.
  static ChatTemplate from_template_text(const std::string& jinja, const std::string& source);

  Family family() const { return family_; }
  const std::optional<std::string>& default_system_prompt() const { return default_system_; }
  // The prompt text; with `add_generation_prompt` it ends where the assistant's reply begins.
  std::string apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;

 private:
  Family family_ = Family::ChatML;
  std::optional<std::string> default_system_;
};

}  // namespace tokenfab
