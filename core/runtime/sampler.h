#pragma once
// Token sampling from logits: greedy (temperature 0), or temperature with top-k, top-p and min-p
// filters, driven by a seeded generator so a run is reproducible.

#include <cstdint>
#include <optional>
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

  // Speculative sampling against a draft that proposed `token` deterministically (q one-hot):
  // accept_draft accepts it with probability p(token) under this sampler's filtered distribution
  // (greedy: iff it is the argmax); after a rejection, sample_rejected draws from p with `token`
  // removed (the residual max(0, p − q)). Together they sample exactly from p.
  bool accept_draft(std::span<const float> logits, int32_t token);
  int32_t sample_rejected(std::span<const float> logits, int32_t token);
  const SamplingParams& params() const { return params_; }

 private:
  std::optional<int32_t> filter(std::span<const float> logits, double& total);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;  // reused between calls
};

}  // namespace tokenfab
