#pragma once
// One request through the Engine with its text streamed as it is generated: what `generate` and
// `chat` run, in every mode (one device, several colocated, or disaggregated prefill/decode).

#include <atomic>
#include <memory>
#include <optional>
#include <vector>

#include "core/runtime/generator.h"
#include "core/serving/engine.h"
#include "core/tokenizer/tokenizer.h"

namespace tokenfab::cli {

// Submits `prompt`, streams text through `on_text` (when set) until the request ends, and
// returns its figures (ids exclude an end-of-generation token; stop_reason "eog", "length" or
// "cancelled"). Setting *cancel stops it. Throws Error when the engine rejects or fails it.
// Speculative decoding: the head (nullptr: none) and its draft length; after the call, the
// decode steps run and the mean tokens each emitted (ACCEPT/STEP, the bonus token included).
struct Speculation {
  std::shared_ptr<const DraftHead> head;
  std::vector<HeadCandidate> candidates;  // auto selection: heads it may switch to
  int32_t draft_len = 4;
  bool adaptive_draft = false;      // chain: each step's length chosen (draft_length.h)
  std::vector<int32_t> tree_shape;  // empty: a chain
  int32_t tree_nodes = 0;           // tree: > 0 a dynamic tree (GenerationRequest::tree_nodes)
  int32_t lookup = 0;               // > 0: context lookup drafts (GenerationRequest::lookup)
  int64_t steps = 0;
  std::optional<double> accept_per_step;
  int64_t verify_steps = 0;  // steps that verified drafts, the time proposing them and their own
  double draft_s = 0.0, verify_s = 0.0;
  std::vector<SpeculationStats::HeadSwitch> switches;  // made mid-generation
  std::vector<int64_t> length_steps;  // adaptive chains: proposals per draft length
};

GenerateResult generate_with_engine(Engine& engine, const Tokenizer& tokenizer,
                                    std::vector<TokenId> prompt, const GenerateOptions& options,
                                    const TextCallback& on_text,
                                    const std::atomic<bool>* cancel = nullptr,
                                    Speculation* speculation = nullptr);

}  // namespace tokenfab::cli
