#pragma once
// One draft-head training run, shared by `tokenfab-cli heads train` and the desktop app's Draft
// heads page: training data → traces (cached in the user data directory) → train_head → the
// head's GGUF file → a row in the registry. A cancelled or failed run leaves no head file and no
// head row; its row in training_runs (core/storage/training_runs.h), added at the start, says how
// it ended (a run whose process was killed: "cancelled" at the next open).

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/model/llama_model.h"
#include "core/serving/engine.h"
#include "core/tokenizer/tokenizer.h"

namespace tokenfab {

struct HeadTrainingRequest {
  std::string name, domain;
  // At least one of: a built-in domain's train split, "all", or a built-in prompt set …
  std::optional<std::string> prompt_set;
  // … and/or the user's files and folders (text, code, JSONL with "text"/"prompt" fields).
  std::vector<std::string> corpus;
  // Prompt sets: besides the greedy continuation of each prompt, this many sampled ones (seeds
  // seed + 1 …) at sample_temperature with the app's default top-k/top-p/min-p filters.
  int samples = 0;
  float sample_temperature = 0.8f;
  // Prompt sets: this many more requests written by the target itself (prompt_writer.h), each
  // opened with the first words of a prompt of the set; their continuations are traced like the
  // set's own (greedy, and the sampled passes too). Fewer are kept when some are unfinished or
  // repeat.
  int self_prompts = 0;
  // The defaults are the recipe measured best per minute of training (README, "Draft heads").
  std::string type = "mtp";
  int heads = 4;
  int steps = 2000;
  int continuation = 192;  // tokens the target writes per prompt
  int max_prompts = 0;     // 0: all
  int batch = 256;
  float lr = 3e-3f;
  int rollout = -1;  // mtp: rows per position continuing from its own predictions; −1: heads − 1
  // mtp: the first step also reads the target's inner layers (draft_tap_layers; draft_head.h).
  // On by default since the CUDA device's taps were checked on a GPU (test_cuda_model): such a
  // head drafts on either backend. Medusa heads have no taps: set it false for them.
  bool taps = true;
  uint64_t seed = 0;
  int threads = 0;  // 0: all hardware threads
  bool no_cache = false;
};

struct HeadTrainingProgress {
  std::string phase;      // "tracing" | "training" | "saving"
  double fraction = 0.0;  // of the whole run, 0..1 (tracing is the first 30 %)
  int32_t step = 0, steps = 0;
  double loss = 0.0;
  std::optional<double> val_loss;             // on evaluation steps
  std::vector<double> val_top1;               // per head, on evaluation steps
  std::optional<double> sim_accept_per_step;  // simulated ACCEPT/STEP, on evaluation steps
  double positions_per_s = 0.0;
  double eta_s = 0.0;   // of the current phase
  std::string message;  // a line for a log (cache hits, evaluation steps), or empty
};

struct HeadTrainingResult {
  int64_t head_id = 0;
  std::string file;
  nlohmann::json report;  // the summary, the head id, name, domain, file, type, heads, seconds
};

// The evaluations of a training run, kept in the head's summary as "curve" (column arrays of
// equal length): at each evaluation step, the mean training loss of the steps since the previous
// evaluation (at step 0, where no step has run, the untrained head's validation loss, as the
// trainer reports it), the validation loss and the simulated ACCEPT/STEP. Heads trained before
// curves were kept have none.
struct TrainingCurve {
  std::vector<int32_t> step;
  std::vector<double> train_loss, val_loss, accept;

  bool empty() const { return step.empty(); }
  size_t size() const { return step.size(); }
  nlohmann::json to_json() const;
  // The "curve" of a summary JSON text; empty when the text has none, is not JSON or holds a
  // curve of the wrong shape (a summary is shown, never trusted to be well formed).
  static TrainingCurve from_summary(const std::string& summary_json);
};

// Throws Error for a bad request (all-digit or empty name, both or neither of prompt_set /
// corpus, heads outside 1..16, rollout outside −1..16, type not medusa or mtp, taps on a
// medusa head, self_prompts outside 0..20000 or without a prompt set);
// run_head_training checks it too.
void validate_head_training(const HeadTrainingRequest& request);

// What a set of generated requests measured for speculation: decode steps, the tokens they
// emitted (ACCEPT/STEP) and decode speed (output tokens after the first, over decode time).
struct DecodeTotals {
  int64_t decode_tokens = 0, steps = 0, tokens = 0;
  double decode_s = 0;
  std::vector<int64_t> proposed_at, accepted_at;  // per draft position, summed over requests
  // Steps that verified drafts, the time spent proposing those drafts and the steps' own time
  // (SpeculationStats), summed over requests.
  int64_t verify_steps = 0;
  double draft_s = 0, verify_s = 0;
  std::vector<int64_t> length_steps;  // adaptive chains: steps by draft length (SpeculationStats)
  void add(const RequestInfo& info);
  // Per draft position: accepted / proposed (0 where nothing was proposed).
  std::vector<double> per_position() const;
  double tok_s() const {
    return decode_s > 0 ? static_cast<double>(decode_tokens) / decode_s : 0.0;
  }
  double accept_per_step() const {
    return steps ? static_cast<double>(decode_tokens) / static_cast<double>(steps) : 1.0;
  }
  // Decode time per step (0 without steps).
  double step_ms() const { return steps ? decode_s * 1e3 / static_cast<double>(steps) : 0.0; }
  // Per verifying step: proposing its drafts, and the step itself (0 without such steps).
  double draft_ms_per_step() const {
    return verify_steps ? draft_s * 1e3 / static_cast<double>(verify_steps) : 0.0;
  }
  double verify_ms_per_step() const {
    return verify_steps ? verify_s * 1e3 / static_cast<double>(verify_steps) : 0.0;
  }
};

// The model file's sha256, lowercase hex (computed once per process and path).
std::string model_file_sha256(const LlamaModel& model);

// Prompts of a named set: a built-in domain's `split`, "all" (every domain's split, taken round
// robin so that any first N hold the domains evenly), or a built-in prompt set. Throws Error
// for an unknown name.
std::vector<std::string> named_prompts(const std::string& name, const std::string& split);

// Runs the whole job on the calling thread. `progress` may return false to cancel: the call then
// throws Error("… cancelled …; no head was saved"). Throws Error for a bad request (a taken or
// all-digit name, both or neither of prompt_set / corpus, heads outside 1..16, rollout outside
// −1..16, type not medusa or mtp).
HeadTrainingResult run_head_training(
    const LlamaModel& model, const Tokenizer& tokenizer, const HeadTrainingRequest& request,
    const std::function<bool(const HeadTrainingProgress&)>& progress);

}  // namespace tokenfab
