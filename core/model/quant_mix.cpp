#include "core/model/quant_mix.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <numeric>

#include "core/common/error.h"
#include "core/gguf/file_type.h"

namespace tokenfab {

namespace {

using gguf::TensorType;

// llama.cpp's llama_ftype values of the targets (general.file_type).
enum FileType : uint32_t {
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ8_0 = 7,
  kQ5_0 = 8,
  kQ5_1 = 9,
  kQ2_K = 10,
  kQ3_K_S = 11,
  kQ3_K_M = 12,
  kQ3_K_L = 13,
  kQ4_K_S = 14,
  kQ4_K_M = 15,
  kQ5_K_S = 16,
  kQ5_K_M = 17,
  kQ6_K = 18,
  kIQ4_NL = 25,
  kIQ4_XS = 30,
  kBF16 = 32,
};

struct Target {
  uint32_t file_type;
  TensorType base;  // the type of every tensor no rule moves
};

// Richest first (llama-quantize's sizes for an 8B model).
constexpr std::array<Target, 18> kTargets = {{
    {kF16, TensorType::F16},
    {kBF16, TensorType::BF16},
    {kQ8_0, TensorType::Q8_0},
    {kQ6_K, TensorType::Q6_K},
    {kQ5_1, TensorType::Q5_1},
    {kQ5_K_M, TensorType::Q5_K},
    {kQ5_K_S, TensorType::Q5_K},
    {kQ5_0, TensorType::Q5_0},
    {kQ4_1, TensorType::Q4_1},
    {kQ4_K_M, TensorType::Q4_K},
    {kIQ4_NL, TensorType::IQ4_NL},
    {kQ4_K_S, TensorType::Q4_K},
    {kQ4_0, TensorType::Q4_0},
    {kIQ4_XS, TensorType::IQ4_XS},
    {kQ3_K_L, TensorType::Q3_K},
    {kQ3_K_M, TensorType::Q3_K},
    {kQ3_K_S, TensorType::Q3_K},
    {kQ2_K, TensorType::Q2_K},
}};

const Target* find_target(uint32_t file_type) {
  for (const Target& t : kTargets)
    if (t.file_type == file_type) return &t;
  return nullptr;
}

uint32_t block_elements(TensorType type) {
  return gguf::tensor_type_traits(static_cast<uint32_t>(type))->block_elements;
}

bool is_quantized(TensorType type) {
  return block_elements(type) > 1;
}

// Tensor roles the rules name (llama.cpp matches them by substrings of the name, in this order).
enum class Role {
  kOutput,
  kTokenEmbd,
  kAttnV,
  kAttnK,
  kAttnQ,
  kAttnOutput,
  kFfnUp,
  kFfnGate,
  kFfnDown,
  kOther
};

Role role_of(const std::string& name) {
  const auto has = [&name](const char* part) { return name.find(part) != std::string::npos; };
  if (name == "output.weight") return Role::kOutput;
  if (name == "token_embd.weight" || name == "per_layer_token_embd.weight") return Role::kTokenEmbd;
  // A fused QKV or MLA KV projection counts as attn_v: it holds the values.
  if (has("attn_qkv.weight") || has("attn_kv_b.weight") || has("attn_v.weight"))
    return Role::kAttnV;
  if (has("attn_k.weight")) return Role::kAttnK;
  if (has("attn_q.weight")) return Role::kAttnQ;
  if (has("attn_output.weight")) return Role::kAttnOutput;
  if (has("ffn_up")) return Role::kFfnUp;
  if (has("ffn_gate")) return Role::kFfnGate;
  if (has("ffn_down")) return Role::kFfnDown;
  return Role::kOther;
}

// ggml's dimension count: trailing dimensions of 1 do not count.
size_t dims_that_count(const std::vector<uint64_t>& dims) {
  size_t n = dims.size();
  while (n > 1 && dims[n - 1] == 1) --n;
  return n;
}

// 2-D (or 3-D) weights only; never a norm, an MoE router or a position table.
bool is_quantizable(const MixTensor& t) {
  const std::string& n = t.name;
  if (dims_that_count(t.dims) < 2) return false;
  if (n.size() < 6 || n.compare(n.size() - 6, 6, "weight") != 0) return false;
  for (const char* kept : {"_norm.weight", "ffn_gate_inp.weight", "attn_rel_b.weight"})
    if (n.find(kept) != std::string::npos) return false;
  return n != "position_embd.weight" && n != "token_types.weight";
}

// The layer of "blk.N.…", or -1.
int layer_of(const std::string& name) {
  if (name.rfind("blk.", 0) != 0) return -1;
  int layer = 0;
  size_t i = 4;
  if (i >= name.size() || !std::isdigit(static_cast<unsigned char>(name[i]))) return -1;
  for (; i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])); ++i)
    layer = layer * 10 + (name[i] - '0');
  return layer;
}

