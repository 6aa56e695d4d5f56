// generate: one prompt (raw text or a chat message) → streamed text, or one JSON object. It runs
// through the engine, so --devices / --prefill / --decode choose colocated or disaggregated
// serving; with --temperature 0 the output is the same in every mode.

#include <iostream>
#include <memory>

#include "cli_common.h"
#include "core/common/error.h"
#include "core/runtime/generator.h"
#include "core/serving/engine.h"
#include "core/tokenizer/chat_template.h"
#include "engine_generation.h"
#include "head_options.h"

namespace tokenfab::cli {

namespace {

nlohmann::json switches_json(const std::vector<SpeculationStats::HeadSwitch>& switches) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& s : switches)
    out.push_back({{"at_token", s.at_token},
                   {"from", s.from},
                   {"to", s.to},
                   {"live_accept_per_step", s.live_accept_per_step},
                   {"from_record", s.from_record},
                   {"to_record", s.to_record}});
  return out;
}

struct GenerateCommand {
  CommonOptions common;
  std::optional<std::string> prompt;
  std::optional<std::string> chat;
  std::optional<std::string> system;
  GenerateOptions options;
  int64_t ctx = 4096;
  EngineConfig engine;
  HeadOptions head;
};

void run_generate(const GenerateCommand& c) {
  if (c.prompt.has_value() == c.chat.has_value())
    throw Error("give exactly one of --prompt TEXT (raw text) or --chat TEXT (a chat message)");
  c.options.validate();
  LoadedModel m = load_model(c.common);
  std::vector<TokenId> prompt_ids;
  if (c.prompt) {
    prompt_ids = m.tokenizer->encode(*c.prompt, m.tokenizer->add_bos_token(), false);
  } else {
    const ChatTemplate tmpl = ChatTemplate::from_gguf(m.model->file());
    std::vector<ChatMessage> messages;
    if (c.system) messages.push_back({"system", *c.system});
    messages.push_back({"user", *c.chat});
    prompt_ids =
        m.tokenizer->encode(tmpl.apply(messages, true), m.tokenizer->add_bos_token(), true);
  }
  EngineConfig config = c.engine;
  config.threads = c.common.threads;
  config.max_context = std::min(c.ctx, m.model->hparams().n_ctx_train);
  GenerateOptions options = c.options;
  const auto n_prompt = static_cast<int64_t>(prompt_ids.size());
  if (n_prompt >= config.max_context)
    throw Error("the prompt (" + std::to_string(n_prompt) +
                " tokens) does not fit the context of " + std::to_string(config.max_context) +
                " tokens (--ctx)");
  options.max_tokens =
      static_cast<int>(std::min<int64_t>(options.max_tokens, config.max_context - n_prompt));
  Engine engine(*m.model, config,
                [&tok = *m.tokenizer](TokenId t) { return tok.is_end_of_generation(t); });
  TextCallback stream;
  if (!c.common.json) stream = [](const std::string& piece) { std::cout << piece << std::flush; };
  Speculation spec;
  HeadChoice choice = HeadChooser(c.head, *m.model, *m.tokenizer).choose(prompt_ids);
  spec.head = std::move(choice.head);
  spec.candidates = std::move(choice.candidates);
  spec.draft_len = c.head.draft_len;
  spec.adaptive_draft = c.head.adaptive_draft();
  spec.tree_shape = c.head.request_tree();
  spec.tree_nodes = c.head.request_tree_nodes();
  spec.lookup = c.head.lookup;
  GenerateResult r =
      generate_with_engine(engine, *m.tokenizer, prompt_ids, options, stream, nullptr, &spec);
  if (r.stop_reason == "length" && options.max_tokens < c.options.max_tokens)
    r.stop_reason = "context";
  if (c.common.json) {
    print_json({{"text", r.text},
                {"ids", r.ids},
                {"prompt_tokens", r.prompt_tokens},
                {"output_tokens", r.output_tokens},
                {"ttft_ms", r.ttft_ms},
                {"decode_tok_s", r.decode_tok_s},
                {"prefill_tok_s", r.prefill_tok_s},
                {"stop_reason", r.stop_reason},
                {"mode", config.disaggregated() ? "disaggregated" : "colocated"},
                {"head", spec.head ? nlohmann::json(spec.head->info.name) : nlohmann::json()},
                {"head_candidates", spec.candidates.size()},
                {"lookup", spec.lookup},
                {"steps", spec.steps},
                {"head_switches", switches_json(spec.switches)},
                {"draft_lengths", spec.length_steps},
                {"verify_steps", spec.verify_steps},
                {"draft_ms", spec.draft_s * 1e3},
                {"verify_ms", spec.verify_s * 1e3},
                {"accept_per_step",
                 spec.accept_per_step ? nlohmann::json(*spec.accept_per_step) : nlohmann::json()}});
    return;
  }
  std::cout << std::endl;
  std::cerr << "[" << r.prompt_tokens << " prompt tokens, " << r.output_tokens
            << " generated; TTFT " << static_cast<int>(r.ttft_ms) << " ms; decode "
            << static_cast<int>(r.decode_tok_s) << " tok/s; stop: " << r.stop_reason << "]"
            << std::endl;
}

}  // namespace

void add_generation_options(CLI::App& cmd, GenerateOptions& g, int64_t& ctx) {
  cmd.add_option("--max-tokens", g.max_tokens, "most tokens to generate")->capture_default_str();
  cmd.add_option("--ctx", ctx, "context length in tokens (prompt + reply)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 24));
  add_sampling_options(cmd, g.sampling);
}

void register_generate(CLI::App& app) {
  auto c = std::make_shared<GenerateCommand>();
  auto* cmd = app.add_subcommand("generate", "generate text from a prompt");
  add_run_options(*cmd, c->common);
  cmd->add_option("--prompt", c->prompt, "raw text prompt (BOS added per the model)");
  cmd->add_option("--chat", c->chat, "a user message, formatted with the model's chat template");
  cmd->add_option("--system", c->system, "system prompt for --chat (default: the model's own)");
  add_generation_options(*cmd, c->options, c->ctx);
  add_engine_options(*cmd, c->engine);
  add_head_options(*cmd, c->head);
  cmd->callback([c] { run_generate(*c); });
}

}  // namespace tokenfab::cli
