#pragma once
// Single-sequence generation on the CPU forward pass: prefill the prompt, then sample and decode
// one token at a time, streaming text through a callback. A Generator keeps its KV cache between
// calls, so a follow-up prompt that extends the previous one (a chat turn) only prefills the new
// tokens.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/model/llama_forward.h"
#include "core/model/llama_model.h"
#include "core/runtime/sampler.h"
#include "core/tokenizer/tokenizer.h"
#include "kernels/cpu/thread_pool.h"

namespace tokenfab {

struct GenerateOptions {
  int max_tokens = 256;
  SamplingParams sampling;
  bool stop_at_end_of_generation = true;
  // Throws Error naming the option when out of range.
  void validate() const;
};

struct GenerateResult {
  std::vector<TokenId> ids;  // generated ids (the end-of-generation token excluded)
  std::string text;
  int64_t prompt_tokens = 0;
  int64_t prefilled_tokens = 0;  // prompt tokens actually computed (the rest came from the cache)
  int64_t output_tokens = 0;
  double ttft_ms = 0.0;          // call start → first token sampled
  double decode_tok_s = 0.0;     // (output_tokens - 1) / (last token time - first token time)
  double prefill_tok_s = 0.0;    // prefilled_tokens / prefill time
  std::string stop_reason;       // "eog", "length", "context", "cancelled"
};

// Receives each piece of text as soon as it is complete UTF-8.
using TextCallback = std::function<void(const std::string& piece)>;

class Generator {
 public:
  // n_ctx: positions the cache may hold (clamped to the model's training context).
  Generator(const LlamaModel& model, const Tokenizer& tokenizer, int threads, int64_t n_ctx);

  // Throws Error when the prompt is empty or does not leave room for one generated token.
  GenerateResult generate(const std::vector<TokenId>& prompt, const GenerateOptions& options,
                          const TextCallback& on_text = {},
                          const std::atomic<bool>* cancel = nullptr);

  int64_t n_ctx() const { return n_ctx_; }
  int threads() const { return pool_.size(); }
  void reset();  // forget the cached sequence
  LlamaForward& forward() { return forward_; }
  KvCache& cache() { return cache_; }

 private:
  int64_t reuse_cached_prefix(const std::vector<TokenId>& prompt);

  const LlamaModel& model_;
  const Tokenizer& tokenizer_;
  int64_t n_ctx_;
  kernels::ThreadPool pool_;
  LlamaForward forward_;
  KvCache cache_;
  std::vector<TokenId> cached_;  // the ids whose K/V rows are in cache_, in order
  std::vector<float> logits_;
};

}  // namespace tokenfab
