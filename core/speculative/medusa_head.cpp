#include "core/speculative/medusa_head.h"

#include <cmath>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "core/common/error.h"
#include "core/gguf/gguf_reader.h"
#include "core/gguf/gguf_writer.h"
#include "core/speculative/dense_math.h"

namespace tokenfab {

namespace {

constexpr const char* kArchitecture = "tokenfab-draft";
constexpr const char* kPrefix = "tokenfab.draft.";
constexpr int32_t kMaxHeads = 64;
constexpr int32_t kMaxEmbd = 1 << 16;
constexpr int32_t kMaxVocab = 1 << 24;

std::string weight_name(int k) {
  return "medusa." + std::to_string(k) + ".weight";
}
std::string bias_name(int k) {
  return "medusa." + std::to_string(k) + ".bias";
}

bool is_sha256_hex(std::string_view s) {
  if (s.size() != 64) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

std::string sha_prefix(std::string_view sha) {
  return std::string(sha.substr(0, 12)) + "…";
}

void check_info(const DraftHeadInfo& info, const std::string& where) {
  if (info.type != "medusa")
    throw Error(where + ": draft head type '" + info.type + "' is not supported yet");
  if (info.n_heads < 1 || info.n_heads > kMaxHeads)
    throw Error(where + ": n_heads " + std::to_string(info.n_heads) + " is outside [1, " +
                std::to_string(kMaxHeads) + "]");
  if (info.n_embd < 1 || info.n_embd > kMaxEmbd)
    throw Error(where + ": n_embd " + std::to_string(info.n_embd) + " is outside [1, " +
                std::to_string(kMaxEmbd) + "]");
  if (info.n_vocab < 1 || info.n_vocab > kMaxVocab)
    throw Error(where + ": n_vocab " + std::to_string(info.n_vocab) + " is outside [1, " +
                std::to_string(kMaxVocab) + "]");
}

void check_json_object(const std::string& text, const std::string& where) {
  const auto json = nlohmann::json::parse(text, nullptr, false);
  if (json.is_discarded() || !json.is_object()) throw Error(where + " is not a JSON object");
}

// Metadata readers that name the file and the key in every error.
class DraftReader {
 public:
  explicit DraftReader(const gguf::GgufFile& file) : file_(file), where_(file.name()) {}

  const std::string& where() const { return where_; }

  std::string string(const std::string& key) const {
    return value(key).as_string(where_ + ": " + key);
  }
  int32_t int32(const std::string& key) const {
    const int64_t v = value(key).as_int(where_ + ": " + key);
    if (v < INT32_MIN || v > INT32_MAX) throw Error(where_ + ": " + key + " is out of range");
    return static_cast<int32_t>(v);
  }

  // The F32 tensor `name` with dims `dims`, copied out; its values must be finite.
  std::vector<float> tensor(const std::string& name, std::vector<uint64_t> dims) const {
    const gguf::TensorInfo* t = file_.find_tensor(name);
    if (!t) throw Error(where_ + ": missing tensor " + name);
    if (t->type != gguf::TensorType::F32)
      throw Error(where_ + ": tensor " + name + " has type " + gguf::tensor_type_name(t->type) +
                  ", expected F32");
    if (t->dims != dims) {
      std::string want, got;
      for (uint64_t d : dims) want += (want.empty() ? "" : " × ") + std::to_string(d);
      for (uint64_t d : t->dims) got += (got.empty() ? "" : " × ") + std::to_string(d);
      throw Error(where_ + ": tensor " + name + " has shape " + got + ", expected " + want);
    }
    std::vector<float> out(t->n_elements);
    std::memcpy(out.data(), t->data, out.size() * sizeof(float));
    for (float x : out)
      if (!std::isfinite(x)) throw Error(where_ + ": tensor " + name + " holds a non-finite value");
    return out;
  }

 private:
  const gguf::Value& value(const std::string& key) const {
    const gguf::Value* v = file_.find(key);
    if (!v) throw Error(where_ + ": missing metadata key " + key);
    return *v;
  }

  const gguf::GgufFile& file_;
  std::string where_;
};

}  // namespace

void MedusaHead::residual(int head, const float* h, int64_t n, float* z) const {
  const int64_t d = info.n_embd;
  const float* wk = w[static_cast<size_t>(head)].data();
  const float* bk = b[static_cast<size_t>(head)].data();
  dense::gemm_nt(n, d, d, h, d, wk, d, z, d, false);  // z ← W h (rows)
  for (int64_t r = 0; r < n; ++r) {
    float* zr = z + r * d;
    const float* hr = h + r * d;
    for (int64_t j = 0; j < d; ++j) {
      const float u = zr[j] + bk[j];
      zr[j] = hr[j] + u / (1.0f + std::exp(-u));
    }
  }
}

MedusaHead make_medusa_head(DraftHeadInfo info) {
  check_info(info, "draft head '" + info.name + "'");
  MedusaHead head;
  const auto d = static_cast<size_t>(info.n_embd);
  head.w.assign(static_cast<size_t>(info.n_heads), std::vector<float>(d * d, 0.0f));
  head.b.assign(static_cast<size_t>(info.n_heads), std::vector<float>(d, 0.0f));
  head.info = std::move(info);
  return head;
}

void save_draft_head(const MedusaHead& head, const std::filesystem::path& path) {
  const DraftHeadInfo& info = head.info;
  const std::string where = path.string();
  check_info(info, where);
  const auto d = static_cast<uint64_t>(info.n_embd);
  if (head.n_heads() != info.n_heads || head.b.size() != head.w.size())
    throw Error(where + ": the head holds " + std::to_string(head.w.size()) +
                " weight matrices for n_heads " + std::to_string(info.n_heads));
  check_json_object(info.training_config_json, where + ": training_config");
  check_json_object(info.summary_json, where + ": summary");

  gguf::GgufWriter writer;
  writer.add("general.architecture", gguf::Value::string(kArchitecture));
  writer.add("general.name", gguf::Value::string(info.name));
  const std::string p = kPrefix;
  writer.add(p + "type", gguf::Value::string(info.type));
  writer.add(p + "name", gguf::Value::string(info.name));
  writer.add(p + "domain", gguf::Value::string(info.domain));
  writer.add(p + "base_model_sha256", gguf::Value::string(info.base_model_sha256));
  writer.add(p + "n_heads", gguf::Value::i32(info.n_heads));
  writer.add(p + "n_embd", gguf::Value::i32(info.n_embd));
  writer.add(p + "n_vocab", gguf::Value::i32(info.n_vocab));
  writer.add(p + "training_config", gguf::Value::string(info.training_config_json));
  writer.add(p + "summary", gguf::Value::string(info.summary_json));
  for (int32_t i = 0; i < info.n_heads; ++i) {
    const auto& w = head.w[static_cast<size_t>(i)];
    const auto& b = head.b[static_cast<size_t>(i)];
    if (w.size() != d * d || b.size() != d)
      throw Error(where + ": head " + std::to_string(i + 1) + " has the wrong number of weights");
    const auto bytes = [](const std::vector<float>& v) {
      return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()),
                                      v.size() * sizeof(float));
    };
    writer.add_tensor(weight_name(i + 1), gguf::TensorType::F32, {d, d}, bytes(w));
    writer.add_tensor(bias_name(i + 1), gguf::TensorType::F32, {d}, bytes(b));
  }
  writer.write(path);
}

