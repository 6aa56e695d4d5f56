#pragma once
// SwiGLU activation on the GPU; mirrors kernels::silu_mul (kernels/cpu/ops.h).
// `overlap`: the launch may start while the previous kernel of the stream finishes, and waits
// for it before reading anything (launch_overlap.cuh; compute capability 9.0 or later).

#include <cuda_runtime.h>

#include <cstdint>

namespace tokenfab::kernels {

// gate = silu(gate) * up = gate / (1 + exp(-gate)) * up, element-wise.
// gate, up: (n) device f32 (any row layout flattened). Asynchronous on `stream`;
// throws std::runtime_error if the launch fails.
void launch_silu_mul(float* gate, const float* up, int64_t n, cudaStream_t stream);

// The FFN's fused form: gate_up (rows, 2·n) device f32, each row the gate then the up projection
// (one GEMM over the stacked weights); out (rows, n) device bf16 bits of silu(gate)·up, computed
// exactly as launch_silu_mul and rounded as launch_f32_to_bf16 (the down GEMM's input).
void launch_silu_mul_rows_bf16(const float* gate_up, int64_t rows, int64_t n, uint16_t* out,
                               cudaStream_t stream, bool overlap = false);

}  // namespace tokenfab::kernels