// More bits for the first and last eighth of the layers and every third layer between.
bool use_more_bits(int i, int n) {
  return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

struct MixState {
  uint32_t ftype = 0;
  TensorType base = TensorType::F16;
  bool tied = true;        // no output.weight: token_embd.weight is the LM head too
  int n_gqa = 0;           // query heads per KV head
  bool llama_70b = false;  // llama.cpp's LLM_TYPE_70B: 80 layers with grouped KV heads
  int n_layer = 0;
  int n_attn_v = 0;  // tensors of the attn_v role
  int i_attn_v = 0;  // attn_v tensors seen so far (llama.cpp counts them in name order)
  int i_ffn_down = 0;
};

TensorType attn_v_type(MixState& s, TensorType type) {
  const int i = s.i_attn_v++;
  const uint32_t f = s.ftype;
  if (f == kQ2_K)
    type = s.n_gqa >= 4 ? TensorType::Q4_K : TensorType::Q3_K;
  else if (f == kQ3_K_M)
    type = i < 2 ? TensorType::Q5_K : TensorType::Q4_K;
  else if (f == kQ3_K_L)
    type = TensorType::Q5_K;
  else if ((f == kIQ4_NL || f == kIQ4_XS) && s.n_gqa >= 4)
    type = TensorType::Q5_K;
  else if ((f == kQ4_K_M || f == kQ5_K_M) && use_more_bits(i, s.n_attn_v))
    type = TensorType::Q6_K;
  else if (f == kQ4_K_S && i < 4)
    type = TensorType::Q5_K;
  // A 70B model's attn_v is 8× smaller than attn_q (8 query heads per KV head): cheap to enrich.
  if (s.llama_70b && (type == TensorType::Q3_K || type == TensorType::Q4_K))
    type = TensorType::Q5_K;
  return type;
}

TensorType ffn_down_type(MixState& s, TensorType type) {
  const int i = s.i_ffn_down++;
  const int n = s.n_layer;
  const uint32_t f = s.ftype;
  if (f == kQ2_K) return TensorType::Q3_K;
  if (f == kQ3_K_M) return i < n / 16 ? TensorType::Q5_K : TensorType::Q4_K;
  if (f == kQ3_K_L) return TensorType::Q5_K;
  if (f == kQ4_K_M) return use_more_bits(i, n) ? TensorType::Q6_K : type;
  if ((f == kIQ4_NL || f == kIQ4_XS) && i < n / 8) return TensorType::Q5_K;
  if (f == kQ5_K_M && use_more_bits(i, n)) return TensorType::Q6_K;
  if (f == kQ4_K_S && i < n / 8) return TensorType::Q5_K;
  return type;
}

TensorType attn_output_type(const MixState& s, TensorType type) {
  if (s.ftype == kQ2_K) return TensorType::Q3_K;
  if (s.ftype == kQ3_K_M) return TensorType::Q4_K;
  if (s.ftype == kQ3_K_L) return TensorType::Q5_K;
  return type;
}

// The type before the fallback, for a quantizable tensor of a quantized target.
TensorType rule_type(MixState& s, const MixTensor& t, Role role) {
  const TensorType type = s.base;
  if (role == Role::kOutput || (s.tied && role == Role::kTokenEmbd)) {
    if (t.dims[0] % block_elements(type) != 0) return TensorType::Q8_0;
    return type == TensorType::Q8_0 ? TensorType::Q8_0 : TensorType::Q6_K;
  }
  switch (role) {
    case Role::kAttnV:
      return attn_v_type(s, type);
    case Role::kFfnDown:
      return ffn_down_type(s, type);
    case Role::kAttnOutput:
      return attn_output_type(s, type);
    default:
      return type;
  }
}

std::string upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

MixModel MixModel::from_gguf(const gguf::GgufFile& file) {
  MixModel m;
  m.architecture = file.get("general.architecture").as_string("general.architecture");
  const std::string p = m.architecture + ".";
  m.n_layer = file.get(p + "block_count").as_int(p + "block_count");
  m.n_head =
      static_cast<int>(file.get(p + "attention.head_count").as_int(p + "attention.head_count"));
  const gguf::Value* kv = file.find(p + "attention.head_count_kv");
  m.n_kv_head =
      kv != nullptr ? static_cast<int>(kv->as_int(p + "attention.head_count_kv")) : m.n_head;
  m.tensors.reserve(file.tensors().size());
  for (const gguf::TensorInfo& t : file.tensors()) m.tensors.push_back({t.name, t.dims, t.type});
  return m;
}

const std::vector<std::string>& quant_mix_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const Target& t : kTargets) out.push_back(*gguf::file_type_name(t.file_type));
    return out;
  }();
  return names;
}

