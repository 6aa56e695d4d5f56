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
  std::string target_quant = "native";  // one of target_quant_names()
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

// The target quantizations `heads eval --target-quant` and the app accept, in the order shown
// (the file's own first, then richest to cheapest): native, f16, q8_0, q6_k, q5_1, q5_k_m, q5_k_s,
// q5_0, q4_1, q4_k_m, iq4_nl, q4_k_s, q4_0, iq4_xs, q3_k_l, q3_k_m, q3_k_s, q2_k. f16 and the
// 32-element block types (q8_0, q5_1, q5_0, q4_1, iq4_nl, q4_0) put every matrix, the LM head
// included, in that one type; the K-quant names and iq4_xs are llama-quantize's mixtures of those
// names (core/model/quant_mix.h: Q4_K_M's Q6_K LM head and richer attn_v/ffn_down layers, the
// fallbacks where 256 does not divide a row), as the files people download hold them.
const std::vector<std::string>& target_quant_names();
// "native, f16, …, q3_k_s or q2_k".
std::string target_quant_names_text();
// Throws Error "--target-quant X: expected native, f16, … or q2_k (…)" for another name.
void check_target_quant(const std::string& name);
// Re-quantizes `model` in memory to the target `name` (nothing for "native"), rows over `threads`
// (0: all hardware threads). Throws Error as check_target_quant does.
void requantize_target(LlamaModel& model, const std::string& name, int threads = 0);

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
