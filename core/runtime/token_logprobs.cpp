#include "core/runtime/token_logprobs.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/common/error.h"

namespace tokenfab {

TokenLogprob token_logprob(std::span<const float> logits, TokenId token, int32_t top_n) {
  if (logits.empty() || token < 0 || static_cast<size_t>(token) >= logits.size() || top_n < 0)
    throw Error("token_logprob: a token inside a non-empty row, and top_n >= 0");
  const float m = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (const float l : logits) sum += std::exp(static_cast<double>(l) - m);
  const double log_z = m + std::log(sum);
  auto logprob = [&](TokenId t) {
    return static_cast<float>(static_cast<double>(logits[static_cast<size_t>(t)]) - log_z);
  };
  TokenLogprob out;
  out.logprob = logprob(token);
  const auto n = static_cast<size_t>(std::min<int64_t>(top_n, static_cast<int64_t>(logits.size())));
  if (n == 0) return out;
  std::vector<TokenId> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n), ids.end(),
                    [&](TokenId a, TokenId b) {
                      const float la = logits[static_cast<size_t>(a)];
                      const float lb = logits[static_cast<size_t>(b)];
                      return la != lb ? la > lb : a < b;
                    });
  out.top.reserve(n);
  for (size_t i = 0; i < n; ++i) out.top.emplace_back(ids[i], logprob(ids[i]));
  return out;
}

}  // namespace tokenfab
