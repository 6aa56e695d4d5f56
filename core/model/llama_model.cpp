#include "core/model/llama_model.h"

#include <algorithm>
#include <array>
#include <cstdint>

#include "core/common/log.h"
#include "core/gguf/file_type.h"
#include "core/model/quant_mix.h"
#include "core/model/requantize_rows.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cpu/repack.h"

#include <sys/mman.h>

namespace tokenfab {

namespace {

// Sizes and counts: positive, and within int32 (what head counts and head sizes are kept in; real
// models are far below it).
int64_t get_positive(const gguf::GgufFile& file, const std::string& key) {
  const int64_t value = file.get(key).as_int(key);
  if (value <= 0)
    throw Error(file.name() + ": metadata " + key + " must be positive, got " +
                std::to_string(value));
  if (value > INT32_MAX)
    throw Error(file.name() + ": metadata " + key + " is " + std::to_string(value) +
                ", more than any model has (at most " + std::to_string(INT32_MAX) + ")");
  return value;
}

int64_t get_positive_or(const gguf::GgufFile& file, const std::string& key, int64_t fallback) {
  return file.find(key) != nullptr ? get_positive(file, key) : fallback;
}

float get_float_or(const gguf::GgufFile& file, const std::string& key, float fallback) {
  const gguf::Value* v = file.find(key);
  return v != nullptr ? static_cast<float>(v->as_float(key)) : fallback;
}

}  // namespace

HParams HParams::from_gguf(const gguf::GgufFile& file) {
  HParams h;
  h.architecture = file.get("general.architecture").as_string("general.architecture");
  // An architecture outside the list is refused before any of its keys is read.
  if (!is_supported_architecture(h.architecture))
    throw Error(file.name() + ": unsupported architecture '" + h.architecture +
                "' (general.architecture); supported: " + supported_architectures_text());
  const std::string p = h.architecture + ".";
  h.n_layer = get_positive(file, p + "block_count");
  h.n_embd = get_positive(file, p + "embedding_length");
  h.n_ff = get_positive(file, p + "feed_forward_length");
  h.n_head = static_cast<int>(get_positive(file, p + "attention.head_count"));
  h.n_kv_head = static_cast<int>(get_positive_or(file, p + "attention.head_count_kv", h.n_head));
  h.n_ctx_train = get_positive_or(file, p + "context_length", 2048);
  h.rope_base = get_float_or(file, p + "rope.freq_base", 10000.0f);
  h.rms_eps = get_float_or(file, p + "attention.layer_norm_rms_epsilon", 1e-5f);
  if (file.find(p + "attention.key_length") == nullptr && h.n_embd % h.n_head != 0)
    throw Error(file.name() + ": embedding_length " + std::to_string(h.n_embd) +
                " is not a multiple of attention.head_count " + std::to_string(h.n_head));
  if (h.n_head % h.n_kv_head != 0)
    throw Error(file.name() + ": attention.head_count " + std::to_string(h.n_head) +
                " is not a multiple of attention.head_count_kv " + std::to_string(h.n_kv_head));
  h.head_dim = static_cast<int>(get_positive_or(file, p + "attention.key_length", h.n_embd / h.n_head));
  const int64_t value_length = get_positive_or(file, p + "attention.value_length", h.head_dim);
  if (value_length != h.head_dim)
    throw Error(file.name() + ": attention.value_length " + std::to_string(value_length) +
                " differs from attention.key_length " + std::to_string(h.head_dim) +
                ", which tokenfab does not support");
  if (h.head_dim % 2 != 0)
    throw Error(file.name() + ": the head size " + std::to_string(h.head_dim) + " must be even");
  h.rot_dim = static_cast<int>(get_positive_or(file, p + "rope.dimension_count", h.head_dim));
  if (h.rot_dim > h.head_dim || h.rot_dim % 2 != 0)
    throw Error(file.name() + ": rope.dimension_count " + std::to_string(h.rot_dim) +
                " must be even and at most the head size " + std::to_string(h.head_dim));
  if (h.rope_base <= 0.0f) throw Error(file.name() + ": rope.freq_base must be positive");
  if (!(h.rms_eps > 0.0f)) throw Error(file.name() + ": layer_norm_rms_epsilon must be positive");
  describe_architecture(file, h);
  return h;
}

std::optional<kernels::WeightType> kernel_type_of(gguf::TensorType type) {
  using gguf::TensorType;
  using kernels::WeightType;
  switch (type) {
    case TensorType::F32:
      return WeightType::F32;
    case TensorType::F16:
      return WeightType::F16;
    case TensorType::BF16:
      return WeightType::BF16;
    case TensorType::Q4_0:
      return WeightType::Q4_0;
    case TensorType::Q4_1:
      return WeightType::Q4_1;
    case TensorType::Q8_0:
      return WeightType::Q8_0;
    case TensorType::Q5_0:
      return WeightType::Q5_0;
    case TensorType::Q5_1:
      return WeightType::Q5_1;
    case TensorType::Q2_K:
      return WeightType::Q2_K;
    case TensorType::Q3_K:
      return WeightType::Q3_K;
    case TensorType::Q4_K:
      return WeightType::Q4_K;
    case TensorType::Q5_K:
      return WeightType::Q5_K;
    case TensorType::Q6_K:
      return WeightType::Q6_K;
    case TensorType::IQ4_NL:
      return WeightType::IQ4_NL;
    case TensorType::IQ4_XS:
      return WeightType::IQ4_XS;
    default:
      return std::nullopt;
  }
}

gguf::TensorType tensor_type_of(kernels::WeightType type) {
  using gguf::TensorType;
  using kernels::WeightType;
  switch (type) {
    case WeightType::F32:
      return TensorType::F32;
    case WeightType::F16:
      return TensorType::F16;
    case WeightType::BF16:
      return TensorType::BF16;
    case WeightType::Q4_0:
      return TensorType::Q4_0;
    case WeightType::Q4_1:
      return TensorType::Q4_1;
    case WeightType::Q8_0:
      return TensorType::Q8_0;
    case WeightType::Q5_0:
      return TensorType::Q5_0;
    case WeightType::Q5_1:
      return TensorType::Q5_1;
    case WeightType::Q2_K:
      return TensorType::Q2_K;
    case WeightType::Q3_K:
      return TensorType::Q3_K;
    case WeightType::Q4_K:
      return TensorType::Q4_K;
    case WeightType::Q5_K:
      return TensorType::Q5_K;
    case WeightType::Q6_K:
      return TensorType::Q6_K;
    case WeightType::IQ4_NL:
      return TensorType::IQ4_NL;
    case WeightType::IQ4_XS:
      return TensorType::IQ4_XS;
  }
  throw Error("tensor_type_of: unknown weight type");
}

std::string supported_types_text() {
  using kernels::WeightType;
  std::string text;
  for (const WeightType t :
       {WeightType::F32, WeightType::F16, WeightType::BF16, WeightType::Q8_0, WeightType::Q6_K,
        WeightType::Q5_K, WeightType::Q5_1, WeightType::Q5_0, WeightType::Q4_K, WeightType::Q4_1,
        WeightType::Q4_0, WeightType::IQ4_NL, WeightType::IQ4_XS, WeightType::Q3_K,
        WeightType::Q2_K})
    text += (text.empty() ? "" : ", ") + std::string(kernels::weight_type_name(t));
  return text;
}

kernels::WeightType weight_type_for(const gguf::TensorInfo& tensor, const std::string& file) {
  if (const std::optional<kernels::WeightType> type = kernel_type_of(tensor.type)) return *type;
  throw Error(file + ": tensor " + tensor.name + " has type " +
              gguf::tensor_type_name(tensor.type) +
              ", which tokenfab cannot compute on (supported: " + supported_types_text() + ")");
}

namespace {

std::string shape_string(const std::vector<uint64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

// Refuses a tensor whose blocks hold a scale that is not finite (a NaN or Inf fp16 d, dmin or
// m): every product with it would be NaN. Reads two or four bytes per block, once, at load.
void check_scales(const gguf::GgufFile& file, const std::string& name, kernels::WeightType type,
                  const uint8_t* data, int64_t rows, int64_t cols) {
  if (!kernels::is_block_quantized(type)) return;
  const uint64_t row_bytes = kernels::row_bytes(type, static_cast<uint64_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    const std::string bad =
        kernels::describe_bad_block(type, data + static_cast<uint64_t>(r) * row_bytes, cols);
    if (!bad.empty())
      throw Error(file.name() + ": tensor " + name + " row " + std::to_string(r) + ": " + bad);
  }
}

// A matrix stored as GGUF dims [cols, rows] (ggml order: dims[0] is contiguous).
WeightMatrix load_matrix(const gguf::GgufFile& file, const std::string& name, int64_t rows,
                         int64_t cols) {
  const gguf::TensorInfo& t = file.tensor(name);
  if (t.dims.size() != 2 || t.dims[0] != static_cast<uint64_t>(cols) ||
      t.dims[1] != static_cast<uint64_t>(rows))
    throw Error(file.name() + ": tensor " + name + " has shape " + shape_string(t.dims) +
                ", expected [" + std::to_string(cols) + ", " + std::to_string(rows) + "]");
  WeightMatrix m;
  m.name = name;
  m.type = weight_type_for(t, file.name());
  // The GGUF reader already refuses such a tensor (its byte size would not be whole blocks);
  // this names the requirement in the model's terms.
  const int block = kernels::block_elements(m.type);
  if (cols % block != 0)
    throw Error(file.name() + ": tensor " + name + ": rows of " + std::to_string(cols) +
                " elements are not a multiple of " + std::to_string(block) + ", which " +
                kernels::weight_type_name(m.type) +
                (block == kernels::kQK_K ? "'s super-blocks need" : "'s blocks need"));
  // The activations are quantized in blocks of 32 for every quantized type, and the float
  // kernels read rows 32 elements at a time.
  if (cols % kernels::kQK != 0)
    throw Error(file.name() + ": tensor " + name + ": rows of " + std::to_string(cols) +
                " elements are not a multiple of 32, which the kernels need");
  check_scales(file, name, m.type, t.data, rows, cols);
  m.rows = rows;
  m.cols = cols;
  m.row_bytes = kernels::row_bytes(m.type, static_cast<uint64_t>(cols));
  m.data = t.data;
  return m;
}

std::vector<float> load_vector(const gguf::GgufFile& file, const std::string& name, int64_t n) {
  const gguf::TensorInfo& t = file.tensor(name);
  if (t.n_elements != static_cast<uint64_t>(n))
    throw Error(file.name() + ": tensor " + name + " has " + std::to_string(t.n_elements) +
                " elements, expected " + std::to_string(n));
  const kernels::WeightType type = weight_type_for(t, file.name());
  if (n % kernels::block_elements(type) != 0)
    throw Error(file.name() + ": tensor " + name + ": " + std::to_string(n) +
                " elements are not a multiple of " + std::to_string(kernels::block_elements(type)) +
                ", which " + kernels::weight_type_name(type) + "'s blocks need");
  check_scales(file, name, type, t.data, 1, n);
  std::vector<float> out(static_cast<size_t>(n));
  kernels::dequantize_row(type, t.data, out.data(), n);
  return out;
}

// Rows [first, first + count) of m: a matrix that a fused tensor holds (phi3's attn_qkv).
WeightMatrix row_view(const WeightMatrix& m, int64_t first, int64_t count) {
  WeightMatrix v = m;
  v.rows = count;
  v.data = m.row(first);
  return v;
}

// One layer's tensors under `p` ("blk.N."), those of the family's extras (Architecture) included.
void load_layer(const gguf::GgufFile& f, const HParams& h, const std::string& p, LayerWeights& l) {
  const Architecture& a = h.arch;
  const int64_t q_dim = h.q_dim(), kv_dim = h.kv_dim();
  l.attn_norm = load_vector(f, p + "attn_norm.weight", h.n_embd);
  if (a.fused_qkv) {
    const WeightMatrix qkv = load_matrix(f, p + "attn_qkv.weight", q_dim + 2 * kv_dim, h.n_embd);
    l.wq = row_view(qkv, 0, q_dim);
    l.wk = row_view(qkv, q_dim, kv_dim);
    l.wv = row_view(qkv, q_dim + kv_dim, kv_dim);
  } else {
    l.wq = load_matrix(f, p + "attn_q.weight", q_dim, h.n_embd);
    l.wk = load_matrix(f, p + "attn_k.weight", kv_dim, h.n_embd);
    l.wv = load_matrix(f, p + "attn_v.weight", kv_dim, h.n_embd);
  }
  if (a.qkv_bias) {
    l.bq = load_vector(f, p + "attn_q.bias", q_dim);
    l.bk = load_vector(f, p + "attn_k.bias", kv_dim);
    l.bv = load_vector(f, p + "attn_v.bias", kv_dim);
  }
  if (a.qk_norm) {
    l.q_norm = load_vector(f, p + "attn_q_norm.weight", h.head_dim);
    l.k_norm = load_vector(f, p + "attn_k_norm.weight", h.head_dim);
  }
  l.wo = load_matrix(f, p + "attn_output.weight", h.n_embd, q_dim);
  l.ffn_norm = load_vector(f, p + "ffn_norm.weight", h.n_embd);
  if (a.fused_gate_up) {
    const WeightMatrix gate_up = load_matrix(f, p + "ffn_up.weight", 2 * h.n_ff, h.n_embd);
    l.w_gate = row_view(gate_up, 0, h.n_ff);
    l.w_up = row_view(gate_up, h.n_ff, h.n_ff);
  } else {
    l.w_gate = load_matrix(f, p + "ffn_gate.weight", h.n_ff, h.n_embd);
    l.w_up = load_matrix(f, p + "ffn_up.weight", h.n_ff, h.n_embd);
  }
  l.w_down = load_matrix(f, p + "ffn_down.weight", h.n_embd, h.n_ff);
  if (a.post_norms) {
    l.post_attn_norm = load_vector(f, p + "post_attention_norm.weight", h.n_embd);
    l.post_ffn_norm = load_vector(f, p + "post_ffw_norm.weight", h.n_embd);
  }
  const auto quantized = [](const WeightMatrix& m) { return kernels::is_block_quantized(m.type); };
  if (quantized(l.w_gate) != quantized(l.w_up) || quantized(l.wq) != quantized(l.wk) ||
      quantized(l.wq) != quantized(l.wv))
    throw Error(f.name() + ": layer " + p + " mixes quantized and float types among matrices "
                "that share an input");
}

}  // namespace

std::unique_ptr<LlamaModel> LlamaModel::load(const std::filesystem::path& path, bool repack) {
  auto model = std::unique_ptr<LlamaModel>(new LlamaModel(gguf::GgufFile::open(path)));
  const gguf::GgufFile& f = model->file_;
  HParams& h = model->hparams_;
  h = HParams::from_gguf(f);

  const gguf::TensorInfo& embd = f.tensor("token_embd.weight");
  if (embd.dims.size() != 2 || embd.dims[0] != static_cast<uint64_t>(h.n_embd))
    throw Error(f.name() + ": tensor token_embd.weight has shape " + shape_string(embd.dims) +
                ", expected [" + std::to_string(h.n_embd) + ", n_vocab]");
  h.n_vocab = static_cast<int64_t>(embd.dims[1]);
  model->token_embd_ = load_matrix(f, "token_embd.weight", h.n_vocab, h.n_embd);
  model->output_norm_ = load_vector(f, "output_norm.weight", h.n_embd);
  model->output_tied_ = f.find_tensor("output.weight") == nullptr;
  model->output_ = model->output_tied_ ? model->token_embd_
                                       : load_matrix(f, "output.weight", h.n_vocab, h.n_embd);

  // At least six tensors per layer: a block count the file cannot hold is refused before
  // anything is allocated for its layers.
  if (static_cast<uint64_t>(h.n_layer) > f.tensors().size() / 6)
    throw Error(f.name() + ": metadata " + h.architecture + ".block_count is " +
                std::to_string(h.n_layer) + ", but the file holds only " +
                std::to_string(f.tensors().size()) + " tensors (each layer has at least 6)");
  model->layers_.resize(static_cast<size_t>(h.n_layer));
  for (int64_t i = 0; i < h.n_layer; ++i)
    load_layer(f, h, "blk." + std::to_string(i) + ".", model->layers_[static_cast<size_t>(i)]);
  if (repack) model->repack_for_cpu();
  logger("model")->info("loaded {} ({} layers, n_embd {}, vocab {})", f.name(), h.n_layer, h.n_embd,
                        h.n_vocab);
  return model;
}

std::vector<WeightMatrix*> LlamaModel::matrices() {
  std::vector<WeightMatrix*> all{&output_};
  for (auto& l : layers_)
    for (WeightMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
      all.push_back(m);
  return all;
}

namespace {

// Drops the file pages under [p, p + n) from this process's resident set (they stay in the page
// cache and fault back in if read again). Used after a matrix has been copied into the packed arena
// so the process does not hold both copies.
void release_file_pages(const uint8_t* p, uint64_t n) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace

void LlamaModel::repack_for_cpu(bool release_source) {
  constexpr uint64_t kAlign = 2u << 20;
  std::vector<WeightMatrix*> to_repack;
  for (WeightMatrix* m : matrices()) {
    m->group_rows = kernels::preferred_group_rows(m->type, m->rows);
    if (m->group_rows != 0) to_repack.push_back(m);
  }
  uint64_t total = 0;
  for (const WeightMatrix* m : to_repack) total += m->bytes();
  if (total == 0) return;
  const uint64_t rounded = (total + kAlign - 1) / kAlign * kAlign;
  repacked_.reset(static_cast<uint8_t*>(std::aligned_alloc(kAlign, rounded)));
  if (!repacked_)
    throw Error("not enough memory to repack " + std::to_string(total >> 20) + " MiB of weights");
  madvise(repacked_.get(), rounded, MADV_HUGEPAGE);
  uint8_t* out = repacked_.get();
  for (WeightMatrix* m : to_repack) {
    kernels::repack(m->type, m->group_rows, m->data, m->row_bytes, out, m->rows, m->cols);
    m->packed = out;
    out += m->bytes();
    // The embedding lookup keeps reading token_embd rows from the file, a few at a time.
    if (release_source) release_file_pages(m->data, m->bytes());
  }
  repacked_bytes_ = total;
}

kernels::MatmulJob matmul_job(const WeightMatrix& m, float* y, int64_t ldy) {
  if (m.packed != nullptr) return {m.type, m.packed, m.rows, y, ldy, m.group_rows};
  return {m.type, m.data, m.rows, y, ldy, 0};
}

uint64_t LlamaModel::weight_bytes() const {
  uint64_t total = output_.bytes();
  for (const auto& l : layers_)
    total += l.wq.bytes() + l.wk.bytes() + l.wv.bytes() + l.wo.bytes() + l.w_gate.bytes() +
             l.w_up.bytes() + l.w_down.bytes();
  return total;
}

void LlamaModel::requantize(kernels::WeightType type, int threads) {
  using kernels::WeightType;
  if (type == WeightType::F32 || type == WeightType::BF16)
    throw Error(std::string("cannot re-quantize the target to ") + kernels::weight_type_name(type) +
                " (expected F16 or a block type)");
  std::vector<WeightType> types;
  for (const WeightMatrix* m : matrices()) {
    const gguf::TensorType fitted =
        quant_fallback(tensor_type_of(type), static_cast<uint64_t>(m->cols));
    types.push_back(*kernel_type_of(fitted));
  }
  requantize_matrices(types, threads, kernels::weight_type_name(type));
}

void LlamaModel::requantize_mix(uint32_t file_type, int threads) {
  const MixModel mix_model = MixModel::from_gguf(file_);
  const std::vector<gguf::TensorType> mix = quant_mix(mix_model, file_type);
  std::vector<kernels::WeightType> types;
  for (const WeightMatrix* m : matrices()) {
    const auto at = std::find_if(mix_model.tensors.begin(), mix_model.tensors.end(),
                                 [m](const MixTensor& t) { return t.name == m->name; });
    if (at == mix_model.tensors.end())  // every matrix was loaded from one of the file's tensors
      throw Error(file_.name() + ": no tensor " + m->name + " to re-quantize");
    const gguf::TensorType type = mix[static_cast<size_t>(at - mix_model.tensors.begin())];
    const std::optional<kernels::WeightType> kernel_type = kernel_type_of(type);
    if (!kernel_type)  // the mixtures only choose types the kernels have
      throw Error(m->name + ": the mixture chose " + gguf::tensor_type_name(type));
    types.push_back(*kernel_type);
  }
  requantize_matrices(types, threads, *gguf::file_type_name(file_type));
}

void LlamaModel::requantize_matrices(const std::vector<kernels::WeightType>& types, int threads,
                                     const std::string& what) {
  std::vector<WeightMatrix*> all = matrices();
  uint64_t total = 0;
  for (size_t i = 0; i < all.size(); ++i)
    total += kernels::row_bytes(types[i], static_cast<uint64_t>(all[i]->cols)) *
             static_cast<uint64_t>(all[i]->rows);
  std::vector<uint8_t> arena(total);
  uint8_t* out = arena.data();
  for (size_t i = 0; i < all.size(); ++i) {
    WeightMatrix* m = all[i];
    const uint64_t bytes = kernels::row_bytes(types[i], static_cast<uint64_t>(m->cols));
    requantize_rows(m->type, m->data, types[i], out, m->rows, m->cols, threads);
    m->type = types[i];
    m->row_bytes = bytes;
    m->data = out;
    m->packed = nullptr;
    m->group_rows = 0;
    out += bytes * static_cast<uint64_t>(m->rows);
  }
  requantized_ = std::move(arena);
  repacked_.reset();
  repacked_bytes_ = 0;
  repack_for_cpu(/*release_source=*/false);
  logger("model")->info("re-quantized the target's matrices to {} ({} MiB)", what, total >> 20);
}

void LlamaModel::embed(int32_t token, float* out) const {
  kernels::dequantize_row(token_embd_.type, token_embd_.row(token), out, hparams_.n_embd);
  const float scale = hparams_.arch.embedding_scale;
  if (scale != 1.0f)
    for (int64_t i = 0; i < hparams_.n_embd; ++i) out[i] *= scale;
}

}  // namespace tokenfab
