// Llama 1/2/3.x, SmolLM and Mistral (whose files say `llama`): the layers every family starts
// from. Llama 3.1+ adds per-dimension frequency factors (rope_freqs.weight) that stretch the long
// wavelengths; the file stores them, so no scaling formula is needed here.

#include "core/model/architecture.h"
#include "core/model/llama_model.h"

namespace tokenfab {

void describe_llama(const gguf::GgufFile& file, HParams& h) {
  RopeSpec& rope = h.arch.ropes[0];
  rope.factors = arch_keys::optional_f32_tensor(file, "rope_freqs.weight", h.rot_dim / 2);
  rope.pos_scale = arch_keys::linear_rope_scale(file, h.architecture);
}

}  // namespace tokenfab
