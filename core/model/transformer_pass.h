#pragma once
// One pass of rows through the layers on the CPU kernels. A row is a token at a position; the
// rows of one pass may belong to one sequence (LlamaForward) or to many (the batched
// ModelRunner). Where K/V are kept and how queries attend over them is the KvBackend's business,
// so the layer arithmetic exists once. The family's differences from the Llama layers (biases,
// Q/K norms, post-norms, RoPE style and variants, activation, soft-caps) come from the model's
// Architecture (architecture.h); every family runs this same code.

#include <cstdint>
#include <span>
#include <vector>

#include "core/model/llama_model.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"

namespace tokenfab {

class KvBackend {
 public:
  virtual ~KvBackend() = default;
  // Keeps this pass's K and V rows of `layer`: k, v (n_rows, kv_dim) f32, RoPE applied to k.
  virtual void store(int64_t layer, const float* k, const float* v, int64_t n_rows) = 0;
  // out (n_rows, q_dim) ← attention of q (n_rows, q_dim) over the rows each query may see (the
  // layer's window, scale and soft-cap are the model's: HParams::window(layer) and so on).
  virtual void attend(int64_t layer, const float* q, float* out, int64_t n_rows) = 0;
};

// The layers whose outputs an mtp draft head may read besides the final hidden state (its "taps",
// as EAGLE-3 fuses low, middle and high features): the residual stream after the layer at half
// the depth and after the one at nine tenths, 0-based and distinct (14 and 26 of SmolLM2's 30).
std::vector<int32_t> draft_tap_layers(int64_t n_layer);

class TransformerPass {
 public:
  TransformerPass(const LlamaModel& model, kernels::ThreadPool& pool);

  // tokens, positions: (n_rows). Writes logits (logit_rows.size(), n_vocab) for the listed rows,
  // in that order. Token ids must already be validated against the vocabulary. With keep_taps,
  // also the logit rows' layer taps (set_taps; tap_rows()).
  void run(std::span<const int32_t> tokens, std::span<const int64_t> positions, KvBackend& kv,
           std::span<const int64_t> logit_rows, float* logits, bool keep_taps = false);

  // The final-norm hidden states (the LM head's input) of the logit rows of the last run():
  // (logit_rows.size(), n_embd), valid until the next call. Draft heads start from these.
  const float* final_hidden() const { return xb_.data(); }
  // The layers whose residual stream a run() with keep_taps keeps for the logit rows (0-based,
  // ascending), RMS-normalised without a weight: x / sqrt(mean(x²) + eps). Empty: none (the
  // default).
  void set_taps(std::vector<int32_t> layers);
  const std::vector<int32_t>& taps() const { return taps_; }
  // (logit_rows.size(), taps().size() · n_embd) of the last run() with keep_taps, valid until
  // the next call.
  const float* tap_rows() const { return tap_rows_.data(); }
  // logits (n, n_vocab) = the model's LM head applied to z (n, n_embd) (draft heads share it).
  void lm_head(const float* z, int64_t n, float* logits);

  const LlamaModel& model() const { return model_; }
  kernels::ThreadPool& pool() { return pool_; }

 private:
  void reserve_rows(int64_t n);
  void attention_block(int64_t layer, int64_t n, KvBackend& kv);
  void ffn_block(int64_t layer, int64_t n);
  void norm_rows(const float* in, const std::vector<float>& w, float* out, int64_t n);
  // q (n, q_dim) and k (n, kv_dim) of `layer`: biases, per-head norms and RoPE, as the family has.
  void prepare_qk(const LayerWeights& w, int64_t layer, int64_t n);
  void rope_rows(float* x, int n_heads, int64_t stride, int rope, int64_t n);
  void apply_final_softcap(float* logits, int64_t n);
  void add_rows(float* x, const float* y, int64_t n);  // x += y, (n, n_embd) each
  // fn(begin, end) over the rows [0, n): split over the threads from kParallelRows rows on (the
  // element-wise ops of fewer rows take less time than waking the threads).
  template <typename Fn>
  void for_rows(int64_t n, Fn&& fn);
  static constexpr int64_t kParallelRows = 4;

  const LlamaModel& model_;
  const HParams& hp_;
  kernels::ThreadPool& pool_;
  kernels::ActivationScratch scratch_;
  int64_t rows_ = 0;             // rows the buffers below hold
  std::vector<float> x_;         // (rows, n_embd) residual stream
  std::vector<float> xb_;        // (rows, n_embd) normalised input of a block
  std::vector<float> q_;         // (rows, q_dim)
  std::vector<float> k_;         // (rows, kv_dim) until the backend stores it
  std::vector<float> v_;         // (rows, kv_dim)
  std::vector<float> att_;       // (rows, q_dim) attention output
  std::vector<float> gate_;      // (rows, n_ff)
  std::vector<float> up_;        // (rows, n_ff)
  std::vector<float> rope_cos_;  // (ropes, rows, rot_dim/2): Architecture::ropes
  std::vector<float> rope_sin_;  // (ropes, rows, rot_dim/2)
  std::vector<int32_t> taps_;
  std::vector<float> tap_rows_;  // (logit rows, taps · n_embd)
  std::vector<float> ones_;      // (n_embd) the taps' norm weight
};

}  // namespace tokenfab
