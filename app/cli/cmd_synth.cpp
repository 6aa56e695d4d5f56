// synth: write a synthetic Llama model (a real shape, random weights) for speed and memory
// benchmarks. Its output is noise; the file says so in general.name and tokenfab.synthetic.

#include <filesystem>
#include <iostream>
#include <map>
#include <memory>

#include "cli_common.h"
#include "core/common/error.h"
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
    print_json({{"path", out.string()},
                {"shape", shape->name},
                {"type", c.type},
                {"bytes", std::filesystem::file_size(out)}});
    return;
  }
  std::cout << out.string() << std::endl;
}

}  // namespace

const std::map<std::string, kernels::WeightType>& weight_types() {
  static const std::map<std::string, kernels::WeightType> types = {
      {"f32", kernels::WeightType::F32},   {"f16", kernels::WeightType::F16},
      {"bf16", kernels::WeightType::BF16}, {"q8_0", kernels::WeightType::Q8_0},
      {"q4_0", kernels::WeightType::Q4_0}, {"q4_1", kernels::WeightType::Q4_1},
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
  cmd->add_option("--type", c->type, "weight type of the matrices (norms stay F32)")
      ->capture_default_str()
      ->check(CLI::IsMember(types));
  cmd->add_option("--out", c->out, "GGUF file to write")->required();
  cmd->add_option("--seed", c->seed, "random seed (same seed, same file)")->capture_default_str();
  cmd->add_flag("--json", c->json, "print {path, shape, type, bytes} as one JSON object");
  cmd->footer(
      "Writing holds the whole file in memory: ~100 MB for smollm2-135m at q4_1, ~5 GB for "
      "llama3-8b at q4_1 (~16 GB at f16, ~32 GB at f32).");
  cmd->callback([c] { run_synth(*c); });
}

}  // namespace tokenfab::cli
