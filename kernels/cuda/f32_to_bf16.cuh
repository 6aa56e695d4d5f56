#pragma once
// f32 → bf16 on the GPU, the activations' way into the cuBLASLt BF16 GEMMs; mirrors
// kernels::fp32_to_bf16 (kernels/cpu/quant_types.h) bit for bit: round to nearest even, a NaN
// stays a quiet NaN of the same sign.
// `overlap`: the launch may start while the previous kernel of the stream finishes, and waits
// for it before reading anything (launch_overlap.cuh; compute capability 9.0 or later).

#include <cuda_runtime.h>

#include <cstdint>

namespace tokenfab::kernels {

// y[i] = bf16 bits of x[i]. x: (n) device f32; y: (n) device uint16 (any row layout flattened).
// Asynchronous on `stream`; throws std::runtime_error if the launch fails.
void launch_f32_to_bf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream,
                        bool overlap = false);

}  // namespace tokenfab::kernels
