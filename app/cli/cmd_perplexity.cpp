// perplexity: exp(mean negative log-likelihood) of a text file under the model, by one of two
// conventions (--convention):
//
// tokenfab (default): the whole text, with BOS when the model adds one, cut into non-overlapping
//   windows of --ctx tokens (the last one may be shorter); each window starts with an empty cache
//   and every prediction in it is scored (len − 1 tokens a window).
//
// llama.cpp: what `llama-perplexity -f FILE -c CTX` does (tools/perplexity/perplexity.cpp of the
//   llama.cpp that llama-cpp-python 0.3.36 vendors), so that the two numbers compare:
//   - the file loses one trailing '\n', and is tokenized with BOS when the model adds one
//     (special-token text is not parsed);
//   - the text must have at least 2 × CTX tokens; it is cut into floor(n_tokens / CTX) chunks of
//     exactly CTX tokens (the tail is dropped);
//   - each chunk starts with an empty cache, its first token replaced by BOS when the model adds
//     one;
//   - only the second half is scored: the logits of positions CTX/2 … CTX−2 predict tokens
//     CTX/2+1 … CTX−1, so CTX − 1 − CTX/2 tokens a chunk (255 for CTX 512);
//   - it reports "PPL = exp(mean nll) +/- ppl × sqrt((mean(nll²) − mean(nll)²) / (count − 1))",
//     the standard error of the mean nll carried to the perplexity (`ppl_stderr` here).

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
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
  std::string convention = "tokenfab";
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

// Negative log-likelihoods of the scored tokens.
struct Scores {
  double sum = 0.0;
  double sum_sq = 0.0;
  int64_t count = 0;
  int64_t windows = 0;

  double ppl() const { return std::exp(sum / static_cast<double>(count)); }
  // llama-perplexity's "+/-": the standard error of the mean nll, times the perplexity.
  double ppl_stderr() const {
    const double mean = sum / static_cast<double>(count);
    const double var = sum_sq / static_cast<double>(count) - mean * mean;
    return var > 0.0 && count > 1 ? ppl() * std::sqrt(var / static_cast<double>(count - 1)) : 0.0;
  }
};

// Runs one window from an empty cache and scores window[i + 1] from the logits of position i,
// for every i from `first` on.
void score_window(LlamaForward& forward, std::span<const TokenId> window, size_t first,
                  std::vector<float>& logits, Scores& s) {
  const int64_t n_vocab = forward.model().hparams().n_vocab;
  KvCache cache = forward.make_cache();
  forward.forward(window, cache, LogitsFor::AllTokens, logits);  // (len, n_vocab)
  for (size_t i = first; i + 1 < window.size(); ++i) {
    const double v = nll(logits.data() + i * n_vocab, n_vocab, window[i + 1]);
    s.sum += v;
    s.sum_sq += v * v;
    ++s.count;
  }
  ++s.windows;
}

Scores score_tokenfab(LlamaForward& forward, const std::vector<TokenId>& ids, size_t ctx) {
  Scores s;
  std::vector<float> logits;
  for (size_t start = 0; start + 1 < ids.size(); start += ctx) {
    const size_t len = std::min(ctx, ids.size() - start);
    if (len < 2) break;
    score_window(forward, std::span(ids.data() + start, len), 0, logits, s);
  }
  return s;
}

Scores score_llama_cpp(LlamaForward& forward, const std::vector<TokenId>& ids, size_t ctx,
                       std::optional<TokenId> bos) {
  Scores s;
  std::vector<float> logits;
  std::vector<TokenId> chunk(ctx);
  for (size_t start = 0; start + ctx <= ids.size(); start += ctx) {
    std::copy_n(ids.begin() + static_cast<std::ptrdiff_t>(start), ctx, chunk.begin());
    if (bos) chunk[0] = *bos;
    score_window(forward, chunk, ctx / 2, logits, s);
  }
  return s;
}

void run_perplexity(const PerplexityCommand& c) {
  if (c.ctx < 2) throw Error("--ctx must be at least 2");
  const bool llama_cpp = c.convention == "llama.cpp";
  LoadedModel m = load_model(c.common);
  const Tokenizer& tok = *m.tokenizer;
  std::string text = read_file(c.file);
  if (llama_cpp && !text.empty() && text.back() == '\n') text.pop_back();
  const std::vector<TokenId> ids = tok.encode(text, tok.add_bos_token(), false);
  const int64_t ctx = std::min(c.ctx, m.model->hparams().n_ctx_train);
  const auto n_ids = static_cast<int64_t>(ids.size());
  if (n_ids < 2) throw Error(c.file + ": the text has fewer than 2 tokens");
  if (llama_cpp && n_ids < 2 * ctx)
    throw Error(
        c.file + ": the text has " + std::to_string(n_ids) +
        " tokens; llama.cpp's convention needs at least 2 × --ctx = " + std::to_string(2 * ctx));
  kernels::ThreadPool pool(resolve_threads(c.common.threads));
  LlamaForward forward(*m.model, pool);
  std::optional<TokenId> bos;
  if (tok.add_bos_token() && tok.bos_id() >= 0) bos = tok.bos_id();
  const Scores s = llama_cpp ? score_llama_cpp(forward, ids, static_cast<size_t>(ctx), bos)
                             : score_tokenfab(forward, ids, static_cast<size_t>(ctx));
  if (c.common.json) {
    nlohmann::json j = {{"ppl", s.ppl()},
                        {"tokens", s.count},
                        {"windows", s.windows},
                        {"ctx", ctx},
                        {"convention", c.convention}};
    if (llama_cpp) {
      j["chunks"] = s.windows;
      j["ppl_stderr"] = s.ppl_stderr();
      j["text_tokens"] = ids.size();
    }
    print_json(j);
  } else if (llama_cpp) {
    std::cout << "perplexity " << s.ppl() << " +/- " << s.ppl_stderr() << " over " << s.count
              << " tokens (llama.cpp's convention: second halves of " << s.windows << " chunks of "
              << ctx << ")" << std::endl;
  } else {
    std::cout << "perplexity " << s.ppl() << " over " << s.count << " tokens (" << s.windows
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
  cmd->add_option("--convention", c->convention,
                  "tokenfab: every token of non-overlapping windows; llama.cpp: as "
                  "llama-perplexity, the second half of each full window")
      ->check(CLI::IsMember({"tokenfab", "llama.cpp"}))
      ->capture_default_str();
  cmd->callback([c] { run_perplexity(*c); });
}

}  // namespace tokenfab::cli
