// bench: prefill and decode speed of one sequence, as JSON. Each repetition starts from an empty
// cache, prefills a prompt of --prompt-tokens tokens, then decodes --gen-tokens tokens greedily
// (end-of-generation ignored); the medians are reported. On the CPU (--device cpu, the default)
// it runs the single-sequence Generator; on a GPU (--device cuda:N) the CUDA Device over its
// paged pool, one sequence per pass, after one untimed warm-up repetition (cuBLASLt picks its
// algorithms on a shape's first call), with TTFT and each decode step against the device's memory
// roofline: (the weights as the GPU holds them + the KV read) ÷ its peak bandwidth.
// --synthetic SHAPE benchmarks a synthetic model of that shape (random weights, written to a
// temporary file and removed after) instead of --model.
// --verify-rows LIST adds what a speculative verifying step costs on the device: after the
// prompt, one sequence computes n consecutive tokens with every row's greedy choice and hidden
// state (as the engine's step verifying n − 1 drafts of a greedy request does: on a GPU only each
// row's argmax comes back, not its logits), for each n of the list in turn, repeated and
// interleaved so that a drifting host speed shifts every n alike; the median step per n and its
// ratio to the one-row step are reported ("verify").

#include <algorithm>
#include <iostream>
#include <memory>

#include <chrono>
#include <numeric>

#include <unistd.h>
#include <filesystem>

#include "cli_common.h"
#include "core/common/error.h"
#include "core/device/cuda_device.h"
#include "core/device/cuda_model.h"
#include "core/device/device.h"
#include "core/device/roofline.h"
#include "core/model/synthetic_model.h"
#include "core/runtime/generator.h"
#include "core/runtime/kv_storage.h"

