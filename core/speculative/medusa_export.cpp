#include "core/speculative/medusa_export.h"

#include <algorithm>
#include <cmath>
#include <system_error>
#include <vector>

#include "core/common/atomic_file.h"
#include "core/common/error.h"
#include "kernels/cpu/quantize.h"

namespace tokenfab {

namespace fs = std::filesystem;

namespace {

constexpr const char* kConfigFile = "config.json";
constexpr const char* kWeightsFile = "model.safetensors";
constexpr float kF16Max = 65504.0f;

// Our two files, and the hidden temporary files an interrupted export of them may leave
// (AtomicFile's `.NAME.tmp-*`).
bool is_export_file(const std::string& name) {
  for (const std::string ours : {kConfigFile, kWeightsFile})
    if (name == ours || name.starts_with("." + ours + ".tmp-")) return true;
  return false;
}

// Checks DIR and creates it when missing; returns whether it was created here.
bool prepare_directory(const fs::path& dir, bool replace) {
  std::error_code ec;
  const fs::file_status status = fs::status(dir, ec);
  if (fs::exists(status)) {
    if (!fs::is_directory(status))
      throw Error("cannot export to " + dir.string() + ": it is a file, not a directory");
    bool previous = false;
    for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      if (!is_export_file(name))
        throw Error("cannot export to " + dir.string() + ": it holds " + name + " besides " +
                    kConfigFile + " and " + kWeightsFile +
                    " (vLLM reads every *.safetensors file of a checkpoint directory); choose a "
                    "new or empty directory");
      previous = previous || name == kConfigFile || name == kWeightsFile;
    }
    if (previous && !replace)
      throw Error(dir.string() + " already holds an export (" + kConfigFile + ", " + kWeightsFile +
                  "); pass --force to replace it");
    return false;
  }
  if (!fs::create_directories(dir, ec) && ec)
    throw Error("cannot create " + dir.string() + ": " + ec.message());
  return true;
}

std::vector<SafetensorsTensor> medusa_tensors(const DraftHead& head, const LlamaModel& model,
                                              SafetensorsDtype lm_head_dtype) {
  const int64_t d = head.info.n_embd;
  std::vector<SafetensorsTensor> tensors;
  for (int k = 0; k < head.n_heads(); ++k) {
    const float* w = head.w[static_cast<size_t>(k)].data();  // (d, d) out × in, as nn.Linear's
    const float* b = head.b[static_cast<size_t>(k)].data();  // (d)
    const std::string block = "blocks." + std::to_string(k) + ".layers.0.";
    tensors.push_back(
        {block + "weight", SafetensorsDtype::kF32, {d, d}, [w, d](int64_t r, float* out) {
           std::copy_n(w + r * d, d, out);
         }});
    tensors.push_back({block + "bias", SafetensorsDtype::kF32, {d}, [b, d](int64_t, float* out) {
                         std::copy_n(b, d, out);
                       }});
  }
  const WeightMatrix& lm = model.output();  // (n_vocab, n_embd) in the file's rows
  tensors.push_back(
      {"lm_heads.0.weight", lm_head_dtype, {lm.rows, lm.cols}, [&lm](int64_t r, float* out) {
         kernels::dequantize_row(lm.type, lm.row(r), out, lm.cols);
       }});
  return tensors;
}

}  // namespace

void check_medusa_exportable(const DraftHeadInfo& info) {
  if (info.type != "medusa")
    throw Error("head '" + info.name + "' is an " + info.type +
                " head, and vLLM has no format for it: its EAGLE drafters need a decoder layer "
                "with attention, which an mtp head (one residual block over [h; e(x)]) does not "
                "have. Only medusa heads export as medusa-hf");
}

SafetensorsDtype medusa_lm_head_dtype(const LlamaModel& model) {
  const WeightMatrix& lm = model.output();
  if (lm.type == kernels::WeightType::F16) return SafetensorsDtype::kF16;
  if (lm.type == kernels::WeightType::BF16) return SafetensorsDtype::kBF16;
  std::vector<float> row(static_cast<size_t>(lm.cols));
  for (int64_t r = 0; r < lm.rows; ++r) {
    kernels::dequantize_row(lm.type, lm.row(r), row.data(), lm.cols);
    for (float x : row)
      if (std::fabs(x) > kF16Max) return SafetensorsDtype::kBF16;
  }
  return SafetensorsDtype::kF16;
}

nlohmann::ordered_json medusa_hf_config(const DraftHeadInfo& info, SafetensorsDtype lm_head_dtype) {
  // Every name is one MedusaConfig or the Medusa module reads (a misspelt one would be ignored
  // silently). No other key may contain both "num" and "heads" (or "layers"): MedusaConfig's
  // from_pretrained renames every such key to num_heads (num_hidden_layers).
  return {{"model_type", "medusa"},
          {"architectures", {"MedusaModel"}},
          {"hidden_size", info.n_embd},
          {"vocab_size", info.n_vocab},
          {"truncated_vocab_size", info.n_vocab},
          {"num_heads", info.n_heads},
          {"num_hidden_layers", 1},
          {"medusa_fc_bias", true},
          {"original_lm_head", true},
          {"max_paths", 64},
          {"topk", 10},
          {"torch_dtype", lm_head_dtype == SafetensorsDtype::kBF16 ? "bfloat16" : "float16"}};
}

MedusaExport export_medusa_hf(const DraftHead& head, const LlamaModel& model, const fs::path& dir,
                              bool replace) {
  check_medusa_exportable(head.info);
  const WeightMatrix& lm = model.output();
  if (lm.cols != head.info.n_embd || lm.rows != head.info.n_vocab)
    throw Error("head '" + head.info.name + "' (n_embd " + std::to_string(head.info.n_embd) +
                ", n_vocab " + std::to_string(head.info.n_vocab) +
                ") does not fit the LM head of " + model.file().name() + " (" +
                std::to_string(lm.cols) + ", " + std::to_string(lm.rows) + ")");
  const bool created = prepare_directory(dir, replace);
  MedusaExport out;
  out.config_file = dir / kConfigFile;
  out.weights_file = dir / kWeightsFile;
  try {
    out.lm_head_dtype = medusa_lm_head_dtype(model);
    out.config = medusa_hf_config(head.info, out.lm_head_dtype);
    const std::vector<SafetensorsTensor> tensors = medusa_tensors(head, model, out.lm_head_dtype);
    const std::string source = std::string(kernels::weight_type_name(lm.type)) + " " +
                               (model.output_is_tied() ? "token_embd.weight (tied)" : lm.name);
    write_safetensors(out.weights_file, tensors,
                      {{"format", "pt"},
                       {"tokenfab.head", head.info.name},
                       {"tokenfab.domain", head.info.domain},
                       {"tokenfab.base_model_sha256", head.info.base_model_sha256},
                       {"tokenfab.lm_head_source", source}});
    write_file_atomically(out.config_file, out.config.dump(2) + "\n");
    out.weights_bytes = fs::file_size(out.weights_file);
  } catch (...) {
    std::error_code ec;
    if (created) fs::remove_all(dir, ec);  // nothing half-exported left behind
    throw;
  }
  return out;
}

}  // namespace tokenfab
