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

// How the pass rounds. kExact: the file's weights, everything else in double precision. The other
// two emulate the CUDA backend's rounding (core/device/cuda_model.cpp), to measure how far from
// the exact logits that rounding alone can put a GPU (tests/model/test_gpu_rounding.cpp): the
// weights dequantized and rounded to BF16 (the GPU's copies), K and V rounded to fp16 (the paged
// pool), and each matmul's input rounded to f32 (kGpuFewRows: the GEMVs of steps of up to 8 rows)
// or to BF16 (kGpuManyRows: cuBLASLt's GEMMs of bigger steps). Sums stay in double, where the GPU
// adds in f32: that difference is far below the roundings emulated.
enum class Rounding { kExact, kGpuFewRows, kGpuManyRows };

// Logits at every position: (tokens.size(), n_vocab), row-major. Reads the `llama.*`
// hyperparameters and the tensors from `file`; throws tokenfab::Error on what it cannot read.
std::vector<double> reference_logits(const gguf::GgufFile& file, std::span<const int32_t> tokens,
                                     Rounding rounding = Rounding::kExact);

}  // namespace tokenfab::test
