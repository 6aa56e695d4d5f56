// chat: interactive terminal chat. Replies stream as they are generated; the conversation is
// kept until exit (each turn reuses the cached prefix, so only new tokens are prefilled).
// Ctrl-C stops the reply in progress; at the prompt it ends the chat. /reset forgets the history.

#include <csignal>
#include <iostream>
#include <memory>

#include <unistd.h>

#include "cli_common.h"
#include "core/runtime/generator.h"
#include "core/tokenizer/chat_template.h"

namespace tokenfab::cli {

namespace {

std::atomic<bool> g_cancel{false};
std::atomic<bool> g_generating{false};

void on_sigint(int) {
  if (g_generating.load()) {
    g_cancel.store(true);
  } else {
    const char msg[] = "\n";
    (void)!write(STDOUT_FILENO, msg, 1);
    std::_Exit(0);
  }
}

struct ChatCommand {
  CommonOptions common;
  std::optional<std::string> system;
  GenerateOptions options;
  int64_t ctx = 4096;
};

void run_chat(const ChatCommand& c) {
  c.options.validate();
  LoadedModel m = load_model(c.common);
  const ChatTemplate tmpl = ChatTemplate::from_gguf(m.model->file());
  Generator generator(*m.model, *m.tokenizer, resolve_threads(c.common.threads), c.ctx);
  std::signal(SIGINT, on_sigint);
  std::vector<ChatMessage> history;
  if (c.system) history.push_back({"system", *c.system});
  std::cout << "tokenfab chat — " << m.model->file().name() << " (" << generator.threads()
            << " threads). Type a message; /reset clears the conversation, /exit or Ctrl-D quits, "
               "Ctrl-C stops a reply.\n";
  std::string line;
  for (;;) {
    std::cout << "\n> " << std::flush;
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line.empty()) continue;
    if (line == "/reset") {
      history.resize(c.system ? 1 : 0);
      generator.reset();
      std::cout << "(conversation cleared)\n";
      continue;
    }
    history.push_back({"user", line});
    const auto ids = m.tokenizer->encode(tmpl.apply(history, true), m.tokenizer->add_bos_token(), true);
    if (static_cast<int64_t>(ids.size()) + 1 >= generator.n_ctx()) {
      std::cout << "(the conversation no longer fits in the context of " << generator.n_ctx()
                << " tokens; /reset to start over)\n";
      history.pop_back();
      continue;
    }
    g_cancel.store(false);
    g_generating.store(true);
    const GenerateResult r = generator.generate(
        ids, c.options, [](const std::string& piece) { std::cout << piece << std::flush; }, &g_cancel);
    g_generating.store(false);
    history.push_back({"assistant", r.text});
    std::cout << "\n[" << r.output_tokens << " tokens · " << static_cast<int>(r.decode_tok_s)
              << " tok/s · TTFT " << static_cast<int>(r.ttft_ms) << " ms · prefilled "
              << r.prefilled_tokens << " of " << r.prompt_tokens << " prompt tokens"
              << (r.stop_reason == "cancelled" ? " · stopped" : "") << "]\n";
  }
}

}  // namespace

void register_chat(CLI::App& app) {
  auto c = std::make_shared<ChatCommand>();
  c->options.max_tokens = 512;
  auto* cmd = app.add_subcommand("chat", "interactive chat in the terminal");
  add_model_option(*cmd, c->common);
  add_threads_option(*cmd, c->common);
  cmd->add_option("--system", c->system, "system prompt (default: the model's own)");
  add_generation_options(*cmd, c->options, c->ctx);
  cmd->callback([c] { run_chat(*c); });
}

}  // namespace tokenfab::cli
