// Phi-3 / Phi-3.5 / Phi-4-mini: Q, K and V in one matrix (attn_qkv) and gate and up in one
// (ffn_up, gate rows first), halves RoPE, and for the long-context models LongRoPE: per-dimension
// frequency factors, a short set for contexts within the original training length (what this
// engine uses: its contexts stay within it) and a long one beyond, with the attention factor
// that the file stores as rope.scaling.attn_factor. The files of the 4k models also declare a
// sliding window, which their converter does not describe faithfully; like llama.cpp we attend
// every earlier position.

#include "core/model/architecture.h"
#include "core/model/llama_model.h"

namespace tokenfab {

void describe_phi3(const gguf::GgufFile& file, HParams& h) {
  Architecture& a = h.arch;
  a.rope_style = RopeStyle::kHalves;
  a.fused_qkv = file.find_tensor("blk.0.attn_qkv.weight") != nullptr;
  a.fused_gate_up = file.find_tensor("blk.0.ffn_gate.weight") == nullptr;
  RopeSpec& rope = a.ropes[0];
  rope.factors = arch_keys::optional_f32_tensor(file, "rope_factors_short.weight", h.rot_dim / 2);
  rope.attn_factor = arch_keys::float_or(file, h.architecture + ".rope.scaling.attn_factor", 1.0f);
  if (!(rope.attn_factor > 0.0f)) rope.attn_factor = 1.0f;
}

}  // namespace tokenfab
