#pragma once
// The FFN's gated activation on the GPU, row by row from the stacked gate·up product, in f32: the
// input of the down product in the families' layered path (CudaOptions::families). Mirrors
// kernels::silu_mul and kernels::gelu_tanh_mul (kernels/cpu/ops.h).
// `overlap`: the launch may start while the previous kernel of the stream finishes, and waits
// for it before reading anything (launch_overlap.cuh; compute capability 9.0 or later).

#include <cuda_runtime.h>

#include <cstdint>

namespace tokenfab::kernels {

enum class GluActivation {
  kSilu,      // silu(gate) · up = gate / (1 + exp(−gate)) · up
  kGeluTanh,  // gelu(gate) · up, GELU's tanh approximation (Gemma)
};

// out (rows, n) device f32 = act(gate) · up, of gate_up (rows, 2·n) device f32 whose rows are the
// gate's n values, then the up projection's n. Asynchronous on `stream`; throws
// std::runtime_error if the launch fails.
void launch_glu_rows(const float* gate_up, int64_t rows, int64_t n, GluActivation activation,
                     float* out, cudaStream_t stream, bool overlap = false);

}  // namespace tokenfab::kernels
