// serve-bench: an in-process serving workload through the engine facade, as JSON (issue 3's
// contract). Requests are built from the prompt sets written for this project (short chat turns;
// long documents to summarize), formatted with the model's chat template and cut to their target
// lengths. Arrivals are closed-loop (--concurrency C requests in flight) or open-loop Poisson
// (--rate R requests/s). Every figure comes from the engine's own timestamps. Each run is recorded
// in the database (core/storage/runs.h) for the desktop app's History page unless --no-record.

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <thread>

#include "cli_common.h"
#include "core/common/error.h"
#include "core/serving/engine.h"
#include "core/serving/prompt_sets.h"
#include "core/storage/runs.h"
#include "core/tokenizer/chat_template.h"
#include "head_options.h"

namespace tokenfab::cli {

namespace {

// The --fused-layers value `e` was given.
std::string fused_layers_name(const EngineConfig& e) {
  if (!e.fused_layers) return "off";
  return e.fused_tensor_cores ? "tensor-cores" : "on";
}

struct ServeBenchCommand {
  CommonOptions common;
  EngineConfig engine;
  int requests = 64;
  int concurrency = 0;  // 0 with no --rate: 16
  double rate = 0;
  std::string prompt_len = "32:256";
  std::string prompts_file;  // a JSON array of user messages instead of --prompt-len's prompts
  int long_every = 0;
  int long_len = 2000;
  int max_tokens = 64;
  uint64_t seed = 0;
  double temperature = 0.0;
  std::optional<double> slo_ttft_ms, slo_tpot_ms;
  HeadOptions head;
  bool record = true;
};

// Builds prompts: the chat template around content tokens cut to the wanted total length.
class WorkloadBuilder {
 public:
  WorkloadBuilder(const LoadedModel& m, uint64_t seed)
      : tokenizer_(*m.tokenizer),
        rng_(seed),
        chat_(builtin_prompt_set("chat_turns")),
        documents_(builtin_prompt_set("documents")) {
    const std::string marker = "\x01\x02\x03";
    const std::string text =
        ChatTemplate::from_gguf(m.model->file()).apply({{"user", marker}}, true);
    const size_t at = text.find(marker);
    prefix_ = tokenizer_.encode(text.substr(0, at), tokenizer_.add_bos_token(), true);
    suffix_ = tokenizer_.encode(text.substr(at + marker.size()), false, true);
  }

  std::vector<TokenId> chat_prompt(int n_tokens) {
    return wrap(fill(chat_, "", n_tokens), n_tokens);
  }
  std::vector<TokenId> long_prompt(int n_tokens) {
    return wrap(
        fill(documents_, "Summarize the following document in three sentences.\n\n", n_tokens),
        n_tokens);
  }
  int overhead() const { return static_cast<int>(prefix_.size() + suffix_.size()); }

 private:
  // Content of about n tokens: entries of the set picked at random, one after the other.
  std::vector<TokenId> fill(const PromptSet& set, const std::string& lead, int n) {
    std::vector<TokenId> content = tokenizer_.encode(lead, false, false);
    std::uniform_int_distribution<size_t> pick(0, set.entries.size() - 1);
    while (static_cast<int>(content.size()) < n) {
      const std::vector<TokenId> more =
          tokenizer_.encode(set.entries[pick(rng_)] + "\n\n", false, false);
      content.insert(content.end(), more.begin(), more.end());
    }
    return content;
  }
  std::vector<TokenId> wrap(std::vector<TokenId> content, int n_total) {
    content.resize(static_cast<size_t>(std::max(1, n_total - overhead())));
    std::vector<TokenId> p = prefix_;
    p.insert(p.end(), content.begin(), content.end());
    p.insert(p.end(), suffix_.begin(), suffix_.end());
    return p;
  }

