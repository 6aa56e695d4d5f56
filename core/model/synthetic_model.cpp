#include "core/model/synthetic_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <thread>

#include "core/common/error.h"
#include "core/common/log.h"
#include "core/gguf/gguf_writer.h"
#include "core/model/architecture.h"
#include "core/model/llama_model.h"
#include "core/model/quant_mix.h"
#include "kernels/cpu/quantize.h"

namespace tokenfab {

namespace {

constexpr float kWeightStd = 0.02f;  // std of every random matrix element and of norm noise
constexpr float kRmsEps = 1e-5f;
// Below this many elements a tensor is generated on the calling thread only.
constexpr int64_t kParallelElements = int64_t{1} << 20;

// ChatML, written like SmolLM2's template (a default system turn when the conversation has
// none), which ChatTemplate renders with its Jinja implementation.
constexpr const char* kChatTemplate =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a synthetic model with random weights; your replies are "
    "noise.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

// splitmix64 (Steele, Lea, Flood 2014): a tiny generator with good statistics, the same on every
// platform (std::normal_distribution is not), so a seed names one file everywhere.
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t state = a ^ (b * 0xD1B54A32D192ED03ull);
  return splitmix64(state);
}

// Normal samples by Box–Muller. One generator per row (seeded from seed, tensor, row), so the
// values do not depend on how rows are split over threads.
class NormalRng {
 public:
  explicit NormalRng(uint64_t seed) : state_(seed) {}
  float next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = 1.0 - uniform();  // (0, 1]: log stays finite
    const double u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double theta = 2.0 * std::numbers::pi * u2;
    spare_ = static_cast<float>(r * std::sin(theta));
    has_spare_ = true;
    return static_cast<float>(r * std::cos(theta));
  }

 private:
  double uniform() { return static_cast<double>(splitmix64(state_) >> 11) * 0x1.0p-53; }  // [0, 1)
  uint64_t state_;
  float spare_ = 0.0f;
  bool has_spare_ = false;
};

// Calls fn(begin, end) over [0, n) split across the hardware threads (one call when n is small).
template <class Fn>
void parallel_rows(int64_t n, int64_t elements, const Fn& fn) {
  const int64_t threads = elements < kParallelElements
                              ? 1
                              : std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, n);
  if (threads == 1) {
    fn(int64_t{0}, n);
    return;
  }
  std::vector<std::jthread> team;
  for (int64_t t = 0; t < threads; ++t)
    team.emplace_back([&fn, n, threads, t] { fn(n * t / threads, n * (t + 1) / threads); });
}

// (rows, cols) normal(0, kWeightStd) values in `type`: rows × row_bytes(type, cols) bytes.
std::vector<uint8_t> random_matrix(int64_t rows, int64_t cols, kernels::WeightType type,
                                   uint64_t tensor_seed) {
  const uint64_t row_bytes = kernels::row_bytes(type, static_cast<uint64_t>(cols));
  std::vector<uint8_t> out(row_bytes * static_cast<uint64_t>(rows));
  parallel_rows(rows, rows * cols, [&](int64_t begin, int64_t end) {
    std::vector<float> row(static_cast<size_t>(cols));  // (cols) f32 before quantization
    for (int64_t r = begin; r < end; ++r) {
      NormalRng rng(mix(tensor_seed, static_cast<uint64_t>(r)));
      for (float& v : row) v = kWeightStd * rng.next();
      kernels::quantize_row(type, row.data(), out.data() + static_cast<uint64_t>(r) * row_bytes,
                            cols);
    }
  });
  return out;
}

// (n) F32 values 1 + normal(0, kWeightStd), as bytes.
std::vector<uint8_t> random_norm(int64_t n, uint64_t tensor_seed) {
  std::vector<uint8_t> out(static_cast<size_t>(n) * sizeof(float));
  NormalRng rng(tensor_seed);
  for (int64_t i = 0; i < n; ++i) {
    const float v = 1.0f + kWeightStd * rng.next();
    std::memcpy(out.data() + i * sizeof(float), &v, sizeof v);
  }
  return out;
}

