#pragma once
// Router: picks the worker for each step of a request's way through the engine.
//   prompt → prefill worker: the one with the fewest queued prefill tokens (colocated: among all
//            workers). Disaggregated extras, in this order:
//            - a decode worker whose prefix cache already holds at least 3/4 of the prompt and
//              all but at most decode_side_prefill_tokens of it (a follow-up turn) prefills it
//              itself;
//            - prompts longer than long_prompt_tokens go to the long-prompt pool, if any.
//   prefilled prompt → decode worker: the one with the most free KV blocks.
// It reads only what workers publish (atomics, the last published prefix view).

#include <cstdint>
#include <span>
#include <vector>

#include "core/kvcache/block_pool.h"

namespace tokenfab {

class Worker;

class Router {
 public:
  Router(std::vector<Worker*> prefill, std::vector<Worker*> long_prefill,
         std::vector<Worker*> decode, int32_t long_prompt_tokens,
         int32_t decode_side_prefill_tokens);

  Worker& route_prompt(std::span<const TokenId> prompt) const;
  Worker& route_decode() const;

 private:
  static Worker& least_loaded(const std::vector<Worker*>& workers);

  std::vector<Worker*> prefill_, long_prefill_, decode_;
  int32_t long_prompt_tokens_;
  int32_t decode_side_prefill_tokens_;
};

}  // namespace tokenfab