  const Tokenizer& tokenizer_;
  std::mt19937_64 rng_;
  const PromptSet& chat_;
  const PromptSet& documents_;
  std::vector<TokenId> prefix_, suffix_;
};

// --prompts FILE: a JSON array of user messages, each wrapped in the model's chat template and
// tokenized as the API server does with a chat request's messages (the same tokens for the same
// text: `tools/api_bench.py --save-prompts` writes such a file).
std::vector<std::vector<TokenId>> read_prompts_file(const std::string& path, const LoadedModel& m) {
  std::ifstream in(path);
  if (!in) throw Error("--prompts " + path + ": cannot open it");
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (!j.is_array() || j.empty())
    throw Error("--prompts " + path + ": expected a JSON array of user messages (strings)");
  const ChatTemplate chat = ChatTemplate::from_gguf(m.model->file());
  const Tokenizer& tok = *m.tokenizer;
  std::vector<std::vector<TokenId>> prompts;
  for (const nlohmann::json& message : j) {
    if (!message.is_string() || message.get<std::string>().empty())
      throw Error("--prompts " + path + ": entry " + std::to_string(prompts.size()) +
                  " is not a non-empty string");
    const std::string text = chat.apply({{"user", message.get<std::string>()}}, true);
    prompts.push_back(tok.encode(text, tok.add_bos_token(), true));
  }
  return prompts;
}

std::pair<int, int> parse_range(const std::string& text) {
  const size_t colon = text.find(':');
  try {
    size_t used = 0;
    const int lo = std::stoi(text.substr(0, colon), &used);
    const int hi = colon == std::string::npos ? lo : std::stoi(text.substr(colon + 1));
    if (lo >= 1 && hi >= lo) return {lo, hi};
  } catch (const std::exception&) {
  }
  throw Error("--prompt-len \"" + text + "\": expected MIN:MAX with 1 <= MIN <= MAX (e.g. 32:256)");
}

nlohmann::json device_json(const DeviceSnapshot& d) {
  nlohmann::json j = {{"name", d.name},
                      {"role", d.role},
                      {"threads", d.threads},
                      {"steps", d.steps},
                      {"kv_blocks", d.kv.n_blocks},
                      {"prefix_hit_tokens", d.kv.prefix.hit_tokens},
                      {"busy_s", d.busy_s},
                      {"compute_s", d.compute_s},
                      {"decode_steps", d.decode_steps}};
  if (d.decode_steps > 0) {
    j["decode_mean_batch"] =
        static_cast<double>(d.decode_rows) / static_cast<double>(d.decode_steps);
    j["decode_step_ms"] = 1e3 * d.decode_busy_s / static_cast<double>(d.decode_steps);
    j["decode_step_tok_s"] = static_cast<double>(d.decode_rows) / d.decode_busy_s;
    j["engine_overhead_fraction"] = 1.0 - d.decode_compute_s / d.decode_busy_s;
  }
  // The chunk sizer's last limit (colocated, with a step target).
  if (d.prefill_limit > 0) j["prefill_limit_tokens"] = d.prefill_limit;
  return j;
}

// The flags that shaped the run (the History page's "config").
nlohmann::json config_json(const ServeBenchCommand& c, int concurrency) {
  const EngineConfig& e = c.engine;
  nlohmann::json j = {
      {"requests", c.requests},
      {"concurrency", concurrency > 0 ? nlohmann::json(concurrency) : nullptr},
      {"rate", c.rate > 0 ? nlohmann::json(c.rate) : nullptr},
      {"prompt_len", c.prompts_file.empty() ? nlohmann::json(c.prompt_len) : nullptr},
      {"prompts_file", c.prompts_file.empty() ? nullptr : nlohmann::json(c.prompts_file)},
      {"long_every", c.long_every},
      {"long_len", c.long_len},
      {"max_tokens", c.max_tokens},
      {"seed", c.seed},
      {"temperature", c.temperature},
      {"threads", e.total_threads()},
      {"devices", e.devices},
      {"prefill", e.prefill},
      {"decode", e.decode},
      {"long_prefill", e.long_prefill},
      {"long_prompt_tokens", e.long_prompt_tokens},
      {"kv_blocks", e.kv_blocks},
      {"kv_mem_mb", e.kv_mem_mb},
      {"token_budget", e.token_budget},
      {"max_running", e.max_running},
      {"chunked_prefill", e.chunked_prefill},
      {"step_target_ms", e.step_target_ms},
      {"connector", e.connector},
      {"streamed_transfer", e.streamed_transfer},
      {"fused_layers", fused_layers_name(e)},
      {"head", c.head.head},
      {"spec", c.head.spec},
      {"draft_len", c.head.draft_len},
      {"adaptive_draft", c.head.adaptive_draft()},
      {"tree_shape", c.head.request_tree()},
      {"tree_nodes", c.head.request_tree_nodes()},
      {"lookup", c.head.lookup}};
  if (c.slo_ttft_ms) j["slo_ttft_ms"] = *c.slo_ttft_ms;
  if (c.slo_tpot_ms) j["slo_tpot_ms"] = *c.slo_tpot_ms;
  return j;
}

// Stores the run for the History page. A failure is a warning: the report on stdout and the exit
// status stay those of the benchmark.
void record_run(const ServeBenchCommand& c, int concurrency, const nlohmann::json& report) {
  try {
    RunRecord run;
    run.kind = "serve-bench";
    run.title = "serve-bench " + report.value("mode", std::string("?")) + " " +
                std::to_string(c.requests) + " req" +
                (c.head.head != "none" ? " head " + c.head.head : std::string());
    run.model = std::filesystem::path(report.value("model", std::string())).filename().string();
    run.config_json = config_json(c, concurrency).dump();
    run.summary_json = report.dump();
    const auto db = Database::open_default();
    RunStore(*db).add(run);
  } catch (const std::exception& e) {
    std::cerr << "warning: serve-bench: the run was not recorded for History: " << e.what() << "\n";
  }
}

void run_serve_bench(ServeBenchCommand c) {
  const auto [len_min, len_max] = parse_range(c.prompt_len);
  if (c.requests < 1) throw Error("--requests must be >= 1");
  if (c.max_tokens < 1) throw Error("--max-tokens must be >= 1");
  if (c.rate < 0) throw Error("--rate must be > 0 requests per second");
  if (c.rate > 0 && c.concurrency > 0) throw Error("give --concurrency or --rate, not both");
  if (c.concurrency < 0) throw Error("--concurrency must be >= 1");
  if (c.long_every < 0 || c.long_len < 1)
    throw Error("--long-every must be >= 0 and --long-len >= 1");
  const int concurrency = c.rate > 0 ? 0 : (c.concurrency > 0 ? c.concurrency : 16);
  LoadedModel m = load_model(c.common);
  c.engine.threads = c.common.threads;
  HeadChooser heads(c.head, *m.model, *m.tokenizer);
  WorkloadBuilder workload(m, c.seed);
  if (len_min <= workload.overhead())
    throw Error("--prompt-len " + c.prompt_len + ": the chat template alone takes " +
                std::to_string(workload.overhead()) + " tokens; use a minimum above that");
  std::mt19937_64 rng(c.seed ^ 0x5e7e);
  std::uniform_int_distribution<int> length(len_min, len_max);
  const std::vector<std::vector<TokenId>> file_prompts = c.prompts_file.empty()
                                                             ? std::vector<std::vector<TokenId>>{}
                                                             : read_prompts_file(c.prompts_file, m);
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < c.requests; ++i) {
    const bool is_long = c.long_every > 0 && (i + 1) % c.long_every == 0;
    GenerationRequest r;
    if (!file_prompts.empty())
      r.prompt = file_prompts[static_cast<size_t>(i) % file_prompts.size()];
    else
      r.prompt = is_long ? workload.long_prompt(c.long_len) : workload.chat_prompt(length(rng));
    r.max_tokens = c.max_tokens;
    r.sampling.temperature = static_cast<float>(c.temperature);
    r.sampling.seed = c.seed + static_cast<uint64_t>(i);
    r.stop_at_end_of_generation = false;  // every request generates max_tokens (comparable runs)
    HeadChoice choice = heads.choose(r.prompt);
    r.head = std::move(choice.head);
    r.head_candidates = std::move(choice.candidates);
    r.draft_len = c.head.draft_len;
    r.adaptive_draft = c.head.adaptive_draft();
    r.tree_shape = c.head.request_tree();
    r.tree_nodes = c.head.request_tree_nodes();
    r.lookup = c.head.lookup;
    requests.push_back(std::move(r));
  }

