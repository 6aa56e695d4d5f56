#pragma once
// Each row's log-sum-exp on the GPU: the normaliser of a row of logits, log Σ exp(x_i), for the
// path probabilities of an mtp head's best-first draft trees.

#include <cuda_runtime.h>

#include <cstdint>

namespace tokenfab::kernels {

// out[r] = max_r + log Σ_i exp(x[r, i] − max_r), with max_r the row's largest value (NaNs
// skipped; -inf when the row has no number). x: (rows, n) device f32; out: (rows) device f32.
// The sum is taken in f32, in another order than a CPU loop. Asynchronous on `stream`; throws
// std::invalid_argument for a bad shape, std::runtime_error if the launch fails.
void launch_row_logsumexp(const float* x, int64_t rows, int64_t n, float* out, cudaStream_t stream);

}  // namespace tokenfab::kernels
