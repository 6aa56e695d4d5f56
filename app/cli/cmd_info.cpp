// info: what a GGUF file is — architecture, hyperparameters, every tensor's type and shape, the
// file's type mix and bits per weight, size, sha256 — and whether Tokenfab can run it. Works on
// any valid GGUF file: one whose architecture or tensor types Tokenfab cannot run is described
// all the same, with the reason it cannot run.

#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "cli_common.h"
#include "core/common/error.h"
#include "core/common/sha256.h"
#include "core/gguf/gguf_reader.h"
#include "core/gguf/type_mix.h"
#include "core/model/model_files.h"
#include "core/model/model_library.h"

namespace tokenfab::cli {

namespace {

// A dimension list as "[576, 49152]" (ggml order: the contiguous dimension first).
std::string shape_text(const std::vector<uint64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

// The hyperparameters a file states under `<arch>.`, whatever the architecture: the keys most
// families share, each present or not.
nlohmann::json stated_hparams(const gguf::GgufFile& file, const std::string& arch) {
  nlohmann::json j = nlohmann::json::object();
  const std::pair<const char*, const char*> keys[] = {
      {"n_layer", "block_count"},
      {"n_embd", "embedding_length"},
      {"n_ff", "feed_forward_length"},
      {"n_head", "attention.head_count"},
      {"n_kv_head", "attention.head_count_kv"},
      {"n_ctx_train", "context_length"},
      {"head_dim", "attention.key_length"},
      {"rope_dim", "rope.dimension_count"}};
  for (const auto& [name, key] : keys) {
    const gguf::Value* v = file.find(arch + "." + key);
    if (v != nullptr && v->is_integer()) j[name] = v->as_int(key);
  }
  for (const auto& [name, key] : {std::pair{"rope_freq_base", "rope.freq_base"},
                                  std::pair{"rms_eps", "attention.layer_norm_rms_epsilon"}}) {
    const gguf::Value* v = file.find(arch + "." + key);
    if (v != nullptr) {
      try {
        j[name] = v->as_float(key);
      } catch (const Error&) {
      }
    }
  }
  return j;
}

nlohmann::json describe(const std::filesystem::path& path) {
  const gguf::GgufFile file = gguf::GgufFile::open(path);
  const gguf::Value* arch_value = file.find("general.architecture");
  const std::string arch = arch_value != nullptr && arch_value->type() == gguf::ValueType::String
                               ? arch_value->as_string()
                               : std::string();
  const gguf::Value* name = file.find("general.name");
  nlohmann::json j = {
      {"path", path.string()},
      {"name", name != nullptr && name->type() == gguf::ValueType::String ? name->as_string()
                                                                           : std::string()},
      {"architecture", arch},
      {"gguf_version", file.version()},
      {"tensor_count", file.tensors().size()},
      {"file_size", file.file_size()},
  };
  if (const std::optional<std::string> ft = gguf::stated_file_type(file)) j["file_type"] = *ft;

  // Every tensor, and the mix by type: tensors, elements, bytes, share of the tensor bytes.
  nlohmann::json tensors = nlohmann::json::array();
  for (const gguf::TensorInfo& t : file.tensors())
    tensors.push_back({{"name", t.name},
                       {"type", gguf::tensor_type_name(t.type)},
                       {"shape", t.dims},
                       {"bytes", t.n_bytes}});
  const gguf::TypeMix mix = gguf::type_mix(file);
  nlohmann::json types = nlohmann::json::object(), counts = nlohmann::json::object();
  for (const auto& [type, m] : mix.by_type) {
    counts[type] = m.tensors;
    types[type] = {{"tensors", m.tensors},
                   {"elements", m.elements},
                   {"bytes", m.bytes},
                   {"bytes_fraction", mix.bytes_fraction(type)}};
  }
  j["tensor_types"] = counts;  // tensors by type
  j["type_mix"] = types;
  j["bits_per_weight"] = mix.bits_per_weight();
  j["tensors"] = tensors;

  // Whether Tokenfab runs it: the model loaded as the engine loads it, or the reason it cannot be.
  try {
    const auto model = LlamaModel::load(path);
    const HParams& h = model->hparams();
    j.update({{"runnable", true},
              {"n_vocab", h.n_vocab},
              {"n_ctx_train", h.n_ctx_train},
              {"n_embd", h.n_embd},
              {"n_ff", h.n_ff},
              {"n_layer", h.n_layer},
              {"n_head", h.n_head},
              {"n_kv_head", h.n_kv_head},
              {"head_dim", h.head_dim},
              {"rope_dim", h.rot_dim},
              {"rope_freq_base", h.rope_base},
              {"rms_eps", h.rms_eps},
              {"output_tied", model->output_is_tied()},
              {"weight_bytes_per_token", model->weight_bytes()}});
  } catch (const Error& e) {
    j["runnable"] = false;
    j["not_runnable_because"] = e.what();
    if (!arch.empty()) j.update(stated_hparams(file, arch));
  }
  j["sha256"] = sha256_file(path);
  return j;
}

void print_text(const nlohmann::json& j) {
  for (const auto& [key, value] : j.items()) {
    if (key == "tensors" || key == "type_mix" || key == "tensor_types") continue;
    std::cout << key << ": " << (value.is_string() ? value.get<std::string>() : value.dump())
              << "\n";
  }
  std::cout << "type mix:\n";
  for (const auto& [type, m] : j["type_mix"].items())
    std::cout << "  " << type << ": " << m["tensors"].get<int64_t>() << " tensors, "
              << m["bytes"].get<uint64_t>() << " bytes ("
              << static_cast<int>(m["bytes_fraction"].get<double>() * 1000.0 + 0.5) / 10.0
              << " %)\n";
  std::cout << "tensors:\n";
  for (const auto& t : j["tensors"])
    std::cout << "  " << t["name"].get<std::string>() << "  " << t["type"].get<std::string>()
              << "  " << shape_text(t["shape"].get<std::vector<uint64_t>>()) << "\n";
}

void run_info(const CommonOptions& o) {
  const nlohmann::json j = describe(resolve_model_path(o.model));
  if (o.json) {
    print_json(j);
  } else {
    print_text(j);
  }
}

}  // namespace

void register_info(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "info",
      "describe a GGUF file: architecture, hyperparameters, each tensor's type and shape, the "
      "type mix and bits per weight, and whether Tokenfab can run it");
  auto o = std::make_shared<CommonOptions>();
  add_model_option(*cmd, *o);
  add_json_option(*cmd, *o);
  cmd->callback([o] { run_info(*o); });
}

}  // namespace tokenfab::cli
