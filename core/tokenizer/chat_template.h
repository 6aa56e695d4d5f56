#pragma once
// Chat templates. A model's own `tokenizer.chat_template` (Jinja) is rendered by our Jinja
// implementation (jinja_render.h) the way HF's apply_chat_template renders it. When a file has no
// template, or one that fails to parse or to render a short conversation, the family's known
// format is used instead — ChatML, Llama 3, Gemma, Mistral or Phi-3, written from the families'
// documentation — and one warning on the "tokenizer" logger says which and why.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/tokenizer/tokenizer.h"

namespace tokenfab::gguf {
class GgufFile;
}

namespace tokenfab::jinja {
class Template;
}

namespace tokenfab {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

// The special-token texts a template may render, and whether the tokenizer prepends BOS itself
// when it encodes (tokenizer.ggml.add_bos_token). When it does, apply() drops one leading
// bos_token text from the rendered prompt, so that the prompt gets one BOS, not two.
struct ChatTokens {
  std::string bos_token;
  std::string eos_token;
  bool tokenizer_adds_bos = false;
};

class ChatTemplate {
 public:
  // Jinja: the model's own template. The others are our built-in formats.
  enum class Family { ChatML, Llama3, Gemma, Mistral, Phi3, Jinja };

  // The file's own template, else the built-in format of its family, recognised from the
  // template's text or, without one, from the vocabulary's special tokens and
  // general.architecture. Throws Error when neither works.
  static ChatTemplate from_gguf(const gguf::GgufFile& file);
  // The built-in ChatML format; `default_system_prompt` opens conversations that have no system
  // message.
  static ChatTemplate chatml(std::optional<std::string> default_system_prompt);
  // A built-in format (not Family::Jinja).
  static ChatTemplate builtin(Family family, ChatTokens tokens = {});
  // A Jinja chat template; `source` names it in error messages. Throws Error when it does not
  // parse, or fails on a short user/assistant conversation.
  static ChatTemplate from_template_text(const std::string& jinja, const std::string& source,
                                         ChatTokens tokens = {});

  Family family() const { return family_; }
  static const char* family_name(Family family);  // "chatml", "llama3", ..., "jinja"
  // The system prompt the template puts first when a conversation has none (SmolLM2's and
  // Qwen's do), found by rendering; nullopt when it adds none.
  const std::optional<std::string>& default_system_prompt() const { return default_system_; }
  // The prompt text; with `add_generation_prompt` it ends where the assistant's reply begins.
  // Throws Error when the template refuses the conversation (its raise_exception message).
  std::string apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;

 private:
  ChatTemplate(Family family, std::shared_ptr<const jinja::Template> jinja, ChatTokens tokens);
  std::optional<std::string> find_default_system_prompt() const;

  Family family_ = Family::ChatML;
  std::shared_ptr<const jinja::Template> template_;
  ChatTokens tokens_;
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
