#include "core/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "core/common/error.h"
#include "kernels/cpu/ops.h"

namespace tokenfab {

namespace {

using Candidate = std::pair<float, int32_t>;  // (logit, later probability weight; token id)

// Higher value first; equal values by lower token id, so the order (and thus every draw) does
// not depend on how the standard library breaks ties.
bool ranks_before(const Candidate& a, const Candidate& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

std::string field_error(const char* field, float value, const char* expected) {
  return "sampling parameter " + std::string(field) + " = " + std::to_string(value) +
         ": expected " + expected;
}

// A double uniform in [0, 1) from the top 53 bits of one 64-bit draw. Written out rather than
// using std::uniform_real_distribution, whose algorithm differs between standard libraries: a
// seed must give the same tokens everywhere.
double uniform01(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

// Top-p over weights (unnormalised probabilities): keeps the smallest best-first prefix whose
// weight reaches top_p * total, at least one token, and returns the kept weight. When the list
// is not sorted yet it is sorted in growing chunks (64, 128, ... best first), so a small nucleus
// in a 49152 vocab costs a few partial sorts instead of a full sort.
double keep_top_p(std::vector<Candidate>& candidates, float top_p, double total, bool sorted) {
  constexpr size_t kFirstChunk = 64;
  const double target = static_cast<double>(top_p) * total;
  size_t sorted_end = sorted ? candidates.size() : 0;  // [0, sorted_end) is in final order
  double cumulative = 0.0;
  size_t keep = 0;
  while (keep < candidates.size()) {
    if (keep == sorted_end) {
      // Everything past sorted_end ranks after everything before it, so sorting on from keep
      // extends the ordered prefix.
      sorted_end = std::min(candidates.size(), std::max(kFirstChunk, 2 * sorted_end));
      std::partial_sort(candidates.begin() + keep, candidates.begin() + sorted_end,
                        candidates.end(), ranks_before);
    }
    cumulative += candidates[keep].first;
    ++keep;
    if (cumulative >= target) break;
  }
  candidates.resize(keep);
  return cumulative;
}

// The first candidate whose running weight passes u * total, u in [0, 1): a draw from the
// renormalised weights. A zero weight never passes, so a zero-probability token is never drawn.
int32_t draw(const std::vector<Candidate>& candidates, double total, double u) {
  const double threshold = u * total;
  double cumulative = 0.0;
  for (const auto& c : candidates) {
    cumulative += c.first;
    if (cumulative > threshold) return c.second;
  }
  // Rounding left the sum a hair short (u was near 1): the last token with weight is the answer.
  for (auto it = candidates.rbegin(); it != candidates.rend(); ++it) {
    if (it->first > 0.0f) return it->second;
  }
  return candidates.front().second;
}

}  // namespace

void SamplingParams::validate() const {
  // The negated comparisons also reject NaN.
  if (!(temperature >= 0.0f) || std::isinf(temperature)) {
    throw Error(field_error("temperature", temperature, "a finite value >= 0 (0 = greedy)"));
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    throw Error(field_error("top_p", top_p, "a value in (0, 1] (1 = off)"));
  }
  if (!(min_p >= 0.0f && min_p <= 1.0f)) {
    throw Error(field_error("min_p", min_p, "a value in [0, 1] (0 = off)"));
  }
  // top_k: every value is meaningful (<= 0 = off, >= vocab = off); seed: any value.
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {
  params_.validate();
}

// Fills candidates_ with the tokens the filters keep and their unnormalised weights, and `total`
// with the weights' sum. Returns a token when the logits admit no distribution (all -inf or NaN,
// or a +inf): that token is then the only possible outcome.
std::optional<int32_t> Sampler::filter(std::span<const float> logits, double& total) {
  const auto n_vocab = static_cast<int32_t>(logits.size());
  // candidates_: (n_vocab) at first, shrinking as the filters drop tokens. clear() keeps the
  // capacity, so only the first call (or a larger vocab) allocates.
  candidates_.clear();
  candidates_.reserve(logits.size());
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int32_t i = 0; i < n_vocab; ++i) {
    // NaN would break the strict weak ordering the sorts need; it can never be chosen anyway.
    const float l = logits[i];
    candidates_.emplace_back(std::isnan(l) ? kNegInf : l, i);
  }

  // Top-k: O(n log k) selection of the k best, left sorted best first.
  bool sorted = false;
  if (params_.top_k > 0 && params_.top_k < n_vocab) {
    const auto k = static_cast<size_t>(params_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + k, candidates_.end(),
                      ranks_before);
    candidates_.resize(k);
    sorted = true;
  }

  float max_logit = kNegInf;
  for (const auto& c : candidates_) max_logit = std::max(max_logit, c.first);
  if (std::isinf(max_logit)) {
    // Every logit is -inf (or NaN), or one is +inf: no usable distribution. The best-ranked
    // token is the only sensible answer.
    return std::min_element(candidates_.begin(), candidates_.end(), ranks_before)->second;
  }
  // Softmax with temperature, unnormalised: weight = exp((l - l_max) / T), so the best token
  // weighs exactly 1 and every other weight is in [0, 1].
  const float inv_temperature = 1.0f / params_.temperature;
  for (auto& c : candidates_) c.first = std::exp((c.first - max_logit) * inv_temperature);

  // Min-p: drop tokens with p < min_p * p_max. As p_max weighs 1 the bound is min_p itself and
  // the best token always survives. remove_if is stable, so a sorted list stays sorted.
  if (params_.min_p > 0.0f) {
    const float bound = params_.min_p;
    candidates_.erase(std::remove_if(candidates_.begin(), candidates_.end(),
                                     [bound](const Candidate& c) { return c.first < bound; }),
                      candidates_.end());
  }

  total = 0.0;
  for (const auto& c : candidates_) total += c.first;
  // Top-p measures probability over the tokens still in the running (after top-k and min-p).
  if (params_.top_p < 1.0f) total = keep_top_p(candidates_, params_.top_p, total, sorted);
  return std::nullopt;
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (logits.empty()) throw Error("Sampler::sample: empty logits");
  if (params_.temperature == 0.0f)
    return static_cast<int32_t>(
        kernels::argmax(logits.data(), static_cast<int64_t>(logits.size())));
  double total = 0.0;
  if (const std::optional<int32_t> only = filter(logits, total)) return *only;
  return draw(candidates_, total, uniform01(rng_));
}

bool Sampler::accept_draft(std::span<const float> logits, int32_t token) {
  if (logits.empty()) throw Error("Sampler::accept_draft: empty logits");
  if (params_.temperature == 0.0f)
    return kernels::argmax(logits.data(), static_cast<int64_t>(logits.size())) == token;
  double total = 0.0;
  if (const std::optional<int32_t> only = filter(logits, total)) return *only == token;
  double weight = 0.0;
  for (const auto& c : candidates_)
    if (c.second == token) weight = c.first;
  // The draft proposes `token` with probability 1, so min(1, p/q) = p(token).
  return uniform01(rng_) * total < weight;
}

int32_t Sampler::sample_rejected(std::span<const float> logits, int32_t token) {
  if (logits.empty()) throw Error("Sampler::sample_rejected: empty logits");
  if (params_.temperature == 0.0f)
    return static_cast<int32_t>(
        kernels::argmax(logits.data(), static_cast<int64_t>(logits.size())));
  double total = 0.0;
  if (const std::optional<int32_t> only = filter(logits, total)) return *only;
  // The residual max(0, p - q) with q one-hot on `token`: p without the rejected token.
  for (auto& c : candidates_)
    if (c.second == token) {
      total -= c.first;
      c.first = 0.0f;
    }
  if (!(total > 0.0)) return token;  // p(token) was 1: a rejection cannot happen
  return draw(candidates_, total, uniform01(rng_));
}

}  // namespace tokenfab
