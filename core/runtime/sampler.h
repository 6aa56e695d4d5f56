#pragma once
// Token sampling from logits: greedy (temperature 0), or temperature with top-k, top-p and min-p
// filters, driven by a seeded generator so a run is reproducible.

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace tokenfab {

struct SamplingParams {
  float temperature = 0.8f;  // 0 = greedy
  int32_t top_k = 40;        // <= 0 disables
  float top_p = 0.95f;       // 1 disables
  float min_p = 0.05f;       // 0 disables
  uint64_t seed = 0;
  // Throws Error naming the field when a value is out of range (negative temperature, p outside
  // [0,1], ...).
  void validate() const;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  int32_t sample(std::span<const float> logits);  // not thread-safe; one sampler per sequence
  const SamplingParams& params() const { return params_; }

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;  // reused between calls
};

}  // namespace tokenfab
