#pragma once
// Which tokens one KV block holds, as far as an EngineSnapshot can tell. A BlockRecord knows its
// owners, token count and (for prefix-cached blocks) its hash-chain value, not its position in a
// sequence; a RequestInfo knows a live request's prompt length and output tokens, not its prompt
// tokens. So a block's tokens are known exactly when they are output tokens of a live owner and
// the position can be established:
//   - a registered (hashed, full) block: position i is accepted only when
//     PrefixCache::hash_block(hash of another block of that request, output tokens of block i)
//     equals the block's hash — the hash chain proves both position and content;
//   - a partially filled block: a sequence fills its blocks in order, so its one partial block is
//     its tail, at index (blocks of the request holding tokens on this device) − 1.
// Anything else (prompt tokens, cached blocks, holds kept while KV is sent) is reported as not
// available, with the reason.

#include <QString>
#include <optional>
#include <vector>

#include "core/serving/engine.h"

namespace tokenfab::ui {

struct BlockTokens {
  std::optional<RequestId> request;  // the owner whose tokens these are
  // In that request's sequence (prompt + output); -1 when the same tokens occur at several
  // block positions of the output (repetitive text) and the hash chain cannot tell which.
  int32_t first_position = 0;
  std::vector<TokenId> tokens;  // empty when not available
  QString unavailable;          // why, when tokens is empty
};

BlockTokens block_tokens(const KvSnapshot& kv, BlockId block,
                         const std::vector<RequestInfo>& requests);

}  // namespace tokenfab::ui