// llama.cpp's general.file_type of a file whose matrices are all `type` (a super-block type's
// "mostly" file type, e.g. Q4_K_S for Q4_K: llama-quantize --pure writes the same).
uint32_t file_type_of(kernels::WeightType type) {
  using kernels::WeightType;
  switch (type) {
    case WeightType::F32:
      return 0;
    case WeightType::F16:
      return 1;
    case WeightType::Q4_0:
      return 2;
    case WeightType::Q4_1:
      return 3;
    case WeightType::Q8_0:
      return 7;
    case WeightType::Q5_0:
      return 8;
    case WeightType::Q5_1:
      return 9;
    case WeightType::Q2_K:
      return 10;
    case WeightType::Q3_K:
      return 11;
    case WeightType::Q4_K:
      return 14;
    case WeightType::Q5_K:
      return 16;
    case WeightType::Q6_K:
      return 18;
    case WeightType::IQ4_NL:
      return 25;
    case WeightType::IQ4_XS:
      return 30;
    case WeightType::BF16:
      return 32;
  }
  return 0;
}

// The GPT-2 byte-to-unicode character for `byte`, as UTF-8: printable bytes stand for
// themselves, the other 68 map to U+0100 + n in byte order.
std::string gpt2_byte_text(int byte) {
  const auto printable = [](int b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  int code = byte;
  if (!printable(byte)) {
    code = 256;
    for (int b = 0; b < byte; ++b) code += printable(b) ? 0 : 1;
  }
  std::string utf8;
  if (code < 0x80) {
    utf8 += static_cast<char>(code);
  } else {  // every code here is below U+0800: two bytes
    utf8 += static_cast<char>(0xC0 | (code >> 6));
    utf8 += static_cast<char>(0x80 | (code & 0x3F));
  }
  return utf8;
}

void add_tokenizer(gguf::GgufWriter& w, int64_t n_vocab) {
  constexpr int32_t kNormal = 1, kControl = 3, kUnused = 5;  // tokenizer.ggml.token_type values
  std::vector<std::string> tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  std::vector<int32_t> types(tokens.size(), kControl);
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(gpt2_byte_text(b));
    types.push_back(kNormal);
  }
  while (static_cast<int64_t>(tokens.size()) < n_vocab) {
    tokens.push_back("<|synthetic_" + std::to_string(tokens.size()) + "|>");
    types.push_back(kUnused);
  }
  gguf::Value::Array type_values;
  type_values.reserve(types.size());
  for (int32_t t : types) type_values.push_back(gguf::Value::i32(t));

  w.add("tokenizer.ggml.model", gguf::Value::string("gpt2"));
  w.add("tokenizer.ggml.pre", gguf::Value::string("default"));
  w.add("tokenizer.ggml.tokens", gguf::Value::string_array(tokens));
  w.add("tokenizer.ggml.token_type",
        gguf::Value::array(gguf::ValueType::Int32, std::move(type_values)));
  w.add("tokenizer.ggml.merges", gguf::Value::string_array({}));  // bytes only: no merges
  w.add("tokenizer.ggml.bos_token_id", gguf::Value::u32(1));
  w.add("tokenizer.ggml.eos_token_id", gguf::Value::u32(2));
  w.add("tokenizer.ggml.add_bos_token", gguf::Value::boolean(false));
  w.add("tokenizer.chat_template", gguf::Value::string(kChatTemplate));
}

void check_shape(const SyntheticShape& s) {
  const auto fail = [&s](const std::string& what) {
    throw Error("synthetic shape " + s.name + ": " + what);
  };
  if (s.n_vocab < kSyntheticMinVocab || s.n_vocab > (int64_t{1} << 31) - 1)
    fail("n_vocab " + std::to_string(s.n_vocab) + " must be in [" +
         std::to_string(kSyntheticMinVocab) + ", 2^31) (the byte tokenizer needs 259 entries)");
  if (s.n_layer <= 0 || s.n_ctx <= 0 || s.n_head <= 0 || s.n_kv_head <= 0)
    fail("n_layer, n_ctx, n_head and n_kv_head must be positive");
  if (s.n_embd <= 0 || s.n_embd % kernels::kQK != 0 || s.n_ff <= 0 || s.n_ff % kernels::kQK != 0)
    fail("n_embd and n_ff must be positive multiples of 32");
  if (s.head_dim == 0 && (s.n_embd % s.n_head != 0 || (s.n_embd / s.n_head) % 2 != 0))
    fail("n_embd must be n_head times an even head size");
  if (s.head_dim < 0 || s.head_dim % 2 != 0) fail("head_dim must be even");
  if (!is_supported_architecture(s.architecture))
    fail("architecture " + s.architecture + " is not one of " + supported_architectures_text());
  if ((s.architecture == "gemma2" || s.architecture == "gemma3") && s.sliding_window <= 0)
    fail("gemma needs a sliding window");
  if (s.n_head % s.n_kv_head != 0) fail("n_head must be a multiple of n_kv_head");
  if (!(s.rope_freq_base > 0.0f)) fail("rope_freq_base must be positive");
}

