#include "cli_common.h"

#include <cstdint>
#include <filesystem>
#include <iostream>
#include <limits>
#include <thread>

#include "core/common/error.h"
#include "core/device/cuda_device.h"
#include "core/device/cuda_model.h"
#include "core/model/model_files.h"
#include "core/model/model_library.h"

namespace tokenfab::cli {

void add_model_option(CLI::App& cmd, CommonOptions& o) {
  cmd.add_option("--model", o.model,
                 "GGUF model file (default: the embedded SmolLM2-135M-Instruct)");
}

void add_threads_option(CLI::App& cmd, CommonOptions& o) {
  cmd.add_option("--threads", o.threads, "CPU threads (default: all hardware threads)")
      ->check(CLI::Range(1, 1024));
}

void add_json_option(CLI::App& cmd, CommonOptions& o) {
  cmd.add_flag("--json", o.json, "print one JSON object on stdout and nothing else there");
}

void add_sampling_options(CLI::App& cmd, SamplingParams& s) {
  cmd.add_option("--temperature", s.temperature, "sampling temperature; 0 is greedy")
      ->capture_default_str();
  cmd.add_option("--top-k", s.top_k, "keep the K most likely tokens (0 disables)")
      ->check(CLI::Range(0, std::numeric_limits<int32_t>::max()))
      ->capture_default_str();
  cmd.add_option("--top-p", s.top_p, "nucleus sampling mass (1 disables)")->capture_default_str();
  cmd.add_option("--min-p", s.min_p, "drop tokens below min-p × the top probability")
      ->capture_default_str();
  cmd.add_option("--seed", s.seed, "random seed (same seed, same output)")->capture_default_str();
}

void add_run_options(CLI::App& cmd, CommonOptions& o) {
  add_model_option(cmd, o);
  add_threads_option(cmd, o);
  add_json_option(cmd, o);
}

int resolve_threads(int requested) {
  if (requested > 0) return requested;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

LoadedModel load_model(const CommonOptions& o) {
  LoadedModel loaded;
  const std::filesystem::path path = resolve_model_path(o.model);
  // Refused, with the numbers, before anything is mapped or allocated when the weights and a KV
  // cache of the model's context (at most 4,096 positions) would not fit in this machine's RAM.
  check_fits(path, 0);
  loaded.model = LlamaModel::load(path);
  loaded.tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_gguf(loaded.model->file()));
  if (loaded.tokenizer->n_vocab() > loaded.model->hparams().n_vocab)
    throw Error(loaded.model->file().name() + ": the tokenizer has " +
                std::to_string(loaded.tokenizer->n_vocab()) +
                " tokens but token_embd.weight only " +
                std::to_string(loaded.model->hparams().n_vocab) + " rows");
  return loaded;
}

void print_report(const nlohmann::json& j, bool as_json) {
  if (as_json) {
    print_json(j);
  } else {
    std::cout << j.dump(2) << std::endl;
  }
}

// Invalid UTF-8 in generated text is replaced (U+FFFD) rather than failing the whole output.
void print_json(const nlohmann::json& j) {
  std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
}

}  // namespace tokenfab::cli