  // The subscriber's state outlives the engine: the last requests end (and call it) after the
  // submitting loop below has finished, while wait_idle() waits.
  std::mutex mutex;
  std::condition_variable cv;
  int in_flight = 0;
  Engine engine(*m.model, c.engine,
                [&tok = *m.tokenizer](TokenId t) { return tok.is_end_of_generation(t); });
  std::vector<RequestId> ids;
  if (concurrency > 0) {
    engine.subscribe([&](const TokenEvent& e) {
      if (!request_ended(e.state)) return;
      std::lock_guard lock(mutex);
      --in_flight;
      cv.notify_all();
    });
    for (GenerationRequest& r : requests) {
      std::unique_lock lock(mutex);
      cv.wait(lock, [&] { return in_flight < concurrency; });
      ++in_flight;
      lock.unlock();
      ids.push_back(engine.submit(std::move(r)));
    }
  } else {
    std::exponential_distribution<double> gap(c.rate);
    auto next = std::chrono::steady_clock::now();
    for (GenerationRequest& r : requests) {
      std::this_thread::sleep_until(next);
      ids.push_back(engine.submit(std::move(r)));
      next += std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(gap(rng)));
    }
  }
  engine.wait_idle();
  const EngineSnapshot snap = engine.snapshot();
  nlohmann::json j = to_json(snap.summary);
  j["mode"] = snap.mode;
  j["output_tokens"] = snap.summary.output_tokens;
  if (snap.summary.accept_per_step) j["accept_per_step"] = *snap.summary.accept_per_step;
  if (snap.summary.draft_ms_per_step) {
    j["draft_ms_per_step"] = *snap.summary.draft_ms_per_step;
    j["verify_ms_per_step"] = *snap.summary.verify_ms_per_step;
  }
  if (c.head.head != "none") j["head"] = c.head.head;
  nlohmann::json devices = nlohmann::json::array();
  for (const DeviceSnapshot& d : snap.devices) devices.push_back(device_json(d));
  j["devices"] = devices;
  j["workload"] = {
      {"concurrency", concurrency > 0 ? nlohmann::json(concurrency) : nlohmann::json()},
      {"rate", c.rate > 0 ? nlohmann::json(c.rate) : nlohmann::json()},
      {"prompt_len", c.prompts_file.empty() ? nlohmann::json(c.prompt_len) : nullptr},
      {"prompts_file", c.prompts_file.empty() ? nullptr : nlohmann::json(c.prompts_file)},
      {"long_every", c.long_every},
      {"long_len", c.long_len},
      {"max_tokens", c.max_tokens},
      {"token_budget", c.engine.token_budget},
      {"chunked_prefill", c.engine.chunked_prefill},
      {"step_target_ms", c.engine.step_target_ms},
      {"seed", c.seed}};
  if (c.slo_ttft_ms || c.slo_tpot_ms) {
    Slo slo;
    if (c.slo_ttft_ms) slo.ttft_s = *c.slo_ttft_ms / 1e3;
    if (c.slo_tpot_ms) slo.tpot_s = *c.slo_tpot_ms / 1e3;
    j["goodput"] = to_json(engine.goodput(slo));
  }
  j["model"] = m.model->file().name();
  print_report(j, c.common.json);
  if (c.record) record_run(c, concurrency, j);
}

}  // namespace

