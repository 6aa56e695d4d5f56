#include "engine_generation.h"

#include <chrono>

#include "core/common/error.h"
#include "core/serving/request_events.h"

namespace tokenfab::cli {

GenerateResult generate_with_engine(Engine& engine, const Tokenizer& tokenizer,
                                    std::vector<TokenId> prompt, const GenerateOptions& options,
                                    const TextCallback& on_text, const std::atomic<bool>* cancel,
                                    Speculation* speculation) {
  GenerationRequest request;
  request.prompt = std::move(prompt);
  request.max_tokens = options.max_tokens;
  request.sampling = options.sampling;
  request.stop_at_end_of_generation = options.stop_at_end_of_generation;
  if (speculation) {
    request.head = speculation->head;
    request.head_candidates = speculation->candidates;
    request.draft_len = speculation->draft_len;
    request.adaptive_draft = speculation->adaptive_draft;
    request.tree_shape = speculation->tree_shape;
    request.tree_nodes = speculation->tree_nodes;
    request.lookup = speculation->lookup;
  }
  RequestEvents events(engine, std::move(request));  // this request's events only
  const RequestId id = events.id();

  IncrementalDetokenizer detok(tokenizer);
  GenerateResult result;
  bool cancel_sent = false;
  for (bool ended = false; !ended;) {
    for (const TokenEvent& e : events.take(std::chrono::milliseconds(20))) {
      for (const TokenId t : e.tokens) {
        if (options.stop_at_end_of_generation && tokenizer.is_end_of_generation(t)) continue;
        result.ids.push_back(t);
        const std::string piece = detok.push(t);
        result.text += piece;
        if (on_text && !piece.empty()) on_text(piece);
      }
      ended = ended || request_ended(e.state);
    }
    if (!ended && !cancel_sent && cancel && cancel->load()) cancel_sent = engine.cancel(id);
  }
  const std::string tail = detok.flush();
  result.text += tail;
  if (on_text && !tail.empty()) on_text(tail);

  const RequestInfo info = engine.request(id);
  if (info.state == RequestState::kFailed) throw Error(info.error);
  result.prompt_tokens = info.n_prompt;
  result.prefilled_tokens = info.n_prompt - info.cached_prompt_tokens;
  result.output_tokens = static_cast<int64_t>(info.output.size());
  if (info.state == RequestState::kCancelled) {
    result.stop_reason = "cancelled";
  } else if (!info.output.empty() && options.stop_at_end_of_generation &&
             tokenizer.is_end_of_generation(info.output.back())) {
    result.stop_reason = "eog";
  } else {
    result.stop_reason = "length";
  }
  if (speculation && info.metrics) {
    speculation->steps = static_cast<int64_t>(info.metrics->tokens_per_step.size());
    speculation->accept_per_step = info.metrics->accept_per_step();
    speculation->switches = info.speculation.switches;
    speculation->length_steps = info.speculation.length_steps;
    speculation->verify_steps = info.speculation.verify_steps;
    speculation->draft_s = info.speculation.draft_s;
    speculation->verify_s = info.speculation.verify_s;
  }
  if (info.metrics && info.metrics->ttft_s) {
    result.ttft_ms = *info.metrics->ttft_s * 1e3;
    if (info.metrics->tpot_s && *info.metrics->tpot_s > 0)
      result.decode_tok_s = 1.0 / *info.metrics->tpot_s;
  }
  // Prefill speed: the prompt tokens computed, over the time from the first prefill step to the
  // first token.
  const auto& prefilling = info.entered[static_cast<size_t>(RequestState::kPrefilling)];
  if (prefilling && info.metrics && info.metrics->ttft_s) {
    const double prefill_s =
        *info.metrics->ttft_s -
        seconds_between(*info.entered[static_cast<size_t>(RequestState::kQueued)], *prefilling);
    if (prefill_s > 0)
      result.prefill_tok_s = static_cast<double>(result.prefilled_tokens) / prefill_s;
  }
  return result;
}

}  // namespace tokenfab::cli
