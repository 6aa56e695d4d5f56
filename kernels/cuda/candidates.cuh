#pragma once
// Sampling candidates on the GPU: each logit row reduced to the (logit, token) pairs its
// sampler can keep; mirrors kernels::filter_candidates (kernels/cpu/candidates.h) exactly, so
// the host draws the same token from them as from the whole row.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cpu/candidates.h"

namespace tokenfab::kernels {

// For each row r of x (rows, n): counts[r] = filter_candidates(x_r, n, filters[r], width, …)
// and its candidates in out_logits[r·width …] / out_ids[r·width …] (entries past the count are
// left as they were). argmax: (rows) each row's launch_argmax_rows result, read by greedy rows
// only. x: device f32; filters: device (rows); out_logits, out_ids: device (rows, width);
// counts: device (rows). width in [1, kMaxCandidates]; n < 2^31. Asynchronous on `stream`;
// throws std::invalid_argument for a bad shape, std::runtime_error if the launch fails.
void launch_filter_candidates(const float* x, int64_t rows, int64_t n,
                              const CandidateFilter* filters, const int32_t* argmax, int32_t width,
                              float* out_logits, int32_t* out_ids, int32_t* counts,
                              cudaStream_t stream);

}  // namespace tokenfab::kernels