int head_size(const SyntheticShape& s) {
  return s.head_dim > 0 ? s.head_dim : static_cast<int>(s.n_embd / s.n_head);
}

void add_hparams(gguf::GgufWriter& w, const SyntheticShape& s, kernels::WeightType type,
                 uint64_t seed) {
  const auto u32 = [](int64_t v) { return gguf::Value::u32(static_cast<uint32_t>(v)); };
  const std::string a = s.architecture + ".";
  w.add("general.architecture", gguf::Value::string(s.architecture));
  w.add("general.name", gguf::Value::string("synthetic " + s.name + " (random weights)"));
  w.add("general.description",
        gguf::Value::string("Random weights with the shape of " + s.name +
                            ", written by tokenfab for speed and memory benchmarks; its output is "
                            "noise."));
  w.add("general.file_type", gguf::Value::u32(file_type_of(type)));
  w.add("tokenfab.synthetic", gguf::Value::boolean(true));
  w.add("tokenfab.synthetic.shape", gguf::Value::string(s.name));
  w.add("tokenfab.synthetic.seed", gguf::Value::u64(seed));
  w.add(a + "vocab_size", u32(s.n_vocab));
  w.add(a + "context_length", u32(s.n_ctx));
  w.add(a + "embedding_length", u32(s.n_embd));
  w.add(a + "block_count", u32(s.n_layer));
  w.add(a + "feed_forward_length", u32(s.n_ff));
  w.add(a + "attention.head_count", u32(s.n_head));
  w.add(a + "attention.head_count_kv", u32(s.n_kv_head));
  w.add(a + "rope.freq_base", gguf::Value::f32(s.rope_freq_base));
  w.add(a + "rope.dimension_count", u32(head_size(s)));
  w.add(a + "attention.layer_norm_rms_epsilon", gguf::Value::f32(kRmsEps));
  if (s.head_dim > 0) {
    w.add(a + "attention.key_length", u32(s.head_dim));
    w.add(a + "attention.value_length", u32(s.head_dim));
  }
  if (s.sliding_window > 0) w.add(a + "attention.sliding_window", u32(s.sliding_window));
  if (s.architecture == "gemma2") {  // Gemma 2's own values
    w.add(a + "attn_logit_softcapping", gguf::Value::f32(50.0f));
    w.add(a + "final_logit_softcapping", gguf::Value::f32(30.0f));
  }
  if (s.architecture == "phi3") {
    w.add(a + "rope.scaling.attn_factor", gguf::Value::f32(1.19f));
    w.add(a + "rope.scaling.original_context_length", u32(s.n_ctx));
  }
}

// (n) F32 RoPE frequency factors rising from 1 to `top` over the dimension pairs, as Llama 3's
// rope_freqs and Phi-3's LongRoPE factors do (the long wavelengths stretched most).
std::vector<uint8_t> rope_factors(int64_t n, float top) {
  std::vector<uint8_t> out(static_cast<size_t>(n) * sizeof(float));
  for (int64_t i = 0; i < n; ++i) {
    const float f = 1.0f + (top - 1.0f) * static_cast<float>(i) / static_cast<float>(n - 1);
    std::memcpy(out.data() + i * sizeof(float), &f, sizeof f);
  }
  return out;
}

}  // namespace

