#include "core/model/architecture.h"

#include <array>
#include <cmath>

#include "core/common/error.h"
#include "core/gguf/gguf_reader.h"
#include "core/model/llama_model.h"
#include "kernels/cpu/quant_types.h"
#include "kernels/cpu/quantize.h"

namespace tokenfab {

namespace {

struct Family {
  const char* name;
  void (*describe)(const gguf::GgufFile&, HParams&);
};

// Mistral's files say `llama`; Llama 3's too (with rope_freqs).
constexpr std::array<Family, 6> kFamilies = {{
    {"llama", &describe_llama},
    {"qwen2", &describe_qwen2},
    {"qwen3", &describe_qwen3},
    {"gemma2", &describe_gemma2},
    {"gemma3", &describe_gemma3},
    {"phi3", &describe_phi3},
}};

}  // namespace

std::string supported_architectures_text() {
  std::string text;
  for (const Family& f : kFamilies) text += (text.empty() ? "" : ", ") + std::string(f.name);
  return text;
}

bool is_supported_architecture(const std::string& name) {
  for (const Family& f : kFamilies)
    if (name == f.name) return true;
  return false;
}

void describe_architecture(const gguf::GgufFile& file, HParams& h) {
  for (const Family& f : kFamilies) {
    if (h.architecture != f.name) continue;
    h.arch = Architecture{};
    h.arch.name = f.name;
    RopeSpec rope;
    rope.base = h.rope_base;
    h.arch.ropes = {rope};
    f.describe(file, h);
    return;
  }
  throw Error(file.name() + ": unsupported architecture '" + h.architecture +
              "' (general.architecture); supported: " + supported_architectures_text());
}

std::string differences_from_llama(const Architecture& a) {
  std::vector<std::string> d;
  if (a.rope_style != RopeStyle::kAdjacentPairs) d.push_back("RoPE on halves of each head");
  if (a.activation != FfnActivation::kSilu) d.push_back("a GELU feed-forward");
  if (a.qkv_bias) d.push_back("Q/K/V biases");
  if (a.qk_norm) d.push_back("Q/K norms");
  if (a.post_norms) d.push_back("post-norms");
  if (a.embedding_scale != 1.0f) d.push_back("a scaled embedding");
  if (a.attention_scale > 0.0f) d.push_back("its own attention scale");
  if (a.attention_softcap > 0.0f || a.final_softcap > 0.0f) d.push_back("soft-caps");
  bool windows = false;
  for (const LayerSpec& l : a.layers) windows |= l.window > 0;
  if (windows) d.push_back("sliding-window layers");
  bool scaled_rope = a.ropes.size() > 1;
  for (const RopeSpec& r : a.ropes)
    scaled_rope |= !r.factors.empty() || r.pos_scale != 1.0f || r.attn_factor != 1.0f;
  if (scaled_rope) d.push_back("scaled RoPE");
  std::string text;
  for (const std::string& s : d) text += (text.empty() ? "" : ", ") + s;
  return text;
}

float HParams::attention_scale() const {
  return arch.attention_scale > 0.0f ? arch.attention_scale
                                     : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

int64_t HParams::window(int64_t layer) const {
  return arch.layers.empty() ? 0 : arch.layers[static_cast<size_t>(layer)].window;
}

const RopeSpec& HParams::rope(int64_t layer) const {
  const int i = arch.layers.empty() ? 0 : arch.layers[static_cast<size_t>(layer)].rope;
  return arch.ropes[static_cast<size_t>(i)];
}

namespace arch_keys {

float float_or(const gguf::GgufFile& file, const std::string& key, float fallback) {
  const gguf::Value* v = file.find(key);
  if (v == nullptr) return fallback;
  const auto value = static_cast<float>(v->as_float(key));
  if (!std::isfinite(value))
    throw Error(file.name() + ": metadata " + key + " is not a finite number");
  return value;
}

int64_t int_or(const gguf::GgufFile& file, const std::string& key, int64_t fallback) {
  const gguf::Value* v = file.find(key);
  return v != nullptr ? v->as_int(key) : fallback;
}

std::string string_or(const gguf::GgufFile& file, const std::string& key,
                      const std::string& fallback) {
  const gguf::Value* v = file.find(key);
  return v != nullptr ? v->as_string(key) : fallback;
}

std::vector<float> optional_f32_tensor(const gguf::GgufFile& file, const std::string& name,
                                       int64_t n) {
  const gguf::TensorInfo* t = file.find_tensor(name);
  if (t == nullptr) return {};
  if (t->n_elements != static_cast<uint64_t>(n))
    throw Error(file.name() + ": tensor " + name + " has " + std::to_string(t->n_elements) +
                " elements, expected " + std::to_string(n));
  if (t->type != gguf::TensorType::F32)
    throw Error(file.name() + ": tensor " + name + " has type " +
                gguf::tensor_type_name(t->type) + ", expected F32");
  std::vector<float> out(static_cast<size_t>(n));
  kernels::dequantize_row(kernels::WeightType::F32, t->data, out.data(), n);
  for (const float f : out)
    if (!(std::isfinite(f) && f > 0.0f))
      throw Error(file.name() + ": tensor " + name + " holds a factor that is not positive");
  return out;
}

float linear_rope_scale(const gguf::GgufFile& file, const std::string& arch) {
  const std::string type = string_or(file, arch + ".rope.scaling.type", "none");
  const float factor = float_or(file, arch + ".rope.scaling.factor", 1.0f);
  if (type == "none" || (type == "linear" && factor == 1.0f)) return 1.0f;
  if (type == "linear") {
    if (!(factor > 0.0f))
      throw Error(file.name() + ": metadata " + arch + ".rope.scaling.factor must be positive");
    return 1.0f / factor;
  }
  throw Error(file.name() + ": RoPE scaling '" + type + "' (" + arch +
              ".rope.scaling.type) is not supported; supported: none, linear, and the "
              "frequency factors of Llama 3 and Phi-3");
}

}  // namespace arch_keys

}  // namespace tokenfab
