#include "kernels/cpu/candidates.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "kernels/cpu/ops.h"

namespace tokenfab::kernels {

int32_t candidate_slots(const CandidateFilter& f, int64_t n) {
  if (f.greedy != 0) return 1;
  if (top_k_limits(f, n)) return std::min(f.top_k, kMaxCandidates);
  return kMaxCandidates;
}

int32_t filter_candidates(const float* x, int64_t n, const CandidateFilter& f, int32_t cap,
                          std::vector<float>& logits, std::vector<int32_t>& ids) {
  logits.assign(static_cast<size_t>(std::max(cap, 0)), 0.0f);
  ids.assign(static_cast<size_t>(std::max(cap, 0)), 0);
  if (n <= 0 || cap <= 0) return -1;
  if (f.greedy != 0) {
    const int64_t best = argmax(x, n);
    logits[0] = x[best];
    ids[0] = static_cast<int32_t>(best);
    return 1;
  }
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  auto value = [&](int64_t i) { return std::isnan(x[i]) ? kNegInf : x[i]; };
  float max = kNegInf;
  for (int64_t i = 0; i < n; ++i) max = std::max(max, value(i));
  if (std::isinf(max)) return -1;

  // As the sampler filters: top-k over the whole row first (best first), then min-p.
  std::vector<std::pair<float, int32_t>> kept;  // (value, id)
  kept.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) kept.emplace_back(value(i), static_cast<int32_t>(i));
  const bool ranked = top_k_limits(f, n);
  if (ranked) {
    std::sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    kept.resize(static_cast<size_t>(f.top_k));
  }
  // remove_if is stable: rank order or id order stays.
  kept.erase(std::remove_if(
                 kept.begin(), kept.end(),
                 [&](const auto& c) { return !((c.first - max) * f.inv_temperature >= f.min_z); }),
             kept.end());
  const auto keep = static_cast<int64_t>(kept.size());
  if (keep == 0 || keep > cap) return -1;
  for (int64_t i = 0; i < keep; ++i) {
    logits[static_cast<size_t>(i)] = kept[static_cast<size_t>(i)].first;
    ids[static_cast<size_t>(i)] = kept[static_cast<size_t>(i)].second;
  }
  return static_cast<int32_t>(keep);
}

}  // namespace tokenfab::kernels