SyntheticShape SyntheticShape::smollm2_135m() {
  SyntheticShape s{"smollm2-135m", 49152, 576, 1536, 30, 9, 3, 8192};
  s.rope_freq_base = 100000.0f;
  s.tied_output = true;
  return s;
}

SyntheticShape SyntheticShape::llama3_8b() {
  SyntheticShape s{"llama3-8b", 128256, 4096, 14336, 32, 32, 8, 8192};
  s.rope_freq_base = 500000.0f;
  s.tied_output = false;
  return s;
}

SyntheticShape SyntheticShape::llama_mini() {
  SyntheticShape s{"llama-mini", 2048, 512, 1536, 16, 8, 2, 2048};
  s.rope_freq_base = 10000.0f;
  s.tied_output = false;
  return s;
}

SyntheticShape SyntheticShape::family_tiny(const std::string& architecture) {
  SyntheticShape s{architecture + "-tiny", 512, 256, 512, 4, 4, 2, 4096};
  s.architecture = architecture == "llama3" ? "llama" : architecture;
  s.tied_output = false;
  if (architecture == "llama3") {
    s.rope_freqs = true;
    s.rope_freq_base = 500000.0f;
  } else if (architecture == "qwen2") {
    s.rope_freq_base = 1000000.0f;
    s.tied_output = true;
  } else if (architecture == "qwen3") {
    s.head_dim = 96;  // q_dim 384 against a width of 256, as Qwen 3's key_length allows
    s.rope_freq_base = 1000000.0f;
  } else if (architecture == "gemma2" || architecture == "gemma3") {
    s.n_layer = architecture == "gemma3" ? 6 : 4;  // gemma3: layer 5 is the global one
    s.sliding_window = 8;
    s.head_dim = 64;
    s.n_kv_head = 1;
    s.tied_output = true;
    s.rope_freq_base = architecture == "gemma3" ? 1000000.0f : 10000.0f;
  } else if (architecture == "phi3") {
    s.n_kv_head = 4;
  } else {
    throw Error("no tiny synthetic shape for " + architecture);
  }
  return s;
}

namespace {
constexpr const char* kTinyFamilies[] = {"llama3", "qwen2", "qwen3", "gemma2", "gemma3", "phi3"};
}

std::optional<SyntheticShape> SyntheticShape::preset(std::string_view name) {
  if (name == "smollm2-135m") return smollm2_135m();
  if (name == "llama3-8b") return llama3_8b();
  if (name == "llama-mini") return llama_mini();
  for (const char* family : kTinyFamilies)
    if (name == std::string(family) + "-tiny") return family_tiny(family);
  return std::nullopt;
}

std::vector<std::string> SyntheticShape::preset_names() {
  std::vector<std::string> names = {"smollm2-135m", "llama3-8b", "llama-mini"};
  for (const char* family : kTinyFamilies) names.push_back(std::string(family) + "-tiny");
  return names;
}

