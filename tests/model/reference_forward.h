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

// Logits at every position: (tokens.size(), n_vocab), row-major. Reads the `llama.*`
// hyperparameters and the tensors from `file`; throws tokenfab::Error on what it cannot read.
std::vector<double> reference_logits(const gguf::GgufFile& file, std::span<const int32_t> tokens);

}  // namespace tokenfab::test
