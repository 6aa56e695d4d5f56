#pragma once
// A plain-loop Llama forward pass for tests: every weight is dequantized to f32 once
// (kernels::dequantize_row, the reference of every kernel), then the whole sequence goes through
// the layers in double precision with no KV cache, no threads and no SIMD. Written from the Llama
// definition, not from the engine's forward pass, so that agreement means something.

#include <cstdint>
#include <span>
#include <vector>

#include "core/gguf/gguf_reader.h"

namespace tokenfab::test {

// What a matmul with block-quantized weights (Q8_0, Q4_0, Q4_1) sees of its input.
enum class Activations {
  kExact,     // the exact input: the mathematical model
  kQ8Blocks,  // the input rounded as the engine's kernels round it before integer dot products:
              // per block of 32, d = max|x| / 127 and x ≈ d · round(x / d). Isolates the kernels'
              // arithmetic from this (intended) approximation.
};

// Logits at every position: (tokens.size(), n_vocab), row-major. Reads the `llama.*`
// hyperparameters and the tensors from `file`; throws tokenfab::Error on what it cannot read.
std::vector<double> reference_logits(const gguf::GgufFile& file, std::span<const int32_t> tokens,
                                     Activations activations = Activations::kExact);

}  // namespace tokenfab::test