void write_synthetic_llama(const std::filesystem::path& path, const SyntheticShape& shape,
                           kernels::WeightType matrix_type, uint64_t seed,
                           std::optional<gguf::TensorType> override_one_tensor_type) {
  check_shape(shape);
  const int64_t head_dim = head_size(shape);
  const int64_t q_dim = head_dim * shape.n_head;
  const int64_t kv_dim = head_dim * shape.n_kv_head;
  const std::string& arch = shape.architecture;
  const bool gemma = arch == "gemma2" || arch == "gemma3";
  const bool phi3 = arch == "phi3";

  gguf::GgufWriter w;
  add_hparams(w, shape, matrix_type, seed);
  add_tokenizer(w, shape.n_vocab);

  // Tensor k's values come from mix(seed, k): every tensor differs, and the file is a pure
  // function of (shape, type, seed, override).
  uint64_t tensor_index = 0;
  int fallbacks = 0;
  const auto matrix = [&](const std::string& name, int64_t rows, int64_t cols) {
    const uint64_t tensor_seed = mix(seed, tensor_index++);
    const std::vector<uint64_t> dims = {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)};
    if (override_one_tensor_type && name == kSyntheticOverrideTensor) {
      const gguf::TensorType type = *override_one_tensor_type;
      if (const auto kernel_type = kernel_type_of(type)) {
        w.add_tensor(name, type, dims, random_matrix(rows, cols, *kernel_type, tensor_seed));
        return;
      }
      std::string why;
      const auto size = gguf::tensor_size(static_cast<uint32_t>(type), dims, &why);
      if (!size)
        throw Error("synthetic model: cannot store " + name + " as " +
                    gguf::tensor_type_name(type) + ": " + why);
      w.add_tensor(name, type, dims, std::vector<uint8_t>(size->n_bytes, 0));
      return;
    }
    // A super-block type whose blocks do not divide the rows falls back as llama-quantize does.
    const gguf::TensorType type =
        quant_fallback(tensor_type_of(matrix_type), static_cast<uint64_t>(cols));
    if (type != tensor_type_of(matrix_type)) ++fallbacks;
    w.add_tensor(name, type, dims, random_matrix(rows, cols, *kernel_type_of(type), tensor_seed));
  };
  const auto vector = [&](const std::string& name, int64_t n) {
    w.add_tensor(name, gguf::TensorType::F32, {static_cast<uint64_t>(n)},
                 random_norm(n, mix(seed, tensor_index++)));
  };
  const auto norm = [&](const std::string& name) { vector(name, shape.n_embd); };

  matrix("token_embd.weight", shape.n_vocab, shape.n_embd);
  if (shape.rope_freqs)
    w.add_tensor("rope_freqs.weight", gguf::TensorType::F32, {static_cast<uint64_t>(head_dim / 2)},
                 rope_factors(head_dim / 2, 8.0f));
  if (phi3) {  // LongRoPE's two sets, as the 128k models' files hold them
    w.add_tensor("rope_factors_long.weight", gguf::TensorType::F32,
                 {static_cast<uint64_t>(head_dim / 2)}, rope_factors(head_dim / 2, 6.0f));
    w.add_tensor("rope_factors_short.weight", gguf::TensorType::F32,
                 {static_cast<uint64_t>(head_dim / 2)}, rope_factors(head_dim / 2, 2.0f));
  }
  for (int64_t i = 0; i < shape.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    norm(p + "attn_norm.weight");
    if (phi3) {
      matrix(p + "attn_qkv.weight", q_dim + 2 * kv_dim, shape.n_embd);
    } else {
      matrix(p + "attn_q.weight", q_dim, shape.n_embd);
      matrix(p + "attn_k.weight", kv_dim, shape.n_embd);
      matrix(p + "attn_v.weight", kv_dim, shape.n_embd);
    }
    if (arch == "qwen2") {  // biases: normal(0, 0.02) as the matrices
      for (const auto& [name, n] : {std::pair{"attn_q.bias", q_dim}, std::pair{"attn_k.bias", kv_dim},
                                    std::pair{"attn_v.bias", kv_dim}})
        w.add_tensor(p + name, gguf::TensorType::F32, {static_cast<uint64_t>(n)},
                     random_matrix(1, n, kernels::WeightType::F32, mix(seed, tensor_index++)));
    }
    if (arch == "qwen3" || arch == "gemma3") {
      vector(p + "attn_q_norm.weight", head_dim);
      vector(p + "attn_k_norm.weight", head_dim);
    }
    matrix(p + "attn_output.weight", shape.n_embd, q_dim);
    if (gemma) norm(p + "post_attention_norm.weight");
    norm(p + "ffn_norm.weight");
    if (phi3) {
      matrix(p + "ffn_up.weight", 2 * shape.n_ff, shape.n_embd);
    } else {
      matrix(p + "ffn_gate.weight", shape.n_ff, shape.n_embd);
      matrix(p + "ffn_up.weight", shape.n_ff, shape.n_embd);
    }
    matrix(p + "ffn_down.weight", shape.n_embd, shape.n_ff);
    if (gemma) norm(p + "post_ffw_norm.weight");
  }
  norm("output_norm.weight");
  if (!shape.tied_output) matrix("output.weight", shape.n_vocab, shape.n_embd);

  w.write(path);
  logger("model")->info("wrote synthetic {} ({}, seed {}; {} matrices in a fallback type) to {}",
                        shape.name, kernels::weight_type_name(matrix_type), seed, fallbacks,
                        path.string());
}

}  // namespace tokenfab
