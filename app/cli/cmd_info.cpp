// info: what a GGUF model is — architecture, hyperparameters, tensors by type, size, sha256.

#include <filesystem>
#include <iostream>
#include <map>
#include <memory>

#include "cli_common.h"
#include "core/common/sha256.h"
#include "core/model/model_files.h"

namespace tokenfab::cli {

static void run_info(const CommonOptions& o) {
  const auto path = resolve_model_path(o.model);
  const auto model = LlamaModel::load(path);
  const HParams& h = model->hparams();
  std::map<std::string, int> types;
  for (const auto& t : model->file().tensors()) ++types[gguf::tensor_type_name(t.type)];
  const std::string sha = sha256_file(path);
  const gguf::Value* name = model->file().find("general.name");

  nlohmann::json j = {
      {"path", path.string()},
      {"name", name != nullptr ? name->as_string() : ""},
      {"architecture", h.architecture},
      {"gguf_version", model->file().version()},
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
      {"tensor_count", model->file().tensors().size()},
      {"tensor_types", types},
      {"weight_bytes_per_token", model->weight_bytes()},
      {"file_size", model->file().file_size()},
      {"sha256", sha},
  };
  if (o.json) {
    print_json(j);
    return;
  }
  for (const auto& [key, value] : j.items())
    std::cout << key << ": " << (value.is_string() ? value.get<std::string>() : value.dump())
              << "\n";
}

void register_info(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "describe a model file");
  auto o = std::make_shared<CommonOptions>();
  add_model_option(*cmd, *o);
  add_json_option(*cmd, *o);
  cmd->callback([o] { run_info(*o); });
}

}  // namespace tokenfab::cli
