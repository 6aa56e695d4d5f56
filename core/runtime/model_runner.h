#pragma once
// Runs one planned batch on the CPU: the tokens of every sequence of the batch go through the
// layers in ONE pass (each matmul sees all rows), their K/V are written into the sequences' blocks
// of the paged pool, and each query attends over its own sequence's blocks. Prefill chunks and
// decode tokens mix freely in a batch (continuous batching, chunked prefill).

#include <atomic>
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
  std::span<const int32_t>
      tokens;        // tokens computed this step (a prefill chunk or one decode token)
  int64_t pos0 = 0;  // position of tokens[0]; positions before it are in the blocks
  std::span<const int32_t> blocks;  // block table covering positions [0, pos0 + tokens.size())
  bool want_logits = false;         // logits of the last token
  bool all_logits = false;          // logits of every token (speculative verification)
  // A draft tree (speculative verification), or empty for consecutive tokens: tree_parent[i] is
  // the token i follows (−1: the last position before pos0; else < i). Token i is computed at
  // position pos0 + depth(i) and attends only its ancestors after the context, while its K/V
  // goes to the slot of position pos0 + i (KvStorage::copy_position moves accepted ones).
  std::span<const int32_t> tree_parent = {};
};

// Checks a batch against a model and a pool of n_blocks blocks of block_size tokens. Throws Error
// for an empty sequence, a token outside the vocabulary, a block table that does not cover the
// positions or names a block outside the pool, or a bad tree.
void validate_batch(std::span<const BatchSequence> batch, const HParams& hp, int32_t n_blocks,
                    int32_t block_size);

// A batch's rows as the layers see them, sequence after sequence; both backends use it.
struct BatchRows {
  std::vector<int32_t> tokens;      // (rows)
  std::vector<int64_t> positions;   // (rows) RoPE positions (a tree row's: pos0 + its depth)
  std::vector<int64_t> logit_rows;  // the rows whose logits are wanted, in output order
  std::vector<kernels::PagedSequence> seqs;  // attention's view; blocks and parent point into batch
  void assign(std::span<const BatchSequence> batch);
};

class ModelRunner {
 public:
  ModelRunner(const LlamaModel& model, kernels::ThreadPool& pool, KvStorage& storage);

  // Writes logits (rows wanting them, n_vocab) in batch order: the last token of each sequence
  // with want_logits, every token of one with all_logits. With `hidden`, also the final-norm
  // hidden states of the same rows (rows, n_embd), or with draft taps on, each row's draft
  // features (rows, hidden_width()): the final-norm hidden state, then the normalised residual
  // stream after each of draft_tap_layers (TransformerPass::set_taps). Throws Error for an empty
  // sequence, a token outside the vocabulary or a block table that does not cover the positions.
  void run(std::span<const BatchSequence> batch, std::vector<float>& logits,
           std::vector<float>* hidden = nullptr);
  // Draft taps (off by default): see run().
  void set_draft_taps(bool on);
  int64_t hidden_width() const {
    return hp_.n_embd * (1 + static_cast<int64_t>(pass_.taps().size()));
  }
  // logits (n, n_vocab) of the model's LM head over z (n, n_embd): draft heads use it.
  void lm_head(const float* z, int64_t n, std::vector<float>& logits);
  // From the next run() on, each layer's KV, once written to the pool for every row, is announced
  // by storing the number of layers written so far into *counter (release order); nullptr: off.
  void set_layer_progress(std::atomic<int32_t>* counter) { kv_.set_progress(counter); }

 private:
  class PagedBackend : public KvBackend {
   public:
    PagedBackend(const HParams& hp, kernels::ThreadPool& pool, KvStorage& storage)
        : hp_(hp), pool_(pool), storage_(storage) {}
    void bind(std::span<const BatchSequence> batch, std::span<const kernels::PagedSequence> seqs);
    void store(int64_t layer, const float* k, const float* v, int64_t n_rows) override;
    void attend(int64_t layer, const float* q, float* out, int64_t n_rows) override;
    void set_progress(std::atomic<int32_t>* counter) { progress_ = counter; }

   private:
    const HParams& hp_;
    kernels::ThreadPool& pool_;
    KvStorage& storage_;
    std::span<const BatchSequence> batch_;
    std::span<const kernels::PagedSequence> seqs_;
    kernels::PagedAttentionScratch scratch_;
    std::atomic<int32_t>* progress_ = nullptr;
  };

  const HParams& hp_;
  KvStorage& storage_;
  TransformerPass pass_;
  PagedBackend kv_;
  BatchRows rows_;
};

}  // namespace tokenfab
