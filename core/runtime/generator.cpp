#include "core/runtime/generator.h"

#include <algorithm>

#include "core/common/error.h"

namespace tokenfab {

using Clock = std::chrono::steady_clock;

static double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

void GenerateOptions::validate() const {
  if (max_tokens <= 0)
    throw Error("--max-tokens must be at least 1, got " + std::to_string(max_tokens));
  sampling.validate();
}

Generator::Generator(const LlamaModel& model, const Tokenizer& tokenizer, int threads, int64_t n_ctx)
    : model_(model),
      tokenizer_(tokenizer),
      n_ctx_(std::min(n_ctx, model.hparams().n_ctx_train)),
      pool_(threads),
      forward_(model, pool_),
      cache_(forward_.make_cache()) {}

void Generator::reset() {
  cache_.clear();
  cached_.clear();
}

// Keeps the longest prefix of `prompt` already in the cache (at least one token is always left
// to compute, so the prefill produces the logits of the last prompt token).
int64_t Generator::reuse_cached_prefix(const std::vector<TokenId>& prompt) {
  size_t common = 0;
  while (common < cached_.size() && common + 1 < prompt.size() && cached_[common] == prompt[common])
    ++common;
  cached_.resize(common);
  cache_.set_size(static_cast<int64_t>(common));
  return static_cast<int64_t>(common);
}

GenerateResult Generator::generate(const std::vector<TokenId>& prompt, const GenerateOptions& options,
                                   const TextCallback& on_text, const std::atomic<bool>* cancel) {
  options.validate();
  if (prompt.empty()) throw Error("the prompt is empty");
  const auto n_prompt = static_cast<int64_t>(prompt.size());
  if (n_prompt >= n_ctx_)
    throw Error("the prompt has " + std::to_string(n_prompt) + " tokens but the context holds " +
                std::to_string(n_ctx_) + " (one position must stay free for the reply)");

  const Clock::time_point start = Clock::now();
  GenerateResult result;
  result.prompt_tokens = n_prompt;
  const int64_t reused = reuse_cached_prefix(prompt);
  // Room for the whole reply up front, so the cache is not regrown (and copied) while decoding.
  cache_.reserve(std::min(n_ctx_, n_prompt + options.max_tokens));
  const std::vector<TokenId> fresh(prompt.begin() + reused, prompt.end());
  forward_.forward(fresh, cache_, LogitsFor::LastToken, logits_);
  cached_.insert(cached_.end(), fresh.begin(), fresh.end());
  result.prefilled_tokens = static_cast<int64_t>(fresh.size());
  const Clock::time_point prefill_end = Clock::now();
  result.prefill_tok_s = static_cast<double>(fresh.size()) / std::max(1e-9, ms_between(start, prefill_end) / 1e3);

  Sampler sampler(options.sampling);
  IncrementalDetokenizer detok(tokenizer_);
  Clock::time_point first_token, last_token;
  result.stop_reason = "length";
  for (int i = 0; i < options.max_tokens; ++i) {
    if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
      result.stop_reason = "cancelled";
      break;
    }
    const TokenId next = sampler.sample(logits_);
    last_token = Clock::now();
    if (i == 0) {
      first_token = last_token;
      result.ttft_ms = ms_between(start, first_token);
    }
    if (options.stop_at_end_of_generation && tokenizer_.is_end_of_generation(next)) {
      result.stop_reason = "eog";
      break;
    }
    result.ids.push_back(next);
    const std::string piece = detok.push(next);
    result.text += piece;
    if (on_text && !piece.empty()) on_text(piece);
    if (i + 1 == options.max_tokens) break;
    if (cache_.size() + 1 >= n_ctx_) {
      result.stop_reason = "context";
      break;
    }
    const TokenId step[] = {next};
    forward_.forward(step, cache_, LogitsFor::LastToken, logits_);
    cached_.push_back(next);
  }
  const std::string tail = detok.flush();
  result.text += tail;
  if (on_text && !tail.empty()) on_text(tail);
  result.output_tokens = static_cast<int64_t>(result.ids.size());
  if (result.output_tokens > 1) {
    result.decode_tok_s = static_cast<double>(result.output_tokens - 1) /
                          std::max(1e-9, ms_between(first_token, last_token) / 1e3);
  }
  return result;
}

}  // namespace tokenfab
