#pragma once
// Quantization mixtures: the type of every tensor of a model in a llama.cpp file type (Q4_K_M,
// Q2_K, IQ4_XS, …) as llama.cpp's `llama-quantize` chooses it for the `llama` architecture without
// an importance matrix. The rules are llama.cpp's (src/llama-quant.cpp of the llama.cpp that
// llama-cpp-python 0.3.36 vendors), written down here in our own words:
//   - only 2-D tensors whose names end in "weight" are quantized (not the norms); the rest keep
//     their type;
//   - a float target (F16, BF16) turns every quantized tensor into that type, and nothing else
//     applies;
//   - the LM head (output.weight, or token_embd.weight when the LM head is tied to it) takes Q6_K,
//     or stays Q8_0 for a Q8_0 target, or Q8_0 when its rows do not divide into the target's
//     blocks;
//   - attn_v, ffn_down and attn_output get more bits in some mixtures and some layers
//     (`use_more_bits`: the first and last eighth of the layers and every third one between);
//   - last, a super-block type whose blocks do not divide a tensor's rows falls back to a
//     32-element type (Q2_K, Q3_K → Q4_0; Q4_K → Q5_0; Q5_K → Q5_1; Q6_K → Q8_0; IQ4_XS → IQ4_NL),
//     or F16 when not even 32 divides them.
// tests/data/quant_mix_golden.json holds llama-quantize's own choices for two models (written by
// tools/golden_quant_mix.py); test_quant_mix checks these rules against every one of them.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/gguf/gguf_reader.h"
#include "core/gguf/gguf_types.h"

namespace tokenfab {

// One tensor as the mixture sees it.
struct MixTensor {
  std::string name;
  std::vector<uint64_t> dims;                     // ggml order: dims[0] is the row length
  gguf::TensorType type = gguf::TensorType::F32;  // its type now, kept where nothing applies
};

// What the mixture reads of a model: its architecture, three hyperparameters and its tensors.
struct MixModel {
  std::string architecture;
  int64_t n_layer = 0;
  int n_head = 0;
  int n_kv_head = 0;
  std::vector<MixTensor> tensors;

  // From a GGUF file's metadata (<arch>.block_count, attention.head_count, head_count_kv) and
  // tensor infos. Throws Error naming the file and a key that is missing.
  static MixModel from_gguf(const gguf::GgufFile& file);
};

// The targets Tokenfab writes, by llama.cpp's names, richest first: F16, BF16, Q8_0, Q6_K, Q5_1,
// Q5_K_M, Q5_K_S, Q5_0, Q4_1, Q4_K_M, IQ4_NL, Q4_K_S, Q4_0, IQ4_XS, Q3_K_L, Q3_K_M, Q3_K_S, Q2_K.
const std::vector<std::string>& quant_mix_names();
// "F16, BF16, …, Q2_K": the names above for messages.
std::string quant_mix_names_text();
// The general.file_type value (gguf/file_type.h) of one of those names, case-insensitive, or
// nullopt for any other name.
std::optional<uint32_t> quant_mix_file_type(std::string_view name);

// The type of every tensor of `model`, in its order, in the mixture `file_type`. Throws Error for
// a file type outside quant_mix_names() or an architecture other than llama.
std::vector<gguf::TensorType> quant_mix(const MixModel& model, uint32_t file_type);

// The type llama-quantize writes instead of `type` for rows of `row_elements` that `type`'s blocks
// do not divide (see above); `type` itself when they do.
gguf::TensorType quant_fallback(gguf::TensorType type, uint64_t row_elements);

}  // namespace tokenfab