MedusaHead load_draft_head(const std::filesystem::path& path) {
  const gguf::GgufFile file = gguf::GgufFile::open(path);
  const DraftReader r(file);
  const std::string& where = r.where();
  const std::string arch = r.string("general.architecture");
  if (arch != kArchitecture)
    throw Error(where + ": general.architecture is '" + arch + "', expected '" + kArchitecture +
                "' (not a draft-head file)");
  const std::string p = kPrefix;
  DraftHeadInfo info;
  info.type = r.string(p + "type");
  if (info.type != "medusa")
    throw Error(where + ": draft head type '" + info.type + "' is not supported yet");
  info.name = r.string(p + "name");
  info.domain = r.string(p + "domain");
  info.base_model_sha256 = r.string(p + "base_model_sha256");
  if (!is_sha256_hex(info.base_model_sha256))
    throw Error(where + ": " + p + "base_model_sha256 '" + info.base_model_sha256 +
                "' is not a sha256 (64 lowercase hex digits)");
  info.n_heads = r.int32(p + "n_heads");
  info.n_embd = r.int32(p + "n_embd");
  info.n_vocab = r.int32(p + "n_vocab");
  check_info(info, where + ": " + p + "*");
  info.training_config_json = r.string(p + "training_config");
  check_json_object(info.training_config_json, where + ": " + p + "training_config");
  info.summary_json = r.string(p + "summary");
  check_json_object(info.summary_json, where + ": " + p + "summary");

  MedusaHead head;
  const auto d = static_cast<uint64_t>(info.n_embd);
  std::set<std::string> expected;
  for (int32_t k = 1; k <= info.n_heads; ++k) {
    head.w.push_back(r.tensor(weight_name(k), {d, d}));
    head.b.push_back(r.tensor(bias_name(k), {d}));
    expected.insert(weight_name(k));
    expected.insert(bias_name(k));
  }
  for (const gguf::TensorInfo& t : file.tensors())
    if (!expected.count(t.name))
      throw Error(where + ": unexpected tensor " + t.name + " (n_heads is " +
                  std::to_string(info.n_heads) + ")");
  head.info = std::move(info);
  return head;
}

void check_head_matches(const DraftHeadInfo& info, std::string_view model_sha256, int64_t n_embd,
                        int64_t n_vocab, std::string_view model_name) {
  const std::string head = "head '" + info.name + "'";
  if (info.base_model_sha256 != model_sha256)
    throw Error(head + " was trained for model " + sha_prefix(info.base_model_sha256) +
                ", not for " + std::string(model_name) + " (" + sha_prefix(model_sha256) + ")");
  if (info.n_embd != n_embd || info.n_vocab != n_vocab)
    throw Error(head + " has n_embd " + std::to_string(info.n_embd) + " and n_vocab " +
                std::to_string(info.n_vocab) + ", but " + std::string(model_name) + " has " +
                std::to_string(n_embd) + " and " + std::to_string(n_vocab));
}

}  // namespace tokenfab