namespace tokenfab::cli {

std::vector<TokenId> bench_prompt(const Tokenizer& tokenizer, int n, int offset) {
  static constexpr const char* kText =
      "The workshop opened at seven, when the first light reached the long benches and the smell "
      "of sawdust rose from the floor. Each apprentice knew the order of the morning: sharpen the "
      "chisels, sweep the shavings, check the glue pots, and only then touch the wood. ";
  const std::vector<TokenId> ids = tokenizer.encode(kText, false, false);
  std::vector<TokenId> prompt;
  for (int i = 0; i < n; ++i) prompt.push_back(ids[static_cast<size_t>(offset + i) % ids.size()]);
  return prompt;
}

DeviceSpec bench_device_spec(const std::string& device) {
  const std::vector<DeviceSpec> specs = parse_device_list(device, "--device");
  if (specs.size() != 1)
    throw Error("--device \"" + device + "\": a benchmark runs on one device (e.g. cpu or cuda:0)");
  const DeviceSpec& spec = specs[0];
  if (spec.kind == DeviceKind::kCuda) {
    const CudaInventory gpus = enumerate_cuda_devices();
    const auto n = static_cast<int>(gpus.devices.size());
    if (spec.index >= n)
      throw Error(spec.name() + ": no CUDA device can be used: " +
                  (gpus.reason.empty() ? "this machine has " + std::to_string(n) + " CUDA device" +
                                             (n == 1 ? "" : "s")
                                       : gpus.reason));
  }
  return spec;
}

std::unique_ptr<Device> make_bench_device(const std::string& device, const LlamaModel& model,
                                          int threads, int32_t kv_blocks, int32_t block_size,
                                          const GpuBenchOptions& gpu) {
  const DeviceSpec spec = bench_device_spec(device);
  if (spec.kind == DeviceKind::kCuda) {
    CudaOptions options;
    options.overlap_launches = gpu.launch_overlap != "off";
    options.block_gemv = gpu.block_gemv();
    options.gemv_split_k = gpu.gemv_split_k == "on";
    options.tiled_prompt_attention = gpu.tiled_prompt_attention == "on";
    options.chains_on_decode_kernel = gpu.chains_on_decode_kernel == "on";
    options.fused_epilogues = gpu.fused_epilogues == "on";
    options.fused_layers = gpu.fused_layers != "off";
    options.fused_tensor_cores = gpu.fused_layers == "tensor-cores";
    options.families = gpu.cuda_families == "on";
    return make_cuda_device(spec, model, threads, kv_blocks, block_size, options);
  }
  return std::make_unique<CpuDevice>(spec, model, threads, kv_blocks, block_size);
}

void GpuBenchOptions::report(nlohmann::json& j, Device& device) const {
  j["launch_overlap"] = launch_overlap;
  j["decode_weights"] = decode_weights;
  j["gemv_split_k"] = gemv_split_k;
  j["tiled_prompt_attention"] = tiled_prompt_attention;
  j["chains_on_decode_kernel"] = chains_on_decode_kernel;
  j["fused_epilogues"] = fused_epilogues;
  j["fused_layers"] = fused_layers;
  j["cuda_families"] = cuda_families;
  j["fused_layers_blocks"] = cuda_fused_layers_grid(device);
  j["fused_phases"] = fused_phases_json(device);
}

nlohmann::json fused_phases_json(Device& device) {
  const std::optional<FusedPhaseTimes> t = cuda_fused_phase_times(device);
  if (!t) return nullptr;
  return {{"steps", t->steps},    {"qkv_us", t->qkv_us},         {"attention_us", t->attention_us},
          {"o_us", t->o_us},      {"gate_up_us", t->gate_up_us}, {"down_us", t->down_us},
          {"tail_us", t->tail_us}};
}

void add_gpu_bench_options(CLI::App& cmd, GpuBenchOptions& options) {
  cmd.add_option("--launch-overlap", options.launch_overlap,
                 "GPU: let a decode step's kernels start while the previous one finishes (on a "
                 "GPU of compute capability 9.0 or later), or launch each after the previous")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd.add_option("--decode-weights", options.decode_weights,
                 "GPU: the weights a few-row step's GEMVs read: the BF16 copies, or the file's "
                 "Q4_0/Q4_1/Q8_0 blocks kept beside them")
      ->check(CLI::IsMember({"bf16", "blocks"}))
      ->capture_default_str();
  cmd.add_option("--gemv-split-k", options.gemv_split_k,
                 "GPU: a few-row step's narrow matrices of long rows split each row over a "
                 "block's four warps (not yet run on a GPU), or each warp takes whole rows")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd.add_option("--tiled-prompt-attention", options.tiled_prompt_attention,
                 "GPU: a prompt chunk's attention scores a key tile's 32 keys side by side (not "
                 "yet run on a GPU), or one key at a time")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd.add_option("--chains-on-decode-kernel", options.chains_on_decode_kernel,
                 "GPU: a verified chain of up to 8 rows goes to the decode attention kernel row "
                 "by row and its steps replay CUDA graphs (not yet run on a GPU; always with "
                 "--fused-layers), or a chain of 4 rows or more is attended as a prompt chunk")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd.add_option("--fused-epilogues", options.fused_epilogues,
                 "GPU: a many-row step's residual adds inside the o and down GEMMs, its KV store "
                 "inside the RoPE launch and its attention written in BF16 (10 launches a layer; "
                 "not yet run on a GPU), or each in a launch of its own (14)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd.add_option("--fused-layers", options.fused_layers, kFusedLayersHelp)
      ->check(CLI::IsMember({"on", "tensor-cores", "off"}))
      ->capture_default_str();
  cmd.add_option("--cuda-families", options.cuda_families,
                 "GPU: models of the families other than plain Llama (Llama 3's RoPE factors, "
                 "Qwen 2/3, Gemma 2/3, Phi-3) run on the layered kernels with their features "
                 "(not yet run on a GPU), or are refused on a GPU")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
}

}  // namespace tokenfab::cli
