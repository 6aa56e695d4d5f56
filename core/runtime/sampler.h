#pragma once
// Token sampling from logits: greedy (temperature 0), or temperature with top-k, top-p and min-p
// filters, driven by a seeded generator so a run is reproducible.

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "kernels/cpu/candidates.h"

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

// What a device needs to filter a row for these params on its side (kernels/cpu/candidates.h):
// the row's argmax alone when greedy, else top-k and a min-p bound loose enough that the
// candidates hold every token the sampler could keep.
kernels::CandidateFilter candidate_filter(const SamplingParams& params);

// One row of logits as a device hands it over: the whole row, or only its candidates under
// candidate_filter(params) (kernels::filter_candidates). A sampler draws the same tokens from
// either, from the same seed.
struct LogitRow {
  std::span<const float> logits;  // the whole row, or the candidates' logits
  std::span<const int32_t> ids;   // the candidates' token ids; empty for a whole row
  // The candidates are best first (top-k limited the row; else they are in id order): the
  // sampler's top-p need not sort them again.
  bool ranked = false;
  // A whole row converts implicitly.
  LogitRow(std::span<const float> whole) : logits(whole) {}     // NOLINT
  LogitRow(const std::vector<float>& whole) : logits(whole) {}  // NOLINT
  LogitRow(std::span<const float> candidate_logits, std::span<const int32_t> candidate_ids,
           bool best_first)
      : logits(candidate_logits), ids(candidate_ids), ranked(best_first) {}
  bool whole() const { return ids.empty(); }
};

// A step's logit rows as a device that filters them hands them back (Device::run_filtered):
// row r is count[r] candidates at logits/ids[r·width …], or, when count[r] < 0, the whole row
// whole[whole_at[r]·n_vocab …].
struct FilteredRows {
  int64_t n_vocab = 0;
  int32_t width = 0;              // candidate slots per row
  std::vector<int32_t> count;     // (rows) candidates, or -1: the whole row
  std::vector<uint8_t> ranked;    // (rows) candidates best first (LogitRow::ranked)
  std::vector<float> logits;      // (rows, width) candidates' logits
  std::vector<int32_t> ids;       // (rows, width) candidates' ids
  std::vector<int64_t> whole_at;  // (rows) index of the row in `whole`, -1 for candidates
  std::vector<float> whole;       // (rows that went whole, n_vocab)
  int64_t rows() const { return static_cast<int64_t>(count.size()); }
  LogitRow row(int64_t r) const;
  // Every row whole: `all` (rows, n_vocab) moved in (a device that does not filter).
  void assign_whole(std::vector<float>&& all, int64_t n_vocab);
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  int32_t sample(const LogitRow& row);  // not thread-safe; one sampler per sequence

  // Speculative sampling against a draft that proposed `token` deterministically (q one-hot):
  // accept_draft accepts it with probability p(token) under this sampler's filtered distribution
  // (greedy: iff it is the argmax); after a rejection, sample_rejected draws from p with `token`
  // removed (the residual max(0, p − q)). Together they sample exactly from p.
  bool accept_draft(const LogitRow& row, int32_t token);
  int32_t sample_rejected(const LogitRow& row, int32_t token);
  const SamplingParams& params() const { return params_; }

 private:
  // The greedy choice: kernels::argmax of a whole row; a greedy candidate row holds just that.
  static int32_t greedy(const LogitRow& row);
  std::optional<int32_t> filter(const LogitRow& row, double& total);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;  // reused between calls
};

}  // namespace tokenfab
