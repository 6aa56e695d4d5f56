#pragma once
// Runs one planned batch on the CPU: the tokens of every sequence of the batch go through the
// layers in ONE pass (each matmul sees all rows), their K/V are written into the sequences' blocks
// of the paged pool, and each query attends over its own sequence's blocks. Prefill chunks and
// decode tokens mix freely in a batch (continuous batching, chunked prefill).

#include <cstdint>
#include <span>
#include <vector>

#include "core/model/llama_model.h"
#include "core/model/transformer_pass.h"
#include "core/runtime/kv_storage.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/thread_pool.h"

namespace tokenfab {

struct BatchSequence {
  std::span<const int32_t> tokens;  // tokens computed this step (a prefill chunk or one decode token)
  int64_t pos0 = 0;                 // position of tokens[0]; positions before it are in the blocks
  std::span<const int32_t> blocks;  // block table covering positions [0, pos0 + tokens.size())
  bool want_logits = false;         // logits of the last token
  bool all_logits = false;          // logits of every token (speculative verification)
  // A draft tree (speculative verification), or empty for consecutive tokens: tree_parent[i] is
  // the token i follows (−1: the last position before pos0; else < i). Token i is computed at
  // position pos0 + depth(i) and attends only its ancestors after the context, while its K/V
  // goes to the slot of position pos0 + i (KvStorage::copy_position moves accepted ones).
  std::span<const int32_t> tree_parent = {};
};

class ModelRunner {
 public:
  ModelRunner(const LlamaModel& model, kernels::ThreadPool& pool, KvStorage& storage);

  // Writes logits (rows wanting them, n_vocab) in batch order: the last token of each sequence
  // with want_logits, every token of one with all_logits. With `hidden`, also the final-norm
  // hidden states of the same rows (rows, n_embd). Throws Error for an empty sequence, a token
  // outside the vocabulary or a block table that does not cover the positions.
  void run(std::span<const BatchSequence> batch, std::vector<float>& logits,
           std::vector<float>* hidden = nullptr);
  // logits (n, n_vocab) of the model's LM head over z (n, n_embd): draft heads use it.
  void lm_head(const float* z, int64_t n, std::vector<float>& logits);

 private:
  class PagedBackend : public KvBackend {
   public:
    PagedBackend(const HParams& hp, kernels::ThreadPool& pool, KvStorage& storage)
        : hp_(hp), pool_(pool), storage_(storage) {}
    void bind(std::span<const BatchSequence> batch);
    void store(int64_t layer, const float* k, const float* v, int64_t n_rows) override;
    void attend(int64_t layer, const float* q, float* out, int64_t n_rows) override;

   private:
    const HParams& hp_;
    kernels::ThreadPool& pool_;
    KvStorage& storage_;
    std::span<const BatchSequence> batch_;
    std::vector<kernels::PagedSequence> seqs_;
    kernels::PagedAttentionScratch scratch_;
  };

  void validate(std::span<const BatchSequence> batch) const;

  const HParams& hp_;
  KvStorage& storage_;
  TransformerPass pass_;
  PagedBackend kv_;
  std::vector<int32_t> tokens_;     // (rows) the batch's tokens, sequence after sequence
  std::vector<int64_t> positions_;  // (rows) RoPE positions
  std::vector<int64_t> logit_rows_;
};

}  // namespace tokenfab
