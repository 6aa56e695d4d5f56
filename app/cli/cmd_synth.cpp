// synth: write a synthetic Llama model (a real shape, random weights) for speed and memory
// benchmarks. Its output is noise; the file says so in general.name and tokenfab.synthetic.

#include <filesystem>
#include <iostream>
#include <map>
#include <memory>

#include "cli_common.h"
#include "core/common/error.h"
#include "core/gguf/gguf_reader.h"
#include "core/model/synthetic_model.h"

namespace tokenfab::cli {

namespace {

struct SynthCommand {
  std::string shape;
  std::string type = "q4_1";
  std::string out;
  uint64_t seed = 1;
  bool json = false;
};

void run_synth(const SynthCommand& c) {
  const std::optional<SyntheticShape> shape = SyntheticShape::preset(c.shape);
  if (!shape)
    throw Error("--shape: unknown shape " + c.shape);  // CLI11 checks first; kept for safety
  const auto type = weight_types().find(c.type);
  if (type == weight_types().end()) throw Error("--type: unknown type " + c.type);
  const std::filesystem::path out(c.out);
  if (out.has_parent_path() && !std::filesystem::is_directory(out.parent_path()))
    throw Error("--out: directory " + out.parent_path().string() + " does not exist");

  write_synthetic_llama(out, *shape, type->second, c.seed);
  if (c.json) {
    // Tensors by type, as written: a super-block type's fallbacks show here.
    nlohmann::json counts = nlohmann::json::object();
    const gguf::GgufFile written = gguf::GgufFile::open(out);  // outlives the loop over its tensors
    for (const gguf::TensorInfo& t : written.tensors()) {
      const std::string name = gguf::tensor_type_name(t.type);
      counts[name] = counts.value(name, 0) + 1;
    }
    print_json({{"path", out.string()},
                {"shape", shape->name},
                {"type", c.type},
                {"bytes", std::filesystem::file_size(out)},
                {"tensor_types", counts}});
    return;
  }
  std::cout << out.string() << std::endl;
}

}  // namespace

const std::map<std::string, kernels::WeightType>& weight_types() {
  using kernels::WeightType;
  static const std::map<std::string, WeightType> types = {
      {"f32", WeightType::F32},       {"f16", WeightType::F16},   {"bf16", WeightType::BF16},
      {"q8_0", WeightType::Q8_0},     {"q6_k", WeightType::Q6_K}, {"q5_k", WeightType::Q5_K},
      {"q5_1", WeightType::Q5_1},     {"q5_0", WeightType::Q5_0}, {"q4_k", WeightType::Q4_K},
      {"q4_1", WeightType::Q4_1},     {"q4_0", WeightType::Q4_0}, {"iq4_nl", WeightType::IQ4_NL},
      {"iq4_xs", WeightType::IQ4_XS}, {"q3_k", WeightType::Q3_K}, {"q2_k", WeightType::Q2_K},
  };
  return types;
}

void register_synth(CLI::App& app) {
  auto c = std::make_shared<SynthCommand>();
  auto* cmd = app.add_subcommand(
      "synth", "write a synthetic model (a real shape with random weights) for benchmarks");
  std::vector<std::string> shapes = SyntheticShape::preset_names();
  std::vector<std::string> types;
  for (const auto& [name, type] : weight_types()) types.push_back(name);
  cmd->add_option("--shape", c->shape, "model shape")->required()->check(CLI::IsMember(shapes));
  cmd->add_option("--type", c->type,
                  "weight type of the matrices (norms stay F32); a K-quant or iq4_xs falls back "
                  "as llama-quantize does where 256 does not divide a matrix's rows (q4_k → q5_0 "
                  "for smollm2-135m's 576-wide rows)")
      ->capture_default_str()
      ->check(CLI::IsMember(types));
  cmd->add_option("--out", c->out, "GGUF file to write")->required();
  cmd->add_option("--seed", c->seed, "random seed (same seed, same file)")->capture_default_str();
  cmd->add_flag("--json", c->json,
                "print {path, shape, type, bytes, tensor_types} as one JSON object");
  cmd->footer(
      "Writing holds the whole file in memory: ~100 MB for smollm2-135m at q4_1, ~5 GB for "
      "llama3-8b at q4_1 (~16 GB at f16, ~32 GB at f32).");
  cmd->callback([c] { run_synth(*c); });
}

}  // namespace tokenfab::cli
