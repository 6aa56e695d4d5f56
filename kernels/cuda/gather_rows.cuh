#pragma once
// Rows of a device table gathered by index on the GPU: an mtp head's draft-vocabulary rows of
// the LM head, and the token ids its argmaxes point at.

#include <cuda_runtime.h>

#include <cstdint>

namespace tokenfab::kernels {

// out (n, cols) = table[ids[i], :] for i in [0, n): 16-bit values (bf16 bits). table: (any, cols)
// device; ids: (n) device int32, each a row of table (not checked on the device); out: (n, cols)
// device. Asynchronous on `stream`; throws std::invalid_argument for a bad shape,
// std::runtime_error if the launch fails.
void launch_gather_rows_u16(const uint16_t* table, int64_t cols, const int32_t* ids, int64_t n,
                            uint16_t* out, cudaStream_t stream);

// out[i] = table[index[i]] for i in [0, n): int32 values. Same conventions.
void launch_gather_i32(const int32_t* table, const int32_t* index, int64_t n, int32_t* out,
                       cudaStream_t stream);

}  // namespace tokenfab::kernels
