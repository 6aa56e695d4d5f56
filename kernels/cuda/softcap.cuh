#pragma once
// Soft-capping on the GPU; mirrors kernels::softcap (kernels/cpu/ops.h): Gemma 2's final logits.
// `overlap`: the launch may start while the previous kernel of the stream finishes, and waits
// for it before reading anything (launch_overlap.cuh; compute capability 9.0 or later).

#include <cuda_runtime.h>

#include <cstdint>

namespace tokenfab::kernels {

// x ← cap · tanh(x / cap), element-wise; x: (n) device f32, cap > 0. Asynchronous on `stream`;
// throws std::invalid_argument for a cap that is not positive, std::runtime_error if the launch
// fails.
void launch_softcap(float* x, int64_t n, float cap, cudaStream_t stream, bool overlap = false);

}  // namespace tokenfab::kernels
