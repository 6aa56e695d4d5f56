#pragma once
// Chat templates. The family is recognised from `tokenizer.chat_template` (a Jinja text we do not
// execute); ChatML (SmolLM2, Qwen2) is supported, with the model's default system prompt taken
// from the template text when the conversation has none.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/tokenizer/tokenizer.h"

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

// A conversation's prompt within a context limit.
struct FittedPrompt {
  std::vector<TokenId> tokens;
  int left_out = 0;  // the oldest messages not in the prompt
};

// The generation prompt for `messages` (the last one the new user message), leaving out the
// oldest messages — as few as needed, never a system message or the last one — so that the
// prompt plus `reserve` tokens (the reply) is at most `limit` (no limit when limit <= 0). What is
// kept after the system messages opens with a user turn. When even leaving out all of them does
// not fit, all are left out: the engine then refuses the request, naming that prompt's length.
FittedPrompt fit_chat_prompt(const Tokenizer& tokenizer, const ChatTemplate& chat_template,
                             std::span<const ChatMessage> messages, int64_t reserve, int64_t limit);

}  // namespace tokenfab
