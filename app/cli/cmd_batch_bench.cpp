// batch-bench: continuous batching on one device (--device: a CPU virtual device or a GPU), as
// JSON. N streams of the same length are scheduled together (Scheduler: token budget shared by
// decodes and prefill chunks, preemption when the pool is full), run as one batched pass per step
// over the device's paged KV pool and decoded greedily: schedule → run → complete, until every
// stream has its tokens.

#include <algorithm>
#include <chrono>
#include <iostream>
#include <memory>

#include "cli_common.h"
#include "core/common/error.h"
#include "core/kvcache/kv_manager.h"
#include "core/runtime/model_runner.h"
#include "core/serving/scheduler.h"

namespace tokenfab::cli {

namespace {

struct BatchBenchCommand {
  CommonOptions common;
  int streams = 32;
  int prompt_tokens = 128;
  int gen_tokens = 64;
  int token_budget = 512;
  int kv_blocks = 0;  // 0: enough for every stream at full length
  std::string device = "cpu";
  GpuBenchOptions gpu;
};

using Clock = std::chrono::steady_clock;

void run_batch_bench(const BatchBenchCommand& c) {
  if (c.streams < 1 || c.prompt_tokens < 1 || c.gen_tokens < 1 || c.token_budget < c.streams)
    throw Error(
        "batch-bench needs --streams >= 1, --prompt-tokens >= 1, --gen-tokens >= 1 and "
        "--token-budget >= --streams");
  LoadedModel m = load_model(c.common);
  constexpr int32_t kBlockSize = 16;
  const int32_t per_stream = (c.prompt_tokens + c.gen_tokens + kBlockSize - 1) / kBlockSize + 1;
  const int32_t n_blocks = c.kv_blocks > 0 ? c.kv_blocks : per_stream * c.streams;
  const std::unique_ptr<Device> device = make_bench_device(
      c.device, *m.model, resolve_threads(c.common.threads), n_blocks, kBlockSize, c.gpu);
  KvPool& storage = device->kv_storage();
  KvManager kv(n_blocks, kBlockSize);
  Scheduler scheduler(kv, c.token_budget, c.streams);
  for (int i = 0; i < c.streams; ++i)
    scheduler.add({static_cast<RequestId>(i), bench_prompt(*m.tokenizer, c.prompt_tokens, 7 * i),
                   c.gen_tokens});

  std::vector<BatchSequence> batch;
  std::vector<std::vector<int32_t>> tables;
  std::vector<int32_t> argmax;
  std::vector<TokenId> sampled;
  int64_t steps = 0, output_tokens = 0, decode_tokens = 0;
  double decode_seconds = 0.0;
  const Clock::time_point start = Clock::now();
  while (scheduler.has_unfinished()) {
    const StepPlan plan = scheduler.schedule();
    if (plan.empty()) throw Error("the scheduler made no progress (KV pool too small?)");
    for (const BlockCopy& copy : plan.copies) storage.copy_block(copy.src, copy.dst);
    batch.clear();
    tables.clear();
    tables.reserve(plan.chunks.size());
    bool all_decode = true;
    for (const ScheduledChunk& chunk : plan.chunks) {
      const auto& blocks = kv.table(chunk.seq).blocks();
      tables.emplace_back(blocks.begin(), blocks.end());
      const auto& tokens = scheduler.sequence(chunk.seq).tokens;
      batch.push_back({std::span<const int32_t>(tokens).subspan(chunk.first_token, chunk.n_tokens),
                       chunk.first_token, tables.back(), chunk.wants_logits});
      all_decode &= chunk.n_tokens == 1;
    }
    const Clock::time_point step_start = Clock::now();
    device->run_greedy(batch, argmax);  // greedy: only each row's argmax comes back from a GPU
    sampled.assign(argmax.begin(), argmax.end());
    if (all_decode) {
      decode_seconds += std::chrono::duration<double>(Clock::now() - step_start).count();
      decode_tokens += static_cast<int64_t>(sampled.size());
    }
    output_tokens += static_cast<int64_t>(scheduler.complete(plan, sampled).size());
    ++steps;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  nlohmann::json j = {
      {"streams", c.streams},
      {"prompt_tokens", c.prompt_tokens},
      {"gen_tokens", c.gen_tokens},
      {"token_budget", c.token_budget},
      {"kv_blocks", n_blocks},
      {"steps", steps},
      {"duration_s", seconds},
      {"output_tokens", output_tokens},
      {"throughput_tok_s", static_cast<double>(output_tokens) / seconds},
      {"decode_step_tok_s",
       decode_seconds > 0 ? static_cast<double>(decode_tokens) / decode_seconds : 0.0},
      {"preemptions", scheduler.n_preemptions()},
      {"threads", device->threads()},
      {"model", m.model->file().name()},
      {"device", device->name()},
      {"backend", device->spec().kind == DeviceKind::kCuda ? "cuda" : "cpu"}};
  if (device->spec().kind == DeviceKind::kCuda) c.gpu.report(j, *device);
  print_report(j, c.common.json);
}

}  // namespace

void register_batch_bench(CLI::App& app) {
  auto c = std::make_shared<BatchBenchCommand>();
  auto* cmd =
      app.add_subcommand("batch-bench", "continuous batching throughput on one device (JSON)");
  add_run_options(*cmd, c->common);
  cmd->add_option("--streams", c->streams, "concurrent sequences")->capture_default_str();
  cmd->add_option("--prompt-tokens", c->prompt_tokens, "prompt length of each stream")
      ->capture_default_str();
  cmd->add_option("--gen-tokens", c->gen_tokens, "tokens generated per stream")
      ->capture_default_str();
  cmd->add_option("--token-budget", c->token_budget, "tokens computed per step")
      ->capture_default_str();
  cmd->add_option("--kv-blocks", c->kv_blocks,
                  "KV pool size in 16-token blocks (default: fits all)");
  cmd->add_option("--device", c->device, "cpu, or cuda:N for a GPU")->capture_default_str();
  add_gpu_bench_options(*cmd, c->gpu);
  cmd->callback([c] { run_batch_bench(*c); });
}

}  // namespace tokenfab::cli
