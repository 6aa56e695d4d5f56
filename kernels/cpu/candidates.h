#pragma once
// Sampling candidates: what a GPU sends back for a logit row instead of the whole row when the
// row's request samples (temperature > 0) with top-k and/or min-p — at most a few hundred
// (logit, token) pairs instead of n_vocab logits. The sampler (core/runtime/sampler.h) then draws
// from them exactly as it would from the whole row: top-k and min-p only ever keep a best-first
// prefix of the vocabulary, so the candidates are a superset of what the sampler keeps, in the
// order it would visit them, and the same seed gives the same token.
//
// filter_candidates here is the reference (plain loops); kernels/cuda/candidates.cuh is the GPU
// op, tested against it for equality.

#include <cstdint>
#include <limits>
#include <vector>

namespace tokenfab::kernels {

// What one logit row's sampler can keep at most (core/runtime/sampler.cpp builds it from the
// request's SamplingParams). Plain data: copied to the GPU as is.
struct CandidateFilter {
  int32_t top_k = 0;             // keep the top_k best (logit desc, then id asc); <= 0: no limit
  int32_t greedy = 0;            // 1: the row's argmax alone (kernels::argmax's choice)
  float inv_temperature = 1.0f;  // 1 / temperature, as the sampler computes it (in float)
  // A token with z = (logit - max_logit) * inv_temperature below min_z cannot pass min-p. The
  // sampler keeps exp(z) >= min_p, so min_z is log(min_p) minus a margin that covers the
  // rounding of exp and log; -inf: no min-p.
  float min_z = -std::numeric_limits<float>::infinity();
};

// The filter whose candidates are a row's k best tokens, best first, ties to the lower id (its
// argmax alone for k = 1): what a draft head proposes from a row.
inline CandidateFilter best_of(int32_t k) {
  CandidateFilter f;
  f.top_k = k;
  f.greedy = k == 1 ? 1 : 0;
  return f;
}

// The most candidates a row may have; a row with more goes whole.
inline constexpr int32_t kMaxCandidates = 1024;

// Whether f's top_k limits a row of n tokens (then the candidates are in rank order).
inline bool top_k_limits(const CandidateFilter& f, int64_t n) {
  return f.top_k > 0 && f.top_k < n;
}

// Candidate slots a row filtered by f needs at most: 1 for greedy, min(top_k, kMaxCandidates)
// when top_k limits, kMaxCandidates otherwise.
int32_t candidate_slots(const CandidateFilter& f, int64_t n);

// The candidates of the row x (n) under f, at most `cap` of them (cap <= kMaxCandidates):
// (logit, id) pairs written to logits[0..count) and ids[0..count). Returns count, or -1 when the
// row must go whole: more than cap candidates, none (an inv_temperature so large that z is NaN),
// or no usable distribution (the largest value is +inf, or every value is -inf or NaN; the
// sampler has its own rule for those).
// Greedy rows: the one candidate kernels::argmax(x, n) (NaN skipped, lowest id among maxima).
// Other rows: NaN reads as -inf; max = the largest value; the survivors are the tokens with
// (v - max) * inv_temperature >= min_z (float arithmetic), of which the top_k best when top_k
// limits, listed best first (larger value, then lower id; -0 equals +0), else all of them in id
// order. logits/ids are resized to cap.
int32_t filter_candidates(const float* x, int64_t n, const CandidateFilter& f, int32_t cap,
                          std::vector<float>& logits, std::vector<int32_t>& ids);

}  // namespace tokenfab::kernels
