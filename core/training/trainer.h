#pragma once
// Trains a draft head by self-distillation on a TraceSet (trace.h). Medusa: head k at position i
// learns the target's own prediction pred[i + k]. mtp: the block learns, from [h_i; e(pred_i)],
// the next prediction pred[i + 1] and (regression, hidden_weight) the next hidden state h[i + 1];
// each mini-batch also holds, per position, up to `rollout` rows that continue from the block's
// own predicted hidden states (see gather_mtp_batch in trainer.cpp), as inference does from step 2
// on. The default trains every step a K-draft chain takes (K − 1 rollout rows): with one rollout
// row only, steps 3 and 4 met hidden states twice and three times predicted that no row had taught
// (code domain, SmolLM2-135M: their held-out top-1 rose from 0.20 / 0.13 to 0.33 / 0.31).
//
// Optimiser: AdamW (β 0.9 / 0.999, eps 1e-8, decoupled weight decay on W only), linear warmup over
// `warmup · steps` steps, then cosine decay to 10 % of lr; gradients clipped to a global norm of
// `clip` over all heads. Mini-batches of `batch` positions are drawn from the training split
// without replacement (a fresh permutation each epoch). The loss of a step is the mean over heads
// of each head's mean loss over the positions that have its label.
//
// The Medusa training loss uses a SHORTLIST softmax (head_loss.h): V' = every label and top-k id
// of the training split; an mtp head's softmax is over its draft vocabulary (draft_vocabulary()),
// as in inference. Medusa evaluation uses the FULL LM head through the inference kernel
// (TransformerPass::lm_head): validation loss is the full-vocabulary cross-entropy against the
// labels, top-1 and simulated ACCEPT/STEP use the full-vocabulary argmax, as inference does.
// Evaluations run at step 0 (the untrained head), every `eval_every` steps and at the end, on at
// most kMaxEvalPositions validation positions (evenly spaced). With early stopping the head
// returned is the one of the best evaluation (lowest validation loss), not the last; it stops
// only in the second half of the steps, once the learning rate has decayed.

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "core/model/llama_model.h"
#include "core/speculative/draft_head.h"
#include "core/training/trace.h"

namespace tokenfab {

struct TrainOptions {
  int32_t steps = 2000;
  int32_t batch = 256;  // positions per mini-batch
  float lr = 3e-3f, weight_decay = 0.0f, warmup = 0.05f /* fraction of steps */, clip = 1.0f;
  float kl_weight = 0.0f;      // 0: CE against the pred labels; in (0, 1]: mixes in KL to the top-k
  float hidden_weight = 1.0f;  // mtp: weight of the next-hidden-state regression (head_loss.h)
  // mtp: rows per position that continue from the block's own predictions; −1: K − 1.
  int32_t rollout = -1;
  float validation = 0.1f;  // fraction of sequences held out, in (0, 1); at least one each side
  // Evaluations without improvement before stopping, counted in the second half of the steps
  // only; 0: never stop early.
  int32_t patience = 5;
  int32_t eval_every = 50;
  int threads = 0;  // 0: all hardware threads
  uint64_t seed = 0;
  // Throws Error naming the option when out of range.
  void validate() const;
};

struct TrainProgress {
  int32_t step = 0, steps = 0;
  double loss = 0.0;                                // this step's training loss (shortlist softmax)
  std::optional<double> val_loss;                   // set on evaluation steps (full vocabulary)
  std::vector<double> val_top1;                     // per head, on evaluation steps
  std::optional<double> simulated_accept_per_step;  // on evaluation steps
  double positions_per_s = 0.0;  // training positions per second so far (evaluations excluded)
  double eta_s = 0.0;
};

struct TrainResult {
  DraftHead head;  // the best evaluated weights
  int32_t steps_run = 0;
  double initial_val_loss = 0.0;  // the untrained head's (step 0) …
  double initial_accept_per_step = 0.0;
  double final_val_loss = 0.0;  // … and the returned head's
  std::vector<double> val_top1;
  double simulated_accept_per_step = 0.0;
  bool stopped_early = false;
  bool cancelled = false;
  double seconds = 0.0;
  double positions_per_s = 0.0;  // training positions per second (evaluations excluded)
  int64_t shortlist_size = 0;
  int64_t train_positions = 0, val_positions = 0;  // val_positions: as evaluated (capped)
};

inline constexpr int64_t kMaxEvalPositions = 1000;

// Trains `head` (starting from its weights) on `traces`. `progress` is called after every step;
// returning false cancels: the result then holds the best head evaluated so far and
// cancelled = true. The call at step 0 reports the untrained head's evaluation (its `loss` is the
// validation loss, as no training step has run). Throws Error when the head, the traces and the
// model do not fit together, when there are fewer than two sequences or no labelled positions.
TrainResult train_head(const LlamaModel& target, DraftHead head, const TraceSet& traces,
                       const TrainOptions& options,
                       const std::function<bool(const TrainProgress&)>& progress);

// The draft vocabulary of an mtp head trained on `traces` with `options`: every pred id of the
// sequences on the training side of the split train_head will make, and with kl_weight > 0 every
// top-k id there too (sorted, unique). Code traces of SmolLM2-135M: 3,258 pred ids against 10,718
// with the top-8, covering about 96 % and 99.5 % of the held-out sequences' preds; the code head of
// 600 steps trained in 89 s instead of 219 s and accepted as much on the held-out prompts (a chain
// of 4: 1.750 tokens per step against 1.734).
std::vector<TokenId> draft_vocabulary(const TraceSet& traces, const TrainOptions& options);

// Simulated ACCEPT/STEP of the chain of all K heads: for each of `positions` whose K labels are
// inside its sequence (others are skipped), the heads' full-vocabulary top-1 tokens are accepted
// while they equal pred[i+1..i+K] in order; the result is mean(1 + accepted) (the target's own
// token is always emitted). 1.0 when no position qualifies. Uses all hardware threads.
double simulated_accept_per_step(const LlamaModel& target, const DraftHead& head,
                                 const TraceSet& traces, std::span<const int64_t> positions);

}  // namespace tokenfab
