#include "core/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>

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
  // A temperature whose inverse overflows f32 (below about 3e-39) would make every weight NaN.
  if (!(temperature >= 0.0f) || std::isinf(temperature) ||
      (temperature > 0.0f && std::isinf(1.0f / temperature))) {
    throw Error(
        field_error("temperature", temperature, "0 (greedy) or a finite value of at least 1e-38"));
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    throw Error(field_error("top_p", top_p, "a value in (0, 1] (1 = off)"));
  }
  if (!(min_p >= 0.0f && min_p <= 1.0f)) {
    throw Error(field_error("min_p", min_p, "a value in [0, 1] (0 = off)"));
  }
  // top_k: every value is meaningful (<= 0 = off, >= vocab = off); seed: any value.
}

LogitRow FilteredRows::row(int64_t r) const {
  const auto i = static_cast<size_t>(r);
  if (count[i] < 0) {
    const auto at = static_cast<size_t>(whole_at[i]) * static_cast<size_t>(n_vocab);
    return {std::span<const float>(whole.data() + at, static_cast<size_t>(n_vocab))};
  }
  const size_t at = i * static_cast<size_t>(width);
  return {std::span<const float>(logits.data() + at, static_cast<size_t>(count[i])),
          std::span<const int32_t>(ids.data() + at, static_cast<size_t>(count[i])), ranked[i] != 0};
}

void FilteredRows::assign_whole(std::vector<float>&& all, int64_t vocab) {
  n_vocab = vocab;
  width = 0;
  const int64_t n = vocab > 0 ? static_cast<int64_t>(all.size()) / vocab : 0;
  count.assign(static_cast<size_t>(n), -1);
  ranked.assign(static_cast<size_t>(n), 0);
  logits.clear();
  ids.clear();
  whole_at.resize(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) whole_at[static_cast<size_t>(r)] = r;
  whole = std::move(all);
}

kernels::CandidateFilter candidate_filter(const SamplingParams& params) {
  kernels::CandidateFilter f;
  f.greedy = params.temperature == 0.0f ? 1 : 0;
  if (f.greedy != 0) return f;
  f.top_k = params.top_k;
  f.inv_temperature = 1.0f / params.temperature;  // as filter() computes it
  // filter() keeps exp(z) >= min_p. expf and logf are within a few ulps, far inside 1e-3 of z,
  // so every token min-p keeps has z >= min_z; the few extra ones min-p then drops on the host.
  // Below 1e-30 exp(z) >= min_p is decided among denormals, whose rounding no small margin
  // covers: no bound on the device then (the host's min-p still applies).
  if (params.min_p > 1e-30f) f.min_z = std::log(params.min_p) - 1e-3f;
  return f;
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {
  params_.validate();
}

// Fills candidates_ with the tokens the filters keep and their unnormalised weights, and `total`
// with the weights' sum. Returns a token when the logits admit no distribution (all -inf or NaN,
// or a +inf): that token is then the only possible outcome.
std::optional<int32_t> Sampler::filter(const LogitRow& row, double& total) {
  const auto n = static_cast<int32_t>(row.logits.size());
  // candidates_: (n) at first, shrinking as the filters drop tokens. clear() keeps the
  // capacity, so only the first call (or a larger vocab) allocates.
  candidates_.clear();
  candidates_.reserve(row.logits.size());
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int32_t i = 0; i < n; ++i) {
    // NaN would break the strict weak ordering the sorts need; it can never be chosen anyway.
    const float l = row.logits[static_cast<size_t>(i)];
    candidates_.emplace_back(std::isnan(l) ? kNegInf : l,
                             row.whole() ? i : row.ids[static_cast<size_t>(i)]);
  }

  // Top-k: O(n log k) selection of the k best, left sorted best first. A candidate row holds
  // at most top_k tokens, already best first when top-k limited the whole row.
  bool sorted = row.ranked;
  if (params_.top_k > 0 && params_.top_k < n) {
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

int32_t Sampler::greedy(const LogitRow& row) {
  if (!row.whole()) return row.ids.front();
  return static_cast<int32_t>(
      kernels::argmax(row.logits.data(), static_cast<int64_t>(row.logits.size())));
}

int32_t Sampler::sample(const LogitRow& row) {
  if (row.logits.empty()) throw Error("Sampler::sample: empty logits");
  if (params_.temperature == 0.0f) return greedy(row);
  double total = 0.0;
  if (const std::optional<int32_t> only = filter(row, total)) return *only;
  return draw(candidates_, total, uniform01(rng_));
}

bool Sampler::accept_draft(const LogitRow& row, int32_t token) {
  if (row.logits.empty()) throw Error("Sampler::accept_draft: empty logits");
  if (params_.temperature == 0.0f) return greedy(row) == token;
  double total = 0.0;
  if (const std::optional<int32_t> only = filter(row, total)) return *only == token;
  double weight = 0.0;
  for (const auto& c : candidates_)
    if (c.second == token) weight = c.first;
  // The draft proposes `token` with probability 1, so min(1, p/q) = p(token).
  return uniform01(rng_) * total < weight;
}

int32_t Sampler::sample_rejected(const LogitRow& row, int32_t token) {
  if (row.logits.empty()) throw Error("Sampler::sample_rejected: empty logits");
  if (params_.temperature == 0.0f) return greedy(row);
  double total = 0.0;
  if (const std::optional<int32_t> only = filter(row, total)) return *only;
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
