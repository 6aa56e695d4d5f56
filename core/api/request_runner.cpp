#include "core/api/request_runner.h"

#include <chrono>

#include "core/api/stop_text.h"
#include "core/common/error.h"
#include "core/serving/request_events.h"

namespace tokenfab::api {

RunResult run_request(Engine& engine, const Tokenizer& tokenizer, GenerationRequest request,
                      const std::vector<std::string>& stop, const PieceSink& on_piece,
                      const std::function<bool()>& alive) {
  RequestEvents events(engine);  // before submit(): no event of the request is missed

  const bool stop_at_eog = request.stop_at_end_of_generation;
  const RequestId id = engine.submit(std::move(request));

  IncrementalDetokenizer detok(tokenizer);
  StopText stop_text(stop);
  RunResult result;
  bool cancel_sent = false;
  auto send = [&](const std::string& text) {
    if (text.empty() || result.client_gone) return;
    result.text += text;
    if (on_piece && !on_piece(text)) result.client_gone = true;
  };
  for (bool ended = false; !ended;) {
    for (const TokenEvent& e : events.take(id, std::chrono::milliseconds(50))) {
      for (const TokenId t : e.tokens) {
        if (stop_text.stopped()) break;
        if (stop_at_eog && tokenizer.is_end_of_generation(t)) continue;
        send(stop_text.push(detok.push(t)));
      }
      ended = ended || request_ended(e.state);
    }
    if (!ended && !result.client_gone && alive && !alive()) result.client_gone = true;
    if (!ended && !cancel_sent && (stop_text.stopped() || result.client_gone))
      cancel_sent = engine.cancel(id);
  }
  if (!stop_text.stopped()) send(stop_text.push(detok.flush()));
  send(stop_text.flush());

  const RequestInfo info = engine.request(id);
  if (info.state == RequestState::kFailed) throw Error(info.error);
  result.usage.prompt_tokens = info.n_prompt;
  result.usage.completion_tokens = static_cast<int64_t>(info.output.size());
  const bool eog =
      !info.output.empty() && stop_at_eog && tokenizer.is_end_of_generation(info.output.back());
  result.finish_reason = stop_text.stopped() || eog ? "stop" : "length";
  if (info.metrics) {
    if (info.metrics->ttft_s) result.figures.ttft_ms = *info.metrics->ttft_s * 1e3;
    if (info.metrics->tpot_s && *info.metrics->tpot_s > 0)
      result.figures.decode_tok_s = 1.0 / *info.metrics->tpot_s;
    if (!info.head.empty() || !info.speculation.proposed_at.empty())
      result.figures.accept_per_step = info.metrics->accept_per_step();
  }
  result.figures.head = info.head;
  return result;
}

}  // namespace tokenfab::api