void add_engine_options(CLI::App& cmd, EngineConfig& e) {
  cmd.add_option("--devices", e.devices, "colocated devices, e.g. cpu:0,cpu:1")
      ->capture_default_str();
  cmd.add_option("--prefill", e.prefill, "disaggregated mode: prefill devices (with --decode)");
  cmd.add_option("--decode", e.decode, "disaggregated mode: decode devices (with --prefill)");
  cmd.add_option("--long-prefill", e.long_prefill, "devices that prefill only long prompts");
  cmd.add_option("--long-prompt-tokens", e.long_prompt_tokens,
                 "prompts longer than this go to --long-prefill");
  cmd.add_option("--kv-blocks", e.kv_blocks, "KV pool per device, in blocks (overrides --kv-mem)");
  cmd.add_option("--kv-mem", e.kv_mem_mb, "KV pool per device, MiB")->capture_default_str();
  cmd.add_option("--token-budget", e.token_budget, "tokens computed per step per device")
      ->capture_default_str();
  cmd.add_option("--max-running", e.max_running, "sequences per device batch")
      ->capture_default_str();
  cmd.add_flag("--no-chunked-prefill{false}", e.chunked_prefill,
               "read each prompt in one step (for comparison)");
  cmd.add_option("--step-target-ms", e.step_target_ms,
                 "colocated: while decodes run, read only as many prompt tokens per step as keep "
                 "it near this time, by the device's measured speed (0: fill the token budget)")
      ->capture_default_str();
  cmd.add_option("--connector", e.connector, "KV transfer backend")->capture_default_str();
  cmd.add_option("--decode-sms", e.decode_sms,
                 "a GPU named in both --prefill and --decode: SMs its decode partition gets to "
                 "itself (green contexts, where the driver has them; prefill gets the rest); 0: "
                 "the partitions share the SMs, decode at the higher stream priority")
      ->capture_default_str();
  cmd.add_option_function<std::string>(
         "--fused-layers",
         [&e](const std::string& v) {
           e.fused_layers = v != "off";
           e.fused_tensor_cores = v == "tensor-cores";
         },
         kFusedLayersHelp)
      ->check(CLI::IsMember({"on", "tensor-cores", "off"}))
      ->default_str("off");
  cmd.add_option_function<std::string>(
         "--cuda-families", [&e](const std::string& v) { e.cuda_families = v == "on"; },
         "GPUs: compute the non-Llama families (qwen2, qwen3, gemma2, gemma3, phi3, Llama 3 "
         "RoPE factors) on the layered CUDA path; not yet verified on a GPU")
      ->check(CLI::IsMember({"on", "off"}))
      ->default_str("off");
  cmd.add_flag("--no-streamed-transfer{false}", e.streamed_transfer,
               "disaggregated: copy a prompt's KV after its last prefill step instead of layer by "
               "layer during it (for comparison)");
}

