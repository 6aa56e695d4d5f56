#pragma once
// The training objective of one draft-head residual block over a mini-batch, with its gradient:
// a Medusa head (input h) or the mtp block (input [h; e(x)], draft_head.h).
//
// SHORTLIST SOFTMAX (an approximation): the softmax runs over a shortlist V' of the vocabulary —
// in training, every label and every top-k id seen in the training traces (a few thousand ids of
// SmolLM2's 49 152) — instead of the full vocabulary. Tokens outside V' never appear as targets,
// so their only role in a full softmax would be as negatives of (typically) negligible
// probability; dropping them makes each step ~10× cheaper. The loss is therefore a lower bound of
// the full-vocabulary cross-entropy. Evaluation (trainer.h) uses the full LM head.

#include <cstdint>
#include <span>
#include <vector>

#include "core/kvcache/block_pool.h"  // TokenId
#include "core/model/llama_model.h"
#include "kernels/cpu/thread_pool.h"

namespace tokenfab {

// Rows of the target's LM head for a shortlist of token ids, dequantized to f32.
struct Shortlist {
  int64_t n_embd = 0;
  std::vector<TokenId> ids;  // (n) sorted, unique
  std::vector<float> rows;   // (n, n_embd): row j is the LM-head row of ids[j]

  int64_t size() const { return static_cast<int64_t>(ids.size()); }
  int32_t index_of(TokenId id) const;  // position of `id` in ids, or -1
  // `ids` are sorted and deduplicated; throws Error for an id outside the model's vocabulary.
  static Shortlist from_model(const LlamaModel& model, std::vector<TokenId> ids);
  static Shortlist from_rows(std::vector<TokenId> ids, std::vector<float> rows, int64_t n_embd);
};

// Targets of the m rows of a mini-batch, as shortlist indices. The loss of a row is
//   (1 − kl_weight) · CE(onehot(label)) + kl_weight · CE(q),
// q the target's top-k distribution (soft_prob, summing to 1); CE(q) = KL(q‖p) + H(q), so the
// soft term has the gradient of a KL to q.
//
// Optionally (mtp) a hidden-state regression term is added to each row's loss:
//   hidden_weight · mean_j (z_j − hidden[j])²,
// hidden (m, n_embd) the target's own hidden state at the position the block predicts.
struct HeadTargets {
  std::span<const int32_t> label;       // (m)
  std::span<const int32_t> soft_index;  // (m, top_k); empty when kl_weight == 0
  std::span<const float> soft_prob;     // (m, top_k)
  int32_t top_k = 0;
  float kl_weight = 0.0f;
  const float* hidden = nullptr;  // (m, n_embd) when hidden_weight > 0
  float hidden_weight = 0.0f;
};

// Buffers reused across steps (grow to the largest batch, never shrink).
struct HeadLossScratch {
  std::vector<float> u;       // (m, n_embd) W h + b, then SiLU'(u)
  std::vector<float> z;       // (m, n_embd) h + SiLU(u)
  std::vector<float> logits;  // (m, n) logits over the shortlist, then dloss/dlogits
  std::vector<float> dz;      // (m, n_embd) dloss/dz, then dloss/du
  std::vector<float> du_t;    // (n_embd, m) dloss/du transposed
  std::vector<double> loss;   // (threads)
};

// Sum over the m input rows x (m, in_cols) of the loss of the block z = x[:, :n_embd] +
// SiLU(W x + b) scored by softmax(E' z) over the shortlist; adds the gradient of that sum to
// dw (n_embd, in_cols) and db (n_embd). in_cols is n_embd (Medusa: x = h) or 2·n_embd (mtp:
// x = [h; e]). The residual path carries no parameters, so it adds nothing to them:
//   dlogits = p − target, dz = dlogits · E' (+ the regression's 2·hidden_weight/n_embd·(z −
//   hidden)), du = dz ⊙ SiLU'(u), dW = duᵀ x, db = Σ_rows du.
// With dx_h, also writes dloss/dx[:, :n_embd] = dz + du · W[:, :n_embd] of the first dx_rows rows
// into dx_h (dx_rows, n_embd): what an mtp head's taps fusion, which makes those columns, needs.
double head_loss_and_grad(const float* w, const float* b, const Shortlist& shortlist,
                          const float* x, int64_t in_cols, int64_t m, const HeadTargets& targets,
                          float* dw, float* db, kernels::ThreadPool& pool, HeadLossScratch& scratch,
                          float* dx_h = nullptr, int64_t dx_rows = 0);

}  // namespace tokenfab