std::string quant_mix_names_text() {
  std::string text;
  for (const std::string& n : quant_mix_names()) text += (text.empty() ? "" : ", ") + n;
  return text;
}

std::optional<uint32_t> quant_mix_file_type(std::string_view name) {
  const std::string wanted = upper(name);
  for (const Target& t : kTargets)
    if (*gguf::file_type_name(t.file_type) == wanted) return t.file_type;
  return std::nullopt;
}

TensorType quant_fallback(TensorType type, uint64_t row_elements) {
  if (row_elements % block_elements(type) == 0) return type;
  TensorType smaller = type;
  switch (type) {
    case TensorType::Q2_K:
    case TensorType::Q3_K:
      smaller = TensorType::Q4_0;
      break;
    case TensorType::Q4_K:
      smaller = TensorType::Q5_0;
      break;
    case TensorType::Q5_K:
      smaller = TensorType::Q5_1;
      break;
    case TensorType::Q6_K:
      smaller = TensorType::Q8_0;
      break;
    case TensorType::IQ4_XS:
      smaller = TensorType::IQ4_NL;
      break;
    default:
      break;  // already a 32-element type
  }
  return row_elements % block_elements(smaller) == 0 ? smaller : TensorType::F16;
}

std::vector<TensorType> quant_mix(const MixModel& model, uint32_t file_type) {
  const Target* target = find_target(file_type);
  if (target == nullptr) {
    const std::optional<std::string> name = gguf::file_type_name(file_type);
    throw Error("no quantization mixture " + name.value_or(std::to_string(file_type)) +
                " (expected " + quant_mix_names_text() + ")");
  }
  if (model.architecture != "llama")
    throw Error("quantization mixtures are defined for the llama architecture, not '" +
                model.architecture + "'");
  MixState s;
  s.ftype = file_type;
  s.base = target->base;
  s.n_layer = static_cast<int>(model.n_layer);
  s.n_gqa = model.n_kv_head > 0 ? model.n_head / model.n_kv_head : 0;
  s.llama_70b = model.n_layer == 80 && model.n_head != model.n_kv_head;
  for (const MixTensor& t : model.tensors) {
    const Role role = role_of(t.name);
    s.tied &= role != Role::kOutput;
    s.n_attn_v += role == Role::kAttnV;
  }

  // llama-quantize visits tensors by layer (-1 for the rest), then by name; its counters of
  // attn_v and ffn_down tensors follow that order.
  std::vector<size_t> order(model.tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&model](size_t a, size_t b) {
    const MixTensor &x = model.tensors[a], &y = model.tensors[b];
    const int lx = layer_of(x.name), ly = layer_of(y.name);
    return lx != ly ? lx < ly : x.name < y.name;
  });
  std::vector<TensorType> types(model.tensors.size());
  for (const size_t i : order) {
    const MixTensor& t = model.tensors[i];
    if (!is_quantizable(t)) {
      types[i] = t.type;
    } else if (!is_quantized(s.base)) {
      types[i] = s.base;
    } else {
      types[i] = quant_fallback(rule_type(s, t, role_of(t.name)), t.dims[0]);
    }
  }
  return types;
}

}  // namespace tokenfab
