#pragma once
// Converting a matrix's rows from one weight type to another, as `tokenfab-cli quantize` and the
// quantization study (LlamaModel::requantize) do: each row dequantized to f32 and quantized again
// (kernels/cpu/quantize.h), or copied byte for byte when the type does not change (as
// llama-quantize copies a tensor already in its target type).

#include <cstdint>

#include "kernels/cpu/quant_types.h"

namespace tokenfab {

// src: `rows` rows of `cols` elements in `from`, row_bytes(from, cols) apart; dst: the same rows in
// `to`, row_bytes(to, cols) apart. `cols` must be a multiple of both types' block_elements. The
// rows are split over `threads` threads (0: all hardware threads); the result does not depend on
// the split (quantize_row is deterministic per row).
void requantize_rows(kernels::WeightType from, const uint8_t* src, kernels::WeightType to,
                     uint8_t* dst, int64_t rows, int64_t cols, int threads);

}  // namespace tokenfab
