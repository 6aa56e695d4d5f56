#pragma once
// SwiGLU activation on the GPU; mirrors kernels::silu_mul (kernels/cpu/ops.h).

#include <cuda_runtime.h>

#include <cstdint>

namespace tokenfab::kernels {

// gate = silu(gate) * up = gate / (1 + exp(-gate)) * up, element-wise.
// gate, up: (n) device f32 (any row layout flattened). Asynchronous on `stream`;
// throws std::runtime_error if the launch fails.
void launch_silu_mul(float* gate, const float* up, int64_t n, cudaStream_t stream);

}  // namespace tokenfab::kernels
