#pragma once
// GET /metrics: the engine's own counters in Prometheus' text exposition format (0.0.4), named
// after vLLM's so that a vLLM dashboard works with the prefix `vllm:` changed to `tokenfab:`.
// Every figure comes from the engine (its snapshot and its live counters), the same ones the
// Live page and the KV inspector draw; nothing is computed here but unit changes.
//
//   gauges      tokenfab:num_requests_running / _waiting {device}, tokenfab:kv_cache_usage_perc
//               {device} (owned blocks ÷ blocks, 0–1), tokenfab:kv_cache_blocks {device,state},
//               tokenfab:api_requests_in_flight
//   counters    tokenfab:prompt_tokens_total, tokenfab:generation_tokens_total,
//               tokenfab:request_success_total {finished_reason=stop|length|abort},
//               tokenfab:request_failure_total, tokenfab:num_preemptions_total,
//               tokenfab:prefix_cache_queries_total / _hits_total (tokens),
//               tokenfab:kv_transfers_total, tokenfab:kv_transfer_bytes_total,
//               tokenfab:kv_transfer_seconds_total,
//               tokenfab:spec_decode_num_drafts_total {head}, …_num_draft_tokens_total {head},
//               …_num_accepted_tokens_total {head}, …_num_accepted_tokens_per_pos_total
//               {head,position}
//   histograms  tokenfab:time_to_first_token_seconds, tokenfab:inter_token_latency_seconds,
//               tokenfab:e2e_request_latency_seconds
// Every sample carries model_name, as vLLM's do.

#include <string>

#include "core/metrics/live_counters.h"
#include "core/serving/engine.h"

namespace tokenfab::api {

struct MetricsInput {
  std::string model_name;
  const EngineSnapshot* snapshot = nullptr;  // null: no engine yet (the model loads)
  const LiveCounters* counters = nullptr;    // null with the snapshot
  int api_in_flight = 0;
};

std::string prometheus_text(const MetricsInput& in);

// A label value escaped as the text format wants (backslash, double quote, newline).
std::string escape_label_value(const std::string& value);

}  // namespace tokenfab::api
