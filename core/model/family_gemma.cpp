// Gemma 2 and Gemma 3. Both: the embedding multiplied by √n_embd, a norm after attention and
// after the FFN (before each residual add) besides the ones before, GELU (tanh approximation)
// gating, halves RoPE, tied output, and sliding-window attention on most layers. The GGUF
// converter has already added 1 to every norm weight, so the norms are plain RMSNorms here.
//   gemma2: window on every other layer (layers 0, 2, 4, …), one RoPE base, soft-caps on the
//           attention scores and on the final logits.
//   gemma3: window on five of every six layers (layer i is global when (i + 1) % 6 == 0), those
//           local layers with their own RoPE base (10000 unless the file says otherwise) and no
//           linear scaling; RMSNorm over each head of Q and K.
// The attention scale is 1/√query_pre_attn_scalar, which the files do not store: it is the head
// size except in the 27B models, where it is n_embd / n_head.

#include <cmath>

#include "core/common/error.h"
#include "core/model/architecture.h"
#include "core/model/llama_model.h"

namespace tokenfab {

namespace {

void describe_gemma_common(const gguf::GgufFile& file, HParams& h, int64_t layers_of_27b) {
  Architecture& a = h.arch;
  a.rope_style = RopeStyle::kHalves;
  a.activation = FfnActivation::kGeluTanh;
  a.post_norms = true;
  a.embedding_scale = std::sqrt(static_cast<float>(h.n_embd));
  const double pre_attn_scalar = h.n_layer == layers_of_27b
                                     ? static_cast<double>(h.n_embd) / h.n_head
                                     : static_cast<double>(h.head_dim);
  a.attention_scale = static_cast<float>(1.0 / std::sqrt(pre_attn_scalar));
  const int64_t window = arch_keys::int_or(file, h.architecture + ".attention.sliding_window", 0);
  if (window <= 0)
    throw Error(file.name() + ": metadata " + h.architecture +
                ".attention.sliding_window must be present and positive");
}

// Layer i slides when i % pattern < pattern − 1; the others attend every earlier position.
void set_window_pattern(const gguf::GgufFile& file, HParams& h, int64_t pattern, int local_rope) {
  const int64_t window = arch_keys::int_or(file, h.architecture + ".attention.sliding_window", 0);
  h.arch.layers.assign(static_cast<size_t>(h.n_layer), LayerSpec{});
  for (int64_t i = 0; i < h.n_layer; ++i) {
    if (i % pattern < pattern - 1)
      h.arch.layers[static_cast<size_t>(i)] = LayerSpec{window, local_rope};
  }
}

}  // namespace

void describe_gemma2(const gguf::GgufFile& file, HParams& h) {
  describe_gemma_common(file, h, /*layers_of_27b=*/46);
  h.arch.attention_softcap =
      arch_keys::float_or(file, h.architecture + ".attn_logit_softcapping", 50.0f);
  h.arch.final_softcap =
      arch_keys::float_or(file, h.architecture + ".final_logit_softcapping", 30.0f);
  if (h.arch.attention_softcap < 0.0f || h.arch.final_softcap < 0.0f)
    throw Error(file.name() + ": gemma2 soft-caps must not be negative");
  h.arch.ropes[0].pos_scale = arch_keys::linear_rope_scale(file, h.architecture);
  set_window_pattern(file, h, 2, /*local_rope=*/0);
}

void describe_gemma3(const gguf::GgufFile& file, HParams& h) {
  describe_gemma_common(file, h, /*layers_of_27b=*/62);
  h.arch.qk_norm = true;
  h.arch.ropes[0].pos_scale = arch_keys::linear_rope_scale(file, h.architecture);
  RopeSpec local;
  local.base = arch_keys::float_or(file, h.architecture + ".rope.freq_base_swa", 10000.0f);
  if (!(local.base > 0.0f))
    throw Error(file.name() + ": metadata " + h.architecture + ".rope.freq_base_swa must be positive");
  h.arch.ropes.push_back(local);
  const int64_t pattern =
      arch_keys::int_or(file, h.architecture + ".attention.sliding_window_pattern", 6);
  if (pattern <= 0)
    throw Error(file.name() + ": metadata " + h.architecture +
                ".attention.sliding_window_pattern must be positive");
  set_window_pattern(file, h, pattern, /*local_rope=*/1);
}

}  // namespace tokenfab
