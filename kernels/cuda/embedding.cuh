#pragma once
// Token embedding lookup on the GPU: rows of a (possibly quantized) embedding matrix gathered to
// f32. Each row is bit-identical to kernels::dequantize_row of the same row (kernels/cpu).

#include <cuda_runtime.h>

#include <cstdint>

namespace tokenfab::kernels {

// `type` is a kernels::WeightType as int: any of them (F32, F16, BF16, Q4_0, Q4_1, Q8_0, Q5_0,
// Q5_1, Q2_K … Q6_K, IQ4_NL, IQ4_XS); each row is decoded on the device in that type.
// table: (n_vocab, n_embd) in that type's GGUF layout, rows back to back, device memory.
// tokens: (n_tokens) device int32 ids; each must be in [0, n_vocab) (not checked on the device:
//         the ids come from the tokenizer or the sampler, already bounded by the vocabulary).
// y: (n_tokens, n_embd) device f32.
// n_embd must be a multiple of block_elements(type) (32, or 256 for the K-quants and IQ4_XS).
// scale: each element is multiplied by it after decoding, as LlamaModel::embed does with the
// family's embedding scale (Gemma's √n_embd); 1 leaves the rows as decoded.
// Asynchronous on `stream`. Throws std::invalid_argument for an unknown type or a bad shape,
// std::runtime_error if the launch fails.
void launch_embedding(int type, const void* table, const int32_t* tokens, float* y,
                      int64_t n_tokens, int64_t n_embd, cudaStream_t stream, float scale = 1.0f);

}  // namespace tokenfab::kernels
