// chat: interactive terminal chat through the engine (any mode: --devices, --prefill/--decode).
// Replies stream as they are generated; the conversation is kept until exit, and each turn finds
// the earlier ones in the prefix cache (in disaggregated mode, on the decode device that served
// them), so only new tokens are prefilled. When it outgrows the context, its oldest turns are left
// out of the prompt (fit_chat_prompt), as few as the reply's max tokens need.
// Ctrl-C stops the reply in progress; at the prompt it ends the chat. /reset forgets the history.

#include <csignal>
#include <iostream>
#include <memory>

#include <unistd.h>

#include "cli_common.h"
#include "core/common/error.h"
#include "core/runtime/generator.h"
#include "core/serving/engine.h"
#include "core/tokenizer/chat_template.h"
#include "engine_generation.h"
#include "head_options.h"

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
  EngineConfig engine;
  HeadOptions head;
};

void run_chat(const ChatCommand& c) {
  c.options.validate();
  LoadedModel m = load_model(c.common);
  const ChatTemplate tmpl = ChatTemplate::from_gguf(m.model->file());
  EngineConfig config = c.engine;
  config.threads = c.common.threads;
  config.max_context = std::min(c.ctx, m.model->hparams().n_ctx_train);
  Engine engine(*m.model, config,
                [&tok = *m.tokenizer](TokenId t) { return tok.is_end_of_generation(t); });
  HeadChooser heads(c.head, *m.model, *m.tokenizer);
  Speculation spec;
  spec.draft_len = c.head.draft_len;
  spec.adaptive_draft = c.head.adaptive_draft();
  spec.tree_shape = c.head.request_tree();
  spec.tree_nodes = c.head.request_tree_nodes();
  spec.lookup = c.head.lookup;
  std::signal(SIGINT, on_sigint);
  std::vector<ChatMessage> history;
  if (c.system) history.push_back({"system", *c.system});
  std::cout << "tokenfab chat — " << m.model->file().name() << " ("
            << (config.disaggregated() ? "prefill " + config.prefill + ", decode " + config.decode
                                       : config.devices)
            << "). Type a message; /reset clears the conversation, /exit or Ctrl-D quits, "
               "Ctrl-C stops a reply.\n";
  std::string line;
  for (;;) {
    std::cout << "\n> " << std::flush;
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line.empty()) continue;
    if (line == "/reset") {
      history.resize(c.system ? 1 : 0);
      std::cout << "(conversation cleared)\n";
      continue;
    }
    history.push_back({"user", line});
    // The oldest turns leave the prompt (not the history) as far as the reply's max tokens need.
    const FittedPrompt fit =
        fit_chat_prompt(*m.tokenizer, tmpl, history, c.options.max_tokens, config.max_context);
    const std::vector<TokenId>& ids = fit.tokens;
    if (static_cast<int64_t>(ids.size()) + 1 >= config.max_context) {
      std::cout << "(this message alone does not fit in the context of " << config.max_context
                << " tokens)\n";
      history.pop_back();
      continue;
    }
    if (fit.left_out > 0)
      std::cout << "(the " << fit.left_out << " oldest messages are left out of the prompt to fit "
                << "the context of " << config.max_context << " tokens)\n";
    HeadChoice choice = heads.choose(ids);
    spec.head = std::move(choice.head);
    spec.candidates = std::move(choice.candidates);
    GenerateOptions options = c.options;
    options.max_tokens = static_cast<int>(std::min<int64_t>(
        options.max_tokens, config.max_context - static_cast<int64_t>(ids.size())));
    g_cancel.store(false);
    g_generating.store(true);
    GenerateResult r;
    try {
      r = generate_with_engine(
          engine, *m.tokenizer, ids, options,
          [](const std::string& piece) { std::cout << piece << std::flush; }, &g_cancel, &spec);
    } catch (const Error& e) {
      g_generating.store(false);
      std::cout << "\n(error: " << e.what() << ")\n";
      history.pop_back();
      continue;
    }
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
  add_engine_options(*cmd, c->engine);
  add_head_options(*cmd, c->head);
  cmd->callback([c] { run_chat(*c); });
}

}  // namespace tokenfab::cli