void register_serve_bench(CLI::App& app) {
  auto c = std::make_shared<ServeBenchCommand>();
  auto* cmd = app.add_subcommand("serve-bench", "serving workload through the engine (JSON)");
  add_run_options(*cmd, c->common);
  add_engine_options(*cmd, c->engine);
  add_head_options(*cmd, c->head);
  cmd->add_option("--requests", c->requests, "requests to send")->capture_default_str();
  auto* conc = cmd->add_option("--concurrency", c->concurrency, "requests in flight (default 16)");
  cmd->add_option("--rate", c->rate, "Poisson arrivals, requests per second")->excludes(conc);
  auto* len =
      cmd->add_option("--prompt-len", c->prompt_len, "short prompt length range MIN:MAX, tokens")
          ->capture_default_str();
  auto* every = cmd->add_option("--long-every", c->long_every,
                                "every K-th request is a long document (0: none)")
                    ->capture_default_str();
  cmd->add_option("--prompts", c->prompts_file,
                  "a JSON array of user messages, each in the model's chat template as the API "
                  "server applies it; request i takes message i mod N (e.g. from "
                  "tools/api_bench.py --save-prompts)")
      ->excludes(len)
      ->excludes(every);
  cmd->add_option("--long-len", c->long_len, "long prompt length, tokens")->capture_default_str();
  cmd->add_option("--max-tokens", c->max_tokens, "tokens generated per request")
      ->capture_default_str();
  cmd->add_option("--seed", c->seed, "workload and sampling seed")->capture_default_str();
  cmd->add_option("--temperature", c->temperature, "sampling temperature (0: greedy)")
      ->capture_default_str();
  cmd->add_option("--slo-ttft-ms", c->slo_ttft_ms, "goodput: TTFT limit, ms");
  cmd->add_option("--slo-tpot-ms", c->slo_tpot_ms, "goodput: TPOT limit, ms");
  cmd->add_flag("--record,!--no-record", c->record,
                "store the run in the database for the desktop app's History page (default on)");
  cmd->callback([c] { run_serve_bench(*c); });
}

}  // namespace tokenfab::cli
