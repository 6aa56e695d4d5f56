#pragma once
// The Llama forward pass on the CPU kernels: tokens at positions pos0 .. pos0+n-1 of one
// sequence go through every layer, their K/V rows are appended to the cache, and logits come out
// for the last token or for every token.

#include <cstdint>
#include <span>
#include <vector>

#include "core/model/kv_cache.h"
#include "core/model/llama_model.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"

namespace tokenfab {

enum class LogitsFor { LastToken, AllTokens };

class LlamaForward {
 public:
  // `max_chunk`: tokens processed per pass through the layers (longer inputs are chunked).
  LlamaForward(const LlamaModel& model, kernels::ThreadPool& pool, int64_t max_chunk = 512);

  // Runs `tokens` (positions cache.size() ..) and appends their K/V to `cache`. Writes logits:
  // (1, n_vocab) for LastToken, (n_tokens, n_vocab) for AllTokens. Throws Error for an empty
  // input or a token id outside the vocabulary; nothing is written to the cache then.
  void forward(std::span<const int32_t> tokens, KvCache& cache, LogitsFor which,
               std::vector<float>& logits);

  const LlamaModel& model() const { return model_; }
  KvCache make_cache() const;

 private:
  void run_chunk(std::span<const int32_t> tokens, KvCache& cache, LogitsFor which, float* logits);
  void attention_block(int64_t layer, int64_t n, KvCache& cache);
  void decode_attention(const kernels::AttentionArgs& args);
  void prefill_attention(const kernels::AttentionArgs& args);
  void ffn_block(int64_t layer, int64_t n);
  void norm_rows(const float* in, const std::vector<float>& w, float* out, int64_t n);

  const LlamaModel& model_;
  const HParams& hp_;
  kernels::ThreadPool& pool_;
  int64_t max_chunk_;
  kernels::ActivationScratch scratch_;
  // Buffers for one chunk of up to max_chunk_ tokens:
  std::vector<float> x_;         // (chunk, n_embd) residual stream
  std::vector<float> xb_;        // (chunk, n_embd) normalised input of a block
  std::vector<float> q_;         // (chunk, q_dim)
  std::vector<float> k_;         // (chunk, kv_dim) before it is stored in the cache as fp16
  std::vector<float> v_;         // (chunk, kv_dim)
  std::vector<float> att_;       // (chunk, q_dim) attention output
  std::vector<float> gate_;      // (chunk, n_ff)
  std::vector<float> up_;        // (chunk, n_ff)
  std::vector<float> rope_cos_;  // (chunk, rot_dim/2)
  std::vector<float> rope_sin_;  // (chunk, rot_dim/2)
  std::vector<std::vector<float>> attention_scratch_;  // per thread
  std::vector<float> decode_partials_;  // (n_head, threads, 2 + head_dim) split-K records
};

}  // namespace tokenfab
