// bench: prefill and decode speed of one sequence on the CPU backend, as JSON. Each repetition
// starts from an empty cache, prefills a prompt of --prompt-tokens tokens, then decodes
// --gen-tokens tokens greedily (end-of-generation ignored); the medians are reported.

#include <algorithm>
#include <iostream>
#include <memory>

#include "cli_common.h"
#include "core/common/error.h"
#include "core/runtime/generator.h"

namespace tokenfab::cli {

namespace {

struct BenchCommand {
  CommonOptions common;
  int prompt_tokens = 512;
  int gen_tokens = 128;
  int repetitions = 3;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void run_bench(const BenchCommand& c) {
  if (c.prompt_tokens < 1 || c.gen_tokens < 2 || c.repetitions < 1)
    throw Error("bench needs --prompt-tokens >= 1, --gen-tokens >= 2 and --repetitions >= 1");
  LoadedModel m = load_model(c.common);
  const std::vector<TokenId> prompt = bench_prompt(*m.tokenizer, c.prompt_tokens, 0);
  const int threads = resolve_threads(c.common.threads);
  Generator generator(*m.model, *m.tokenizer, threads, c.prompt_tokens + c.gen_tokens + 1);
  GenerateOptions options;
  options.max_tokens = c.gen_tokens;
  options.sampling.temperature = 0.0f;
  options.stop_at_end_of_generation = false;

  std::vector<double> prefill, decode;
  for (int rep = 0; rep < c.repetitions; ++rep) {
    generator.reset();
    const GenerateResult r = generator.generate(prompt, options);
    prefill.push_back(r.prefill_tok_s);
    decode.push_back(r.decode_tok_s);
    if (!c.common.json)
      std::cerr << "run " << rep + 1 << ": prefill " << r.prefill_tok_s << " tok/s, decode "
                << r.decode_tok_s << " tok/s" << std::endl;
  }
  const nlohmann::json j = {{"prefill_tok_s", median(prefill)},
                            {"decode_tok_s", median(decode)},
                            {"threads", threads},
                            {"model", m.model->file().name()},
                            {"prompt_tokens", c.prompt_tokens},
                            {"gen_tokens", c.gen_tokens},
                            {"repetitions", c.repetitions},
                            {"prefill_tok_s_runs", prefill},
                            {"decode_tok_s_runs", decode},
                            {"backend", "cpu"}};
  print_report(j, c.common.json);
}

}  // namespace

void register_bench(CLI::App& app) {
  auto c = std::make_shared<BenchCommand>();
  auto* cmd = app.add_subcommand("bench", "measure prefill and decode tokens/s (JSON)");
  add_run_options(*cmd, c->common);
  cmd->add_option("--prompt-tokens", c->prompt_tokens, "prompt length")->capture_default_str();
  cmd->add_option("--gen-tokens", c->gen_tokens, "tokens to generate")->capture_default_str();
  cmd->add_option("--repetitions", c->repetitions, "runs; the median is reported")->capture_default_str();
  cmd->callback([c] { run_bench(*c); });
}

}  // namespace tokenfab::cli
