#pragma once
// Synthetic models: GGUF files with the shapes of real models (of every family Tokenfab runs) and
// random weights, for speed and memory benchmarks and for tests that need every weight type and
// every family. They say what they are: the
// file's `general.name` is "synthetic <shape> (random weights)" and `tokenfab.synthetic` is true.
//
// The file holds a complete model: Llama hyperparameters, every tensor the loader wants, a
// byte-level tokenizer (the 256 GPT-2 byte characters, three ChatML control tokens, filler tokens
// up to n_vocab, no merges) and a ChatML chat template. Its text output is noise by design.
//
// Memory: GgufWriter keeps every tensor's bytes until write(), so writing needs about the file's
// size in RAM (plus one tensor in f32 while it is generated). The 135M shape needs ~100 MB at
// Q4_1; the Llama 3 8B shape ~4.5 GB at Q4_0, ~5 GB at Q4_1, ~8.5 GB at Q8_0, ~16 GB at
// F16/BF16 and ~32 GB at F32.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/gguf/gguf_types.h"
#include "kernels/cpu/quant_types.h"

namespace tokenfab {

struct SyntheticShape {
  std::string name;     // e.g. "smollm2-135m"; goes into general.name
  int64_t n_vocab = 0;  // at least kSyntheticMinVocab
  int64_t n_embd = 0;   // multiple of 32 and of n_head
  int64_t n_ff = 0;     // multiple of 32
  int64_t n_layer = 0;
  int n_head = 0;
  int n_kv_head = 0;  // divides n_head
  int64_t n_ctx = 0;  // llama.context_length
  float rope_freq_base = 10000.0f;
  bool tied_output = true;  // no output.weight: the LM head is token_embd.weight, as in SmolLM2
  // The family (general.architecture): llama, qwen2, qwen3, gemma2, gemma3 or phi3, each with the
  // tensors and keys its files have (architecture.h): biases, Q/K norms, post-norms, fused
  // matrices, sliding windows, soft-caps.
  std::string architecture = "llama";
  int head_dim = 0;             // attention.key_length; 0: n_embd / n_head (and no key written)
  int64_t sliding_window = 0;   // gemma2/gemma3: attention.sliding_window
  bool rope_freqs = false;      // llama: a rope_freqs.weight of Llama 3's kind (factors 1 … 8)

  // SmolLM2-135M: vocab 49152, embd 576, ff 1536, 30 layers, 9 heads / 3 KV heads, ctx 8192.
  static SyntheticShape smollm2_135m();
  // Llama 3 8B: vocab 128256, embd 4096, ff 14336, 32 layers, 32 heads / 8 KV heads, ctx 8192.
  static SyntheticShape llama3_8b();
  // A small Llama whose every row length is a multiple of 256, so that each K-quant rule of the
  // mixtures (quant_mix.h) applies without a fallback: vocab 2048, embd 512, ff 1536, 16 layers,
  // 8 heads / 2 KV heads (4 per KV head, as Llama 3 8B), ctx 2048, its own output.weight.
  static SyntheticShape llama_mini();
  // Each family scaled down to a few layers of width 256 (vocab 512): llama3-tiny (with rope
  // frequency factors), qwen2-tiny, qwen3-tiny (a head size of 96 × 4 heads ≠ the width),
  // gemma2-tiny and gemma3-tiny (windows of 8 positions, so short prompts cross them) and
  // phi3-tiny (fused matrices, LongRoPE factors). For the families' tests against the reference.
  static SyntheticShape family_tiny(const std::string& architecture);
  // The presets by CLI name ("smollm2-135m", "llama3-8b", "llama-mini", "<family>-tiny"); nullopt
  // for any other.
  static std::optional<SyntheticShape> preset(std::string_view name);
  static std::vector<std::string> preset_names();
};

// Vocabulary entries the synthetic tokenizer needs before its filler tokens: three control tokens
// (ids 0 <|endoftext|>, 1 <|im_start|>, 2 <|im_end|>, as in SmolLM2) and the 256 bytes
// (ids 3..258).
inline constexpr int64_t kSyntheticMinVocab = 3 + 256;

// The tensor `override_one_tensor_type` applies to.
inline constexpr const char* kSyntheticOverrideTensor = "blk.0.ffn_down.weight";

// Writes a synthetic Llama model to `path` (through a temporary file and a rename).
// Matrices (token_embd, output, attention and FFN weights) are normal(0, 0.02) quantized to
// `matrix_type` — a super-block type (Q2_K … Q6_K, IQ4_XS) in a matrix whose rows its 256-element
// blocks do not divide (the 576-wide smollm2-135m) takes llama-quantize's fallback instead
// (quant_mix.h: Q4_K → Q5_0, …) —; norms are F32, 1 + normal(0, 0.02). The same seed gives the
// same file.
// `override_one_tensor_type` stores kSyntheticOverrideTensor in another type: random weights when
// the kernels have that type, otherwise zero blocks (all scales 0, valid in every ggml format),
// so that loaders can be tested against types they must refuse.
// Throws Error for an impossible shape or an override whose block does not divide the row (n_ff).
void write_synthetic_llama(const std::filesystem::path& path, const SyntheticShape& shape,
                           kernels::WeightType matrix_type, uint64_t seed,
                           std::optional<gguf::TensorType> override_one_tensor_type = {});

}  // namespace tokenfab
