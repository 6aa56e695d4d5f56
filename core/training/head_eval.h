#pragma once
// Evaluation of a draft head on traced positions as inference would run it, so top-1 and
// simulated ACCEPT/STEP are what inference would see. Medusa: full vocabulary, through the
// inference LM head (TransformerPass::lm_head: the same kernel and activation quantization as
// decoding). mtp: the K chained steps over the head's draft vocabulary (draft_head.h); its loss
// leaves out labels outside that vocabulary, which count as misses in top-1.

#include <cstdint>
#include <span>
#include <vector>

#include "core/model/transformer_pass.h"
#include "core/speculative/draft_head.h"
#include "core/training/trace.h"

namespace tokenfab {

struct HeadEvaluation {
  double loss = 0.0;         // mean over heads (steps) of the mean CE against the labels
  std::vector<double> top1;  // per head (step): fraction of labelled positions whose argmax is
                             // the label
  double accept_per_step = 1.0;   // mean(1 + accepted) over positions with all K labels
  int64_t n_positions = 0;        // positions evaluated
  int64_t n_chain_positions = 0;  // of which with all K labels (the accept mean's support)
};

// `ends` = traces.sequence_ends(). Positions without any label count for nothing.
HeadEvaluation evaluate_head(TransformerPass& pass, const DraftHead& head, const TraceSet& traces,
                             std::span<const int64_t> ends, std::span<const int64_t> positions);

}  // namespace tokenfab
