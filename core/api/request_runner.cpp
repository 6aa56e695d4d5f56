#include "core/api/request_runner.h"

#include <chrono>

#include "core/api/stop_text.h"
#include "core/common/error.h"
#include "core/serving/request_events.h"

namespace tokenfab::api {

RunResult run_request(Engine& engine, const Tokenizer& tokenizer, GenerationRequest request,
                      const std::vector<std::string>& stop, const PieceSink& on_piece,
                      const std::function<bool()>& alive) {
  const bool stop_at_eog = request.stop_at_end_of_generation;
  const bool with_logprobs = request.logprobs >= 0;
  RequestEvents events(engine, std::move(request));  // this request's events only
  const RequestId id = events.id();

  IncrementalDetokenizer detok(tokenizer);
  StopText stop_text(stop);
  RunResult result;
  bool cancel_sent = false;
  size_t logprobs_sent = 0;  // entries of result.logprobs already handed to on_piece
  auto send = [&](const std::string& text) {
    if (text.empty() || result.client_gone) return;
    result.text += text;
    const std::span<const LogprobEntry> entries =
        std::span<const LogprobEntry>(result.logprobs).subspan(logprobs_sent);
    logprobs_sent = result.logprobs.size();
    if (on_piece && !on_piece(text, entries)) result.client_gone = true;
  };
  for (bool ended = false; !ended;) {
    for (const TokenEvent& e : events.take(std::chrono::milliseconds(50))) {
      for (size_t i = 0; i < e.tokens.size(); ++i) {
        const TokenId t = e.tokens[i];
        if (stop_text.stopped()) break;
        // End-of-generation tokens have no text, also when the request ignores them (ignore_eos).
        if (tokenizer.is_end_of_generation(t)) continue;
        if (with_logprobs && i < e.logprobs.size()) {
          const TokenLogprob& lp = e.logprobs[i];
          LogprobEntry entry{tokenizer.token_bytes(t), lp.logprob, {}};
          for (const auto& [alt, logprob] : lp.top)
            entry.top.emplace_back(tokenizer.token_bytes(alt), logprob);
          result.logprobs.push_back(std::move(entry));
        }
        send(stop_text.push(detok.push(t)));
      }
      ended = ended || request_ended(e.state);
    }
    if (!ended && !result.client_gone && alive && !alive()) result.client_gone = true;
    if (!ended && !cancel_sent && (stop_text.stopped() || result.client_gone))
      cancel_sent = engine.cancel(
          id, stop_text.stopped() ? Engine::CancelReason::kStopText : Engine::CancelReason::kAbort);
  }
  if (!stop_text.stopped()) send(stop_text.push(detok.flush()));
  send(stop_text.flush());
  // Tokens whose text never completed a piece (a lone byte at the end) still report theirs.
  if (on_piece && !result.client_gone && logprobs_sent < result.logprobs.size())
    on_piece("", std::span<const LogprobEntry>(result.logprobs).subspan(logprobs_sent));

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
  for (const SpeculationStats::HeadSwitch& h : info.speculation.switches)
    result.figures.switches.push_back({h.at_token, h.from, h.to});
  return result;
}

}  // namespace tokenfab::api
