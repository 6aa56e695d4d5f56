// perplexity: exp(mean negative log-likelihood) of a text file under the model, over
// non-overlapping windows of --ctx tokens (each window starts with an empty cache).

#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "cli_common.h"
#include "core/common/error.h"
#include "core/model/llama_forward.h"

namespace tokenfab::cli {

namespace {

struct PerplexityCommand {
  CommonOptions common;
  std::string file;
  int64_t ctx = 512;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// -log softmax(logits)[target], in double.
double nll(const float* logits, int64_t n_vocab, TokenId target) {
  float max = logits[0];
  for (int64_t i = 1; i < n_vocab; ++i) max = std::max(max, logits[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - max);
  return std::log(sum) + max - logits[target];
}

void run_perplexity(const PerplexityCommand& c) {
  if (c.ctx < 2) throw Error("--ctx must be at least 2");
  LoadedModel m = load_model(c.common);
  const std::vector<TokenId> ids =
      m.tokenizer->encode(read_file(c.file), m.tokenizer->add_bos_token(), false);
  if (ids.size() < 2) throw Error(c.file + ": the text has fewer than 2 tokens");
  const int64_t n_vocab = m.model->hparams().n_vocab;
  const int64_t ctx = std::min(c.ctx, m.model->hparams().n_ctx_train);
  kernels::ThreadPool pool(resolve_threads(c.common.threads));
  LlamaForward forward(*m.model, pool);
  std::vector<float> logits;
  double total = 0.0;
  int64_t scored = 0, windows = 0;
  for (size_t start = 0; start + 1 < ids.size(); start += static_cast<size_t>(ctx)) {
    const size_t len = std::min(static_cast<size_t>(ctx), ids.size() - start);
    if (len < 2) break;
    KvCache cache = forward.make_cache();
    const std::span<const TokenId> window(ids.data() + start, len);
    forward.forward(window, cache, LogitsFor::AllTokens, logits);
    for (size_t i = 0; i + 1 < len; ++i)
      total += nll(logits.data() + i * n_vocab, n_vocab, window[i + 1]);
    scored += static_cast<int64_t>(len) - 1;
    ++windows;
  }
  const double ppl = std::exp(total / static_cast<double>(scored));
  if (c.common.json) {
    print_json({{"ppl", ppl}, {"tokens", scored}, {"windows", windows}, {"ctx", ctx}});
  } else {
    std::cout << "perplexity " << ppl << " over " << scored << " tokens (" << windows
              << " windows of up to " << ctx << ")" << std::endl;
  }
}

}  // namespace

void register_perplexity(CLI::App& app) {
  auto c = std::make_shared<PerplexityCommand>();
  auto* cmd = app.add_subcommand("perplexity", "perplexity of a text file");
  add_run_options(*cmd, c->common);
  cmd->add_option("--file", c->file, "text file")->required();
  cmd->add_option("--ctx", c->ctx, "window length in tokens")->capture_default_str();
  cmd->callback([c] { run_perplexity(*c); });
}

}  // namespace tokenfab::cli
