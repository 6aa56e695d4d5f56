// Qwen 2 / 2.5 (biases on Q, K and V) and Qwen 3 (an RMSNorm over each head of Q and K before
// RoPE, and a head size from attention.key_length that need not be n_embd / n_head). Both rotate
// the halves of each head, as their checkpoints do.

#include "core/model/architecture.h"
#include "core/model/llama_model.h"

namespace tokenfab {

void describe_qwen2(const gguf::GgufFile& file, HParams& h) {
  h.arch.rope_style = RopeStyle::kHalves;
  h.arch.qkv_bias = true;
  h.arch.ropes[0].pos_scale = arch_keys::linear_rope_scale(file, h.architecture);
}

void describe_qwen3(const gguf::GgufFile& file, HParams& h) {
  h.arch.rope_style = RopeStyle::kHalves;
  h.arch.qk_norm = true;
  h.arch.ropes[0].pos_scale = arch_keys::linear_rope_scale(file, h.architecture);
}

}  // namespace tokenfab
