#pragma once
// Evaluation of draft speculation by really generating, shared by `tokenfab-cli heads eval` and
// the desktop app's Draft heads page. Each prompt (a user turn, formatted with the model's chat
// template) is generated greedily twice on the same target, without drafts and with them; the two
// outputs must agree token for token (speculation is lossless) and the decode figures of each side
// are summed (DecodeTotals).
//
// The quantization study: with a target quantization other than "native" the target is a copy of
// the model re-quantized in memory (LlamaModel::requantize), and the model's own speed without
// drafts is measured as well, prompt by prompt, so that a cheaper target which loses more to
// rejected drafts than it gains in bandwidth shows as a net speedup below 1.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/model/llama_model.h"
#include "core/serving/engine.h"
#include "core/storage/records.h"
#include "core/tokenizer/tokenizer.h"
#include "core/training/head_training_job.h"

namespace tokenfab {

struct GenerationEvalRequest {
  std::shared_ptr<const DraftHead> head;  // null: the context lookup alone (lookup > 0)
  std::vector<std::string> prompts;       // user turns
  int32_t max_tokens = 128;
  int32_t draft_len = 4;            // chain: always this many drafts (at most the head's K)
  std::vector<int32_t> tree_shape;  // empty: a chain
  int32_t tree_nodes = 0;           // tree, mtp heads: a dynamic tree of this many nodes
  int32_t lookup = 0;               // context lookup drafts (greedy), with or without a head
  // chain: each step's length chosen as generate chooses it (draft_length.h), up to draft_len,
  // instead of always draft_len
  bool adaptive = false;
  std::string target_quant = "native";  // native | f16 | q8_0 | q4_1 | q4_0
  EngineConfig config;
};

struct GenerationEvalProgress {
  std::string phase;             // "quantizing" (the target copy) | "generating"
  int64_t done = 0, total = 0;   // prompts
  double accept_per_step = 1.0;  // so far
  double eta_s = 0.0;            // of the prompts left
};

struct GenerationEvalResult {
  DecodeTotals with, without;          // the evaluated target with drafts and without
  std::optional<DecodeTotals> native;  // target_quant runs: the model's own, without drafts
  bool lossless = true;                // every output with drafts equalled the one without
  int64_t prompts = 0;
  // with / without decode tok/s; with / native for target_quant runs (0 when unmeasured).
  double speedup() const;
  double net_speedup_vs_native() const;
};

// The target quantizations `heads eval --target-quant` and the app accept, in the order shown.
const std::vector<std::string>& target_quant_names();
// Throws Error "--target-quant X: expected native, f16, q8_0, q4_1 or q4_0" for another name.
void check_target_quant(const std::string& name);

// Runs the evaluation on the calling thread. `progress` is called before the first prompt and
// after each; returning false cancels: the call throws Error("evaluation cancelled; nothing was
// recorded"). Throws Error for an unknown target quantization, an empty prompt list, or a prompt
// that failed (naming it). A lossy run is returned with lossless = false for the caller to refuse.
GenerationEvalResult evaluate_by_generating(
    const LlamaModel& model, const Tokenizer& tokenizer, const GenerationEvalRequest& request,
    const std::function<bool(const GenerationEvalProgress&)>& progress);

// The registry row of a run: spec, figures, target quantization, counts. head_id and domain are
// the caller's to fill.
EvaluationRecord evaluation_record(const GenerationEvalRequest& request,
                                   const GenerationEvalResult& result);

}  // namespace tokenfab
