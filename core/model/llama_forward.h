#pragma once
// The Llama forward pass of one sequence over its contiguous KV cache: tokens at positions
// pos0 .. pos0+n-1 go through every layer (TransformerPass), their K/V rows are appended to the
// cache, and logits come out for the last token or for every token.

#include <cstdint>
#include <span>
#include <vector>

#include "core/model/kv_cache.h"
#include "core/model/llama_model.h"
#include "core/model/transformer_pass.h"
#include "kernels/cpu/attention.h"
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

  const LlamaModel& model() const { return pass_.model(); }
  KvCache make_cache() const;

 private:
  // KvBackend over one contiguous, head-major KvCache: split-K attention for one query token,
  // cost-balanced (head, token) items for a chunk.
  class ContiguousKv : public KvBackend {
   public:
    ContiguousKv(const HParams& hp, kernels::ThreadPool& pool);
    void bind(KvCache& cache) { cache_ = &cache; }
    void store(int64_t layer, const float* k, const float* v, int64_t n_rows) override;
    void attend(int64_t layer, const float* q, float* out, int64_t n_rows) override;

   private:
    void decode_attention(const kernels::AttentionArgs& args);
    void prefill_attention(const kernels::AttentionArgs& args);

    const HParams& hp_;
    kernels::ThreadPool& pool_;
    KvCache* cache_ = nullptr;
    std::vector<std::vector<float>> scratch_;  // per thread
    std::vector<float> partials_;              // (n_head, threads, 2 + head_dim) split-K records
  };

  const HParams& hp_;
  int64_t max_chunk_;
  TransformerPass pass_;
  ContiguousKv kv_;
  std::vector<int64_t> positions_;
  std::vector<int64_t> logit_rows_;
};

}  // namespace tokenfab
