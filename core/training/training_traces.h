#pragma once
// Head training's first phase, internal to core/training: the target's traces of a request's data
// — the greedy continuations of its prompts, sampled passes over them, the same for the prompts
// the target writes itself, and the user's corpus — each part cached on its own
// (training_traces.cpp), for run_head_training (head_training_job.cpp).

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "core/model/llama_model.h"
#include "core/tokenizer/tokenizer.h"
#include "core/training/head_training_job.h"
#include "core/training/trace_recorder.h"

namespace tokenfab {

inline constexpr double kTracingShare = 0.3;  // tracing's part of a run's overall fraction

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct Traces {
  TraceSet set;
  bool cached = false;
  double seconds = 0.0;
  std::string source;
  int64_t written_prompts = 0;  // kept of those the target wrote (request.self_prompts)
};

// The request's data → traces. The data come in parts — the greedy continuations of the prompts,
// each sampled pass over them, the same for the prompts the target wrote, the corpus — and each
// part is cached on its own under a key of the model, its data and its options, so that adding
// sampled passes, written prompts or files to a run traced before records only what is new.
Traces trace_data(const LlamaModel& model, const Tokenizer& tokenizer, const HeadTrainingRequest& r,
                  const std::string& sha,
                  const std::function<bool(const HeadTrainingProgress&)>& progress);

}  // namespace tokenfab
