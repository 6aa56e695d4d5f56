#pragma once
// Request: what a client asks for. SequenceState: the scheduler's record of one request as it
// moves waiting → running → finished (or back to waiting when preempted). One request is one
// sequence, so a request id is also the sequence id used by the KV cache.

#include <cstdint>
#include <string>
#include <vector>

#include "core/kvcache/block_pool.h"

namespace tokenfab {

using RequestId = SequenceId;

struct Request {
  RequestId id = 0;
  std::vector<TokenId> prompt;  // (n_prompt), ≥ 1 token
  int32_t max_tokens = 0;       // tokens to generate, ≥ 1
  bool stop_at_end_of_generation = true;  // false: always max_tokens (benchmarks)
};

enum class SequenceStatus : uint8_t {
  kWaiting,    // queued, never admitted; holds no blocks
  kRunning,    // admitted; its table holds a KV slot for every token in `tokens`
  kPreempted,  // back in the waiting queue with its tokens so far; holds no blocks, recomputed
  kFinished,   // max_tokens reached or an end-of-generation token sampled; blocks freed
  kFailed,     // cannot ever fit the pool; `error` says why; blocks freed
  kReceiving,  // disaggregated decode side: blocks reserved, its prompt's KV arriving from the
               // prefill device (Scheduler::receive → adopt); not scheduled until adopted
};

const char* sequence_status_name(SequenceStatus status);

struct SequenceState {
  RequestId id = 0;
  std::vector<TokenId> tokens;  // (n_prompt + n_generated): the prompt, then sampled tokens
  int32_t n_prompt = 0;
  // Leading tokens whose KV is in the pool (computed, or reused from the prefix cache).
  // tokens.size() - n_computed tokens are pending; the last of them yields the next token.
  int32_t n_computed = 0;
  int32_t n_generated = 0;
  int32_t max_tokens = 0;
  bool stop_at_end_of_generation = true;
  SequenceStatus status = SequenceStatus::kWaiting;
  int32_t n_preemptions = 0;
  std::string error;  // set when status == kFailed
  // Speculative decoding: tokens a draft head proposed to follow the last token (set_draft), and
  // how many of them the planned step appended to `tokens` for verification (0 otherwise).
  std::vector<TokenId> draft;
  // A draft tree: draft_parent[i] is the draft token that draft[i] follows (−1: the last token;
  // parents come first). Empty for a chain (each draft follows the one before).
  std::vector<int32_t> draft_parent;
  int32_t n_draft_in_flight = 0;

  int32_t n_tokens() const { return static_cast<int32_t>(tokens.size()); }
  int32_t n_pending() const { return n_tokens() - n_computed; }
  bool done() const {
    return status == SequenceStatus::kFinished || status == SequenceStatus::kFailed;
  }
};

}  // namespace tokenfab
