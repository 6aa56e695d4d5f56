#pragma once
// What sets one model family's layers apart from the Llama layers every family shares: a
// description read from the GGUF file at load, consulted by the layers (TransformerPass), the
// loader and the KV backends. Each family reads its own keys and tensors in its own file
// (family_llama.cpp, family_qwen.cpp, family_gemma.cpp, family_phi3.cpp); nothing else branches
// on the architecture's name.

#include <cstdint>
#include <string>
#include <vector>

namespace tokenfab::gguf {
class GgufFile;
}

namespace tokenfab {

struct HParams;

// Which dimensions of a head RoPE rotates together. The GGUF converters permute Llama's and
// Mistral's Q/K rows so that adjacent dimensions pair; the other families keep the halves
// pairing of their original checkpoints.
enum class RopeStyle {
  kAdjacentPairs,  // (x[2i], x[2i+1]): llama, mistral
  kHalves,         // (x[i], x[i + rot_dim/2]): qwen2, qwen3, gemma2, gemma3, phi3
};

enum class FfnActivation {
  kSilu,      // silu(gate) · up
  kGeluTanh,  // gelu(gate) · up, GELU's tanh approximation (Gemma)
};

// One RoPE variant: dimension pair i of a token at position pos turns by
//   angle_i = pos · pos_scale · base^(−2i / rot_dim) / factors[i]
// (factors empty: all 1), and the rotated values are multiplied by attn_factor.
struct RopeSpec {
  float base = 10000.0f;
  float pos_scale = 1.0f;      // linear scaling: 1 / rope.scaling.factor
  std::vector<float> factors;  // (rot_dim / 2): Llama 3's rope_freqs, Phi-3's LongRoPE factors
  float attn_factor = 1.0f;
};

struct LayerSpec {
  int64_t window = 0;  // sliding window: a query at p attends (p − window, p]; 0: all of [0, p]
  int rope = 0;        // index into Architecture::ropes
};

struct Architecture {
  std::string name = "llama";  // general.architecture
  RopeStyle rope_style = RopeStyle::kAdjacentPairs;
  FfnActivation activation = FfnActivation::kSilu;
  bool qkv_bias = false;       // attn_{q,k,v}.bias added after the projections (qwen2)
  bool qk_norm = false;        // attn_{q,k}_norm: RMSNorm of each head of Q and K before RoPE
  bool post_norms = false;     // post_attention_norm / post_ffw_norm before each residual add
  bool fused_qkv = false;      // one attn_qkv matrix: Q rows, then K, then V (phi3)
  bool fused_gate_up = false;  // ffn_up holds gate rows, then up rows (phi3)
  float embedding_scale = 1.0f;    // the token embedding is multiplied by it (Gemma: √n_embd)
  float attention_scale = 0.0f;    // score = q·k · scale; 0: 1/√head_dim
  float attention_softcap = 0.0f;  // score ← c·tanh(score / c) when c > 0 (gemma2)
  float final_softcap = 0.0f;      // logit ← c·tanh(logit / c) when c > 0 (gemma2)
  std::vector<RopeSpec> ropes{RopeSpec{}};
  std::vector<LayerSpec> layers;  // (n_layer); empty: every layer full attention, rope 0
};

// What of `a` differs from the plain Llama layers, e.g. "RoPE on halves, Q/K biases"; empty when
// nothing does. The CUDA backend computes a model with differences only on its layered kernels
// for the families, behind CudaOptions::families (--cuda-families on; not yet verified on a GPU),
// and its fused decode layers never do (core/device/cuda_model.h).
std::string differences_from_llama(const Architecture& a);

// The architectures Tokenfab runs, for messages: "llama, qwen2, qwen3, gemma2, gemma3, phi3".
std::string supported_architectures_text();
bool is_supported_architecture(const std::string& name);

// Reads the family-specific keys and tensors of `file` into h.arch (and the hyperparameters a
// family defines differently, such as gemma's attention scale); h's common fields are already
// read. Throws Error naming the file for an architecture not in the list (naming it and the
// list) or a key or tensor of the wrong kind.
void describe_architecture(const gguf::GgufFile& file, HParams& h);

// The families, one function each (family_*.cpp).
void describe_llama(const gguf::GgufFile& file, HParams& h);
void describe_qwen2(const gguf::GgufFile& file, HParams& h);
void describe_qwen3(const gguf::GgufFile& file, HParams& h);
void describe_gemma2(const gguf::GgufFile& file, HParams& h);
void describe_gemma3(const gguf::GgufFile& file, HParams& h);
void describe_phi3(const gguf::GgufFile& file, HParams& h);

// Helpers for the family files.
namespace arch_keys {
float float_or(const gguf::GgufFile& file, const std::string& key, float fallback);
int64_t int_or(const gguf::GgufFile& file, const std::string& key, int64_t fallback);
std::string string_or(const gguf::GgufFile& file, const std::string& key,
                      const std::string& fallback);
// The F32 tensor `name` of n elements, or empty when the file has no such tensor; throws Error
// for one of another size or type.
std::vector<float> optional_f32_tensor(const gguf::GgufFile& file, const std::string& name,
                                       int64_t n);
// rope.scaling.type/factor of `<arch>.`: none, or linear (pos_scale = 1/factor); any other type
// is refused naming it.
float linear_rope_scale(const gguf::GgufFile& file, const std::string& arch);
}  // namespace arch_keys

}  // namespace tokenfab