namespace tokenfab::cli {

namespace {

struct BenchCommand {
  CommonOptions common;
  int prompt_tokens = 512;
  int gen_tokens = 128;
  int repetitions = 3;
  std::string device = "cpu";
  std::string synthetic;  // a SyntheticShape preset, or empty: --model
  std::string synthetic_type = "q4_0";
  std::vector<int> verify_rows;  // --verify-rows: rows per measured verifying step
  GpuBenchOptions gpu;
};

// A synthetic model written for one benchmark: removed when the benchmark ends.
class SyntheticFile {
 public:
  SyntheticFile(const std::string& shape_name, const std::string& type_name) {
    const std::optional<SyntheticShape> shape = SyntheticShape::preset(shape_name);
    if (!shape) throw Error("--synthetic \"" + shape_name + "\": unknown shape");
    const auto type = weight_types().find(type_name);
    if (type == weight_types().end())
      throw Error("--synthetic-type \"" + type_name + "\": unknown weight type");
    path_ = std::filesystem::temp_directory_path() /
            ("tokenfab-bench-" + shape_name + "-" + std::to_string(::getpid()) + ".gguf");
    std::cerr << "bench: writing a synthetic " << shape_name << " (" << type_name << ") to "
              << path_.string() << std::endl;
    write_synthetic_llama(path_, *shape, type->second, 1);
  }
  ~SyntheticFile() {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }
  SyntheticFile(const SyntheticFile&) = delete;
  SyntheticFile& operator=(const SyntheticFile&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

using Clock = std::chrono::steady_clock;

int verify_most(const BenchCommand& c) {
  return c.verify_rows.empty() ? 0 : *std::max_element(c.verify_rows.begin(), c.verify_rows.end());
}

// A benchmark device's KV pool: blocks 0, 1, … for the prompt and the most tokens after it (the
// generated ones, or the longest verifying step), one sequence holding them all.
constexpr int32_t kBlockSize = 16;
std::vector<int32_t> block_table(const BenchCommand& c) {
  const int32_t tokens = c.prompt_tokens + std::max(c.gen_tokens, verify_most(c));
  std::vector<int32_t> table(static_cast<size_t>((tokens + kBlockSize) / kBlockSize));
  std::iota(table.begin(), table.end(), 0);
  return table;
}

// Refuses a prompt that leaves no room in the model's context for the tokens generated or for
// the longest verifying step, naming the option that does not fit.
void check_context(const BenchCommand& c, int64_t n_ctx) {
  const auto refuse = [&](const std::string& option, int n) {
    throw Error("bench: --prompt-tokens " + std::to_string(c.prompt_tokens) + " + " + option + " " +
                std::to_string(n) + " exceed the model's context of " + std::to_string(n_ctx) +
                " tokens");
  };
  if (c.prompt_tokens + c.gen_tokens > n_ctx) refuse("--gen-tokens", c.gen_tokens);
  if (c.prompt_tokens + verify_most(c) > n_ctx) refuse("--verify-rows", verify_most(c));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct DeviceRun {
  double prefill_tok_s = 0, decode_tok_s = 0, ttft_ms = 0;
  double step_ms = 0;  // median decode step
  // The GPU's own time of the prompt's pass and the median decode step (cuda_last_step_gpu_ms);
  // negative where the device does not keep it.
  double prefill_gpu_ms = -1, step_gpu_ms = -1;
};

// One repetition on a Device: the prompt in one pass, then one pass per generated token.
DeviceRun device_repetition(Device& device, std::span<const TokenId> prompt, int gen_tokens,
                            std::span<const int32_t> table) {
  std::vector<int32_t> tokens(prompt.begin(), prompt.end());
  std::vector<int32_t> argmax;  // greedy: the device takes the argmax, only the id comes back
  const Clock::time_point start = Clock::now();
  BatchSequence seq{tokens, 0, table, true};
  device.run_greedy({&seq, 1}, argmax);
  const Clock::time_point first = Clock::now();
  const std::optional<double> prefill_gpu = cuda_last_step_gpu_ms(device);
  tokens.push_back(argmax[0]);
  std::vector<double> steps, steps_gpu;
  for (int i = 1; i < gen_tokens; ++i) {
    const auto pos = static_cast<int64_t>(tokens.size()) - 1;
    seq = BatchSequence{std::span<const int32_t>(tokens).subspan(static_cast<size_t>(pos), 1), pos,
                        table, true};
    const Clock::time_point step_start = Clock::now();
    device.run_greedy({&seq, 1}, argmax);
    tokens.push_back(argmax[0]);
    steps.push_back(std::chrono::duration<double, std::milli>(Clock::now() - step_start).count());
    if (const std::optional<double> gpu = cuda_last_step_gpu_ms(device)) steps_gpu.push_back(*gpu);
  }
  const Clock::time_point last = Clock::now();
  DeviceRun r;
  const double prefill_s = std::chrono::duration<double>(first - start).count();
  r.ttft_ms = prefill_s * 1e3;
  r.prefill_tok_s = static_cast<double>(prompt.size()) / std::max(1e-9, prefill_s);
  r.decode_tok_s = static_cast<double>(gen_tokens - 1) /
                   std::max(1e-9, std::chrono::duration<double>(last - first).count());
  r.step_ms = median(steps);
  if (prefill_gpu) r.prefill_gpu_ms = *prefill_gpu;
  if (!steps_gpu.empty()) r.step_gpu_ms = median(steps_gpu);
  return r;
}

// Verifying steps of each row count in `rows` over the KV of `prompt` (computed here first):
// `repetitions` rounds, each timing every count five times in list order; medians per count.
nlohmann::json verify_report(Device& device, std::span<const TokenId> prompt,
                             std::span<const int> rows, int repetitions,
                             std::span<const int32_t> table) {
  std::vector<float> hidden;
  std::vector<int32_t> argmax;
  const std::vector<int32_t> tokens(prompt.begin(), prompt.end());
  BatchSequence prefill{tokens, 0, table, true};
  device.run_greedy({&prefill, 1}, argmax);
  const auto pos0 = static_cast<int64_t>(prompt.size());
  const int most = *std::max_element(rows.begin(), rows.end());
  // The tokens verified: the prompt's first ones again (any valid ids do; the KV they write
  // lies past the prompt and is overwritten by the next step).
  std::vector<int32_t> drafts(static_cast<size_t>(most));
  for (int i = 0; i < most; ++i)
    drafts[static_cast<size_t>(i)] = tokens[static_cast<size_t>(i) % tokens.size()];
  std::vector<std::vector<double>> ms(rows.size()), gpu_ms(rows.size());
  // The fused decode layers' phases per row count (their clock restarted before each count's
  // steps, read after them; the last repetition's).
  std::vector<nlohmann::json> phases(rows.size());
  for (int rep = 0; rep < repetitions; ++rep) {
    for (size_t r = 0; r < rows.size(); ++r) {
      fused_phases_json(device);
      for (int i = 0; i < 5; ++i) {
        BatchSequence seq{std::span<const int32_t>(drafts).first(static_cast<size_t>(rows[r])),
                          pos0, table, false, true};
        const Clock::time_point start = Clock::now();
        device.run_greedy({&seq, 1}, argmax, &hidden);
        ms[r].push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
        if (const std::optional<double> gpu = cuda_last_step_gpu_ms(device))
          gpu_ms[r].push_back(*gpu);
      }
      phases[r] = fused_phases_json(device);
    }
  }
  nlohmann::json out = nlohmann::json::array();
  double one_row = 0.0;
  for (size_t r = 0; r < rows.size(); ++r)
    if (rows[r] == 1) one_row = median(ms[r]);
  for (size_t r = 0; r < rows.size(); ++r) {
    const double step = median(ms[r]);
    nlohmann::json e = {{"rows", rows[r]}, {"step_ms", step}};
    if (one_row > 0) e["vs_one_row"] = step / one_row;
    if (!gpu_ms[r].empty()) e["step_gpu_ms"] = median(gpu_ms[r]);
    if (!phases[r].is_null()) e["fused_phases"] = phases[r];
    out.push_back(e);
  }
  return out;
}

void run_device_bench(const BenchCommand& c) {
  bench_device_spec(c.device);  // before a synthetic model is written (an 8B one takes minutes)
  std::unique_ptr<SyntheticFile> synthetic;
  CommonOptions common = c.common;
  if (!c.synthetic.empty()) {
    synthetic = std::make_unique<SyntheticFile>(c.synthetic, c.synthetic_type);
    common.model = synthetic->path().string();
  }
  LoadedModel m = load_model(common);
  const HParams& hp = m.model->hparams();
  const int64_t n_ctx = hp.n_ctx_train;
  check_context(c, n_ctx);
  const std::vector<TokenId> prompt = bench_prompt(*m.tokenizer, c.prompt_tokens, 0);
  const std::vector<int32_t> table = block_table(c);
  const std::unique_ptr<Device> device = make_bench_device(
      c.device, *m.model, 1, static_cast<int32_t>(table.size()), kBlockSize, c.gpu);
  std::vector<double> prefill, decode, ttft, step, prefill_gpu, step_gpu;
  for (int rep = -1; rep < c.repetitions; ++rep) {  // rep −1: the warm-up
    const DeviceRun r = device_repetition(*device, prompt, c.gen_tokens, table);
    if (rep < 0) continue;
    prefill.push_back(r.prefill_tok_s);
    decode.push_back(r.decode_tok_s);
    ttft.push_back(r.ttft_ms);
    step.push_back(r.step_ms);
    if (r.prefill_gpu_ms >= 0) prefill_gpu.push_back(r.prefill_gpu_ms);
    if (r.step_gpu_ms >= 0) step_gpu.push_back(r.step_gpu_ms);
    if (!c.common.json)
      std::cerr << "run " << rep + 1 << ": prefill " << r.prefill_tok_s << " tok/s, decode "
                << r.decode_tok_s << " tok/s" << std::endl;
  }
  nlohmann::json j = {{"prefill_tok_s", median(prefill)},
                      {"decode_tok_s", median(decode)},
                      {"ttft_ms", median(ttft)},
                      {"decode_step_ms", median(step)},
                      // The GPU's own time of the same (CUDA events around a step's stream
                      // work): what the wall times above add to it is the host's.
                      {"prefill_gpu_ms", prefill_gpu.empty() ? nlohmann::json()
                                                             : nlohmann::json(median(prefill_gpu))},
                      {"decode_step_gpu_ms",
                       step_gpu.empty() ? nlohmann::json() : nlohmann::json(median(step_gpu))},
                      {"model", m.model->file().name()},
                      {"synthetic", !c.synthetic.empty()},
                      {"prompt_tokens", c.prompt_tokens},
                      {"gen_tokens", c.gen_tokens},
                      {"repetitions", c.repetitions},
                      {"prefill_tok_s_runs", prefill},
                      {"decode_tok_s_runs", decode},
                      {"device", device->name()},
                      {"backend", "cuda"}};
  c.gpu.report(j, *device);
  // The memory roofline of a decode step at the middle of the generation: every weight byte its
  // GEMVs read (the blocks' where --decode-weights blocks) and the KV of the context, read once
  // at the device's peak bandwidth.
  const CudaInventory inventory = enumerate_cuda_devices();
  const int index = device->spec().index;
  if (index < static_cast<int>(inventory.devices.size()) &&
      inventory.devices[static_cast<size_t>(index)].bandwidth_gbs > 0) {
    const double bandwidth = inventory.devices[static_cast<size_t>(index)].bandwidth_gbs;
    StepWork work;
    work.rows = 1;
    work.logit_rows = 1;
    work.kv_positions = c.prompt_tokens + c.gen_tokens / 2;
    work.attended_positions = work.kv_positions;
    work.compute_s = median(step) / 1e3;
    const RooflinePoint point =
        roofline(work, hp, cuda_decode_weight_bytes(*m.model, c.gpu.block_gemv()), bandwidth,
                 /*peak_gmacs=*/0.0);
    j["bandwidth_gbs"] = bandwidth;
    j["roofline_step_ms"] = point.memory_bound_s * 1e3;
    j["roofline_ratio"] = point.measured_s > 0 ? point.memory_bound_s / point.measured_s : 0.0;
  }
  if (!c.verify_rows.empty())
    j["verify"] = verify_report(*device, prompt, c.verify_rows, c.repetitions, table);
  print_report(j, c.common.json);
}

void run_bench(const BenchCommand& c) {
  if (c.prompt_tokens < 1 || c.gen_tokens < 2 || c.repetitions < 1)
    throw Error("bench needs --prompt-tokens >= 1, --gen-tokens >= 2 and --repetitions >= 1");
  for (const int rows : c.verify_rows)
    if (rows < 1 || rows > 64)
      throw Error("--verify-rows: " + std::to_string(rows) + " rows; each count must be 1..64");
  const std::vector<DeviceSpec> specs = parse_device_list(c.device, "--device");
  if (specs.size() == 1 && specs[0].kind == DeviceKind::kCuda) {
    run_device_bench(c);
    return;
  }
  if (specs.size() != 1)
    throw Error("--device \"" + c.device + "\": bench runs on one device (e.g. cpu or cuda:0)");
  if (!c.synthetic.empty())
    throw Error(
        "--synthetic is for GPU devices (--device cuda:N); on the CPU, write the model "
        "with `tokenfab-cli synth` and pass it with --model");
  LoadedModel m = load_model(c.common);
  check_context(c, m.model->hparams().n_ctx_train);
  const std::vector<TokenId> prompt = bench_prompt(*m.tokenizer, c.prompt_tokens, 0);
  const int threads = resolve_threads(c.common.threads);
  Generator generator(*m.model, *m.tokenizer, threads, c.prompt_tokens + c.gen_tokens + 1);
  GenerateOptions options;
  options.max_tokens = c.gen_tokens;
  options.sampling.temperature = 0.0f;
  options.stop_at_end_of_generation = false;

  std::vector<double> prefill, decode;
  for (int rep = 0; rep < c.repetitions; ++rep) {
    generator.reset();
    const GenerateResult r = generator.generate(prompt, options);
    prefill.push_back(r.prefill_tok_s);
    decode.push_back(r.decode_tok_s);
    if (!c.common.json)
      std::cerr << "run " << rep + 1 << ": prefill " << r.prefill_tok_s << " tok/s, decode "
                << r.decode_tok_s << " tok/s" << std::endl;
  }
  nlohmann::json j = {{"prefill_tok_s", median(prefill)},
                      {"decode_tok_s", median(decode)},
                      {"threads", threads},
                      {"model", m.model->file().name()},
                      {"prompt_tokens", c.prompt_tokens},
                      {"gen_tokens", c.gen_tokens},
                      {"repetitions", c.repetitions},
                      {"prefill_tok_s_runs", prefill},
                      {"decode_tok_s_runs", decode},
                      {"backend", "cpu"}};
  if (!c.verify_rows.empty()) {
    const std::vector<int32_t> table = block_table(c);
    CpuDevice device(bench_device_spec(c.device), *m.model, threads,
                     static_cast<int32_t>(table.size()), kBlockSize);
    j["verify"] = verify_report(device, prompt, c.verify_rows, c.repetitions, table);
  }
  print_report(j, c.common.json);
}

}  // namespace

void register_bench(CLI::App& app) {
  auto c = std::make_shared<BenchCommand>();
  auto* cmd = app.add_subcommand("bench", "measure prefill and decode tokens/s (JSON)");
  add_run_options(*cmd, c->common);
  cmd->add_option("--prompt-tokens", c->prompt_tokens, "prompt length")->capture_default_str();
  cmd->add_option("--gen-tokens", c->gen_tokens, "tokens to generate")->capture_default_str();
  cmd->add_option("--repetitions", c->repetitions, "runs; the median is reported")
      ->capture_default_str();
  cmd->add_option("--device", c->device, "cpu, or cuda:N for a GPU")->capture_default_str();
  cmd->add_option(
      "--synthetic", c->synthetic,
      "benchmark a synthetic model of this shape (GPU devices): " + [] {
        std::string names;
        for (const std::string& n : SyntheticShape::preset_names())
          names += (names.empty() ? "" : ", ") + n;
        return names;
      }());
  cmd->add_option("--synthetic-type", c->synthetic_type,
                  "weight type of the synthetic file (the GPU holds BF16 either way)")
      ->capture_default_str();
  cmd->add_option("--verify-rows", c->verify_rows,
                  "also time verifying steps of these row counts (e.g. 1,2,3,5): one sequence, "
                  "every row's logits, after the prompt")
      ->delimiter(',');
  add_gpu_bench_options(*cmd, c->gpu);
  cmd->callback([c] { run_bench(*c); });
}

}  // namespace tokenfab::cli
