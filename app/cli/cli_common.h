#pragma once
// What every tokenfab-cli subcommand shares: the common flags, loading the model and tokenizer,
// and printing one JSON object on stdout.

#include <map>
#include <memory>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/device/device.h"
#include "core/model/llama_model.h"
#include "core/runtime/sampler.h"
#include "core/tokenizer/tokenizer.h"

namespace tokenfab::cli {

struct CommonOptions {
  std::optional<std::string> model;
  int threads = 0;  // 0: all hardware threads
  bool json = false;
};

void add_model_option(CLI::App& cmd, CommonOptions& o);
void add_threads_option(CLI::App& cmd, CommonOptions& o);
void add_json_option(CLI::App& cmd, CommonOptions& o);
void add_sampling_options(CLI::App& cmd, SamplingParams& s);

int resolve_threads(int requested);

struct LoadedModel {
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<Tokenizer> tokenizer;
};
LoadedModel load_model(const CommonOptions& o);

void print_json(const nlohmann::json& j);
// A benchmark's result: one JSON line with --json, indented JSON for people otherwise.
void print_report(const nlohmann::json& j, bool as_json);
// --model, --threads and --json together (every command that runs the model).
void add_run_options(CLI::App& cmd, CommonOptions& o);

// A benchmark prompt of exactly n tokens: ordinary English prose written for this project,
// tokenized and repeated, starting `offset` tokens in (so that streams differ).
std::vector<TokenId> bench_prompt(const Tokenizer& tokenizer, int n, int offset);

// The one device a benchmark runs on, from --device ("cpu", "cpu:N" or "cuda:N"), checked
// without a model: throws Error for a list of several devices, or a CUDA device this build or
// machine lacks (so that a benchmark fails before it writes a synthetic model).
DeviceSpec bench_device_spec(const std::string& device);

// How a benchmark's GPU device launches and what its decode GEMVs read (CudaOptions), as the
// flags give them: --launch-overlap on|off, --decode-weights bf16|blocks, --gemv-split-k on|off,
// --tiled-prompt-attention on|off, --chains-on-decode-kernel on|off, --fused-epilogues on|off,
// --fused-layers on|tensor-cores|off, --cuda-families on|off. The defaults are CudaOptions' (the
// code of the last GPU run where a newer variant waits for one).
struct GpuBenchOptions {
  std::string launch_overlap = "on";
  std::string decode_weights = "bf16";
  std::string gemv_split_k = "off";
  std::string tiled_prompt_attention = "off";
  std::string chains_on_decode_kernel = "off";
  std::string fused_epilogues = "off";
  std::string fused_layers = "off";   // off, on, or tensor-cores
  std::string cuda_families = "off";  // CudaOptions::families

  bool block_gemv() const { return decode_weights == "blocks"; }
  // The settings, for a benchmark's JSON, and what `device` made of them:
  // fused_layers_blocks, the fused decode layers' grid (0: the layered kernels ran, as they do
  // where the fused layers are unavailable), and fused_phases (fused_phases_json).
  void report(nlohmann::json& j, Device& device) const;
};

// The fused decode layers' time per step by phase since the device was made or last asked
// (cuda_fused_phase_times, in µs: qkv, attention, o, gate_up, down, tail, and the steps it
// averages), or null where no fused step ran.
nlohmann::json fused_phases_json(Device& device);

// --fused-layers' help, for the benchmarks' flags and the engine's.
inline constexpr const char* kFusedLayersHelp =
    "GPU: a step of decode rows runs all its layers in one cooperative kernel (one launch, "
    "grid-wide barriers between a layer's phases) instead of five launches a layer: 'on' with "
    "the GEMV's arithmetic (steps of up to 128 rows), 'tensor-cores' with its products on tensor "
    "cores (up to 256 rows)";

// Adds --launch-overlap, --decode-weights, --gemv-split-k, --tiled-prompt-attention,
// --chains-on-decode-kernel, --fused-epilogues, --fused-layers and --cuda-families to `cmd`,
// stored in `options`.
void add_gpu_bench_options(CLI::App& cmd, GpuBenchOptions& options);

// The one device a benchmark runs on, from --device ("cpu", "cpu:N" or "cuda:N"): a CPU virtual
// device with `threads` threads or a CUDA device set up as `gpu` says, either with a KV pool of
// kv_blocks blocks. Throws Error for a list of several devices, or a CUDA device this build or
// machine lacks.
std::unique_ptr<Device> make_bench_device(const std::string& device, const LlamaModel& model,
                                          int threads, int32_t kv_blocks, int32_t block_size,
                                          const GpuBenchOptions& gpu = {});

// The weight types `synth` writes, by their CLI names (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1,
// q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs).
const std::map<std::string, kernels::WeightType>& weight_types();

// Registration of each subcommand (cmd_*.cpp).
void register_fetch(CLI::App& app);
void register_info(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_generate(CLI::App& app);
void register_chat(CLI::App& app);
void register_bench(CLI::App& app);
void register_perplexity(CLI::App& app);
void register_batch_bench(CLI::App& app);
void register_synth(CLI::App& app);
void register_serve_bench(CLI::App& app);
void register_heads(CLI::App& app);
void register_devices(CLI::App& app);
void register_quantize(CLI::App& app);
void register_serve(CLI::App& app);

}  // namespace tokenfab::cli

namespace tokenfab {
struct GenerateOptions;
struct EngineConfig;
}  // namespace tokenfab
namespace tokenfab::cli {
// --max-tokens, --ctx and the sampling flags (shared by generate and chat).
void add_generation_options(CLI::App& cmd, GenerateOptions& g, int64_t& ctx);
// The engine's devices, pools and scheduling flags (serve-bench, generate, chat).
void add_engine_options(CLI::App& cmd, EngineConfig& e);
}  // namespace tokenfab::cli
