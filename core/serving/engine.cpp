#include "core/serving/engine.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "core/common/error.h"
#include "core/device/cuda_model.h"
#include "core/device/device.h"
#include "core/kvcache/kv_slots.h"
#include "core/serving/engine_record.h"
#include "core/serving/router.h"
#include "core/serving/worker.h"

namespace tokenfab {

const char* request_state_name(RequestState state) {
  switch (state) {
    case RequestState::kQueued:
      return "queued";
    case RequestState::kPrefilling:
      return "prefilling";
    case RequestState::kTransferring:
      return "transferring";
    case RequestState::kDecoding:
      return "decoding";
    case RequestState::kFinished:
      return "finished";
    case RequestState::kCancelled:
      return "cancelled";
    case RequestState::kFailed:
      return "failed";
  }
  return "unknown";
}

int EngineConfig::total_threads() const {
  return threads > 0 ? threads
                     : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

std::string EngineConfig::devices_text() const {
  std::string text = devices;
  if (disaggregated()) {
    text = "prefill " + prefill + ", decode " + decode;
    if (!long_prefill.empty()) text += ", long prefill " + long_prefill;
  }
  // How a GPU ran its decode steps changes their speed: said where it applies.
  if (fused_layers && text.find("cuda") != std::string::npos)
    text += fused_tensor_cores ? ", fused decode layers on tensor cores" : ", fused decode layers";
  return text;
}

int64_t EngineConfig::context_limit(const HParams& hp) const {
  return max_context > 0 ? max_context : hp.n_ctx_train;
}

void EngineConfig::validate() const {
  auto fail = [](const std::string& what) { throw Error("engine configuration: " + what); };
  if (prefill.empty() != decode.empty())
    fail("disaggregated mode needs both --prefill and --decode devices (got only --" +
         std::string(prefill.empty() ? "decode" : "prefill") + ")");
  if (!long_prefill.empty() && !disaggregated())
    fail("--long-prefill needs disaggregated mode (--prefill and --decode)");
  if (!long_prefill.empty() && long_prompt_tokens < 1)
    fail("--long-prefill needs --long-prompt-tokens N >= 1");
  if (long_prompt_tokens < 0) fail("--long-prompt-tokens must be >= 0");
  if (threads < 0) fail("--threads must be >= 0 (0: all hardware threads)");
  if (block_size < 1 || block_size > 1024) fail("block size must be 1..1024 tokens");
  if (kv_blocks < 0) fail("--kv-blocks must be >= 0 (0: size the pool from --kv-mem)");
  if (kv_blocks == 0 && kv_mem_mb < 1) fail("--kv-mem must be >= 1 MiB");
  if (max_running < 1) fail("max running sequences must be >= 1");
  if (token_budget < max_running)
    fail("the token budget (" + std::to_string(token_budget) +
         ") must be >= max running sequences (" + std::to_string(max_running) +
         "), so every running decode fits each step");
  if (!(step_target_ms >= 0.0) || step_target_ms > 1e6)
    fail("--step-target-ms must be 0 (off) or a positive number of milliseconds up to 1e6");
  if (decode_side_prefill_tokens < 0) fail("decode-side prefill tokens must be >= 0");
  if (max_context < 0) fail("max context must be >= 0");
  if (decode_sms < 0) fail("--decode-sms must be >= 0 (0: the partitions share the SMs)");
  if (decode_sms > 0 && !disaggregated())
    fail(
        "--decode-sms splits a GPU named in both --prefill and --decode; it needs disaggregated "
        "mode");
}

namespace {

struct DevicePlan {
  DeviceSpec spec;
  WorkerRole role;
};

std::vector<DevicePlan> plan_devices(const EngineConfig& c) {
  std::vector<DevicePlan> plan;
  auto add = [&](const std::string& list, const char* flag, WorkerRole role) {
    for (DeviceSpec d : parse_device_list(list, flag)) {
      for (DevicePlan& p : plan) {
        if (p.spec != d) continue;
        // One device as prefill and decode devices: two partitions of it.
        if (p.role == WorkerRole::kPrefill && role == WorkerRole::kDecode) {
          p.spec.partition = DevicePartition::kPrefill;
          d.partition = DevicePartition::kDecode;
          continue;
        }
        throw Error(std::string(flag) + ": " + d.name() + " is already a " +
                    worker_role_name(p.role) +
                    " device; the device lists must be disjoint (a device may be both a "
                    "--prefill and a --decode device: two partitions of it)");
      }
      plan.push_back({d, role});
    }
  };
  if (c.disaggregated()) {
    add(c.prefill, "--prefill", WorkerRole::kPrefill);
    if (!c.long_prefill.empty()) add(c.long_prefill, "--long-prefill", WorkerRole::kLongPrefill);
    add(c.decode, "--decode", WorkerRole::kDecode);
  } else {
    add(c.devices, "--devices", WorkerRole::kColocated);
  }
  if (c.decode_sms > 0 && std::none_of(plan.begin(), plan.end(), [](const DevicePlan& p) {
        return p.spec.partition == DevicePartition::kDecode && p.spec.kind == DeviceKind::kCuda;
      }))
    throw Error("--decode-sms " + std::to_string(c.decode_sms) +
                ": no GPU is named in both --prefill and --decode, so there are no partitions "
                "to split");
  return plan;
}

// The connector for the plan: loopback cannot reach GPU memory, so with a GPU among the devices
// the default (loopback) becomes "cuda" (peer copies where possible, host staging otherwise). A
// CUDA connector without a GPU is refused.
std::string connector_for(const EngineConfig& c, const std::vector<DevicePlan>& plan) {
  const bool any_gpu = std::any_of(plan.begin(), plan.end(), [](const DevicePlan& p) {
    return p.spec.kind == DeviceKind::kCuda;
  });
  if (any_gpu && c.connector == "loopback") return "cuda";
  const bool gpu_connector =
      c.connector == "cuda" || c.connector == "cuda_p2p" || c.connector == "host_staged";
  if (!any_gpu && gpu_connector)
    throw Error("engine configuration: the " + c.connector +
                " connector moves KV to or from GPU memory, and every device is a CPU (use "
                "loopback)");
  return c.connector;
}

}  // namespace

Engine::Engine(const LlamaModel& model, EngineConfig config, EndOfGeneration is_end_of_generation)
    : model_(model),
      config_(std::move(config)),
      is_end_of_generation_(std::move(is_end_of_generation)),
      started_(MetricsClock::now()),
      metrics_(started_) {
  config_.validate();
  const std::vector<DevicePlan> plan = plan_devices(config_);
  const std::vector<int> threads =
      divide_threads(config_.total_threads(), static_cast<int>(plan.size()));
  const int32_t kv_blocks = kv_blocks_for_budget(model.hparams(), config_.block_size,
                                                 config_.kv_mem_mb, config_.kv_blocks);
  connector_ = make_kv_connector(connector_for(config_, plan));
  // The two partitions of a device are made together: one KV storage of two pools' blocks, which
  // their workers' pools divide (a prompt changes partition without a copy).
  std::vector<std::unique_ptr<Device>> devices(plan.size());
  std::vector<std::shared_ptr<KvSlots>> shared(plan.size());
  const CudaOptions cuda{.fused_layers = config_.fused_layers,
                         .fused_tensor_cores = config_.fused_tensor_cores,
                         .decode_sms = config_.decode_sms,
                         .families = config_.cuda_families};
  for (size_t i = 0; i < plan.size(); ++i) {
    const DeviceSpec& spec = plan[i].spec;
    if (devices[i]) continue;  // the decode partition of an earlier entry
    if (spec.partition == DevicePartition::kPrefill) {
      size_t j = i + 1;
      while (plan[j].spec.partition != DevicePartition::kDecode || plan[j].spec.kind != spec.kind ||
             plan[j].spec.index != spec.index)
        ++j;  // plan_devices made both
      const int32_t n_slots = 2 * kv_blocks;
      auto pair = spec.kind == DeviceKind::kCuda
                      ? make_cuda_partitions(spec, plan[j].spec, model, threads[i], threads[j],
                                             n_slots, config_.block_size, cuda)
                      : make_cpu_partitions(spec, plan[j].spec, model, threads[i], threads[j],
                                            n_slots, config_.block_size);
      devices[i] = std::move(pair.first);
      devices[j] = std::move(pair.second);
      shared[i] = shared[j] = std::make_shared<KvSlots>(n_slots);
    } else if (spec.kind == DeviceKind::kCuda) {
      devices[i] = make_cuda_device(spec, model, threads[i], kv_blocks, config_.block_size, cuda);
    } else {
      devices[i] =
          std::make_unique<CpuDevice>(spec, model, threads[i], kv_blocks, config_.block_size);
    }
  }
  std::vector<Worker*> prefill, long_prefill, decode;
  for (size_t i = 0; i < plan.size(); ++i) {
    workers_.push_back(std::make_unique<Worker>(*this, std::move(devices[i]), plan[i].role, config_,
                                                *connector_, is_end_of_generation_, kv_blocks,
                                                shared[i]));
    Worker* w = workers_.back().get();
    if (!w->draft_taps() && untapped_device_.empty()) untapped_device_ = w->device().name();
    switch (plan[i].role) {
      case WorkerRole::kColocated:
      case WorkerRole::kPrefill:
        prefill.push_back(w);
        break;
      case WorkerRole::kLongPrefill:
        long_prefill.push_back(w);
        break;
      case WorkerRole::kDecode:
        decode.push_back(w);
        break;
    }
  }
  router_ =
      std::make_unique<Router>(prefill, long_prefill, decode, config_.long_prompt_tokens,
                               config_.disaggregated() ? config_.decode_side_prefill_tokens : 0);
  for (auto& w : workers_) w->start();
}

Engine::~Engine() {
  {
    std::lock_guard lock(mutex_);
    for (auto& [id, record] : requests_) record->cancelled = true;
  }
  // Prefill workers first: a request they have handed over streamed is theirs until their step
  // ends, so once they have stopped every request a decode worker holds is its own or has ended.
  for (auto& w : workers_)
    if (w->role() == WorkerRole::kPrefill || w->role() == WorkerRole::kLongPrefill) w->stop();
  for (auto& w : workers_) w->stop();
  workers_.clear();
}

RequestId Engine::submit(GenerationRequest request) {
  return submit(std::move(request), {});
}

RequestId Engine::submit(GenerationRequest request, TokenCallback on_event) {
  const HParams& hp = model_.hparams();
  if (request.prompt.empty()) throw Error("request: empty prompt (expected at least one token)");
  for (const TokenId t : request.prompt)
    if (t < 0 || t >= hp.n_vocab)
      throw Error("request: token id " + std::to_string(t) + " is outside the vocabulary (0.." +
                  std::to_string(hp.n_vocab - 1) + ")");
  if (request.max_tokens < 1)
    throw Error("request: max_tokens is " + std::to_string(request.max_tokens) +
                " (expected at least 1)");
  request.sampling.validate();
  if (request.logprobs < -1 || request.logprobs > GenerationRequest::kMaxLogprobs)
    throw Error("request: logprobs " + std::to_string(request.logprobs) +
                " is outside -1 (none).." + std::to_string(GenerationRequest::kMaxLogprobs));
  if (request.lookup < 0 || request.lookup > GenerationRequest::kMaxLookup)
    throw Error("request: context lookup of " + std::to_string(request.lookup) +
                " tokens is outside 0.." + std::to_string(GenerationRequest::kMaxLookup));
  if (request.lookup > 0 && request.sampling.temperature > 0.0f)
    throw Error("request: context lookup drafts are verified greedily; use temperature 0");
  if ((request.head || request.lookup > 0) && request.draft_len < 1)
    throw Error("request: draft length must be at least 1 (got " +
                std::to_string(request.draft_len) + ")");
  if (request.head) {
    const DraftHeadInfo& h = request.head->info;
    // Why a head that reads layer taps cannot draft here, or empty.
    const std::vector<int32_t> taps = draft_tap_layers(hp.n_layer);
    const auto taps_problem = [&](const DraftHeadInfo& info) -> std::string {
      if (info.taps.empty()) return {};
      if (info.taps != taps) return "reads other inner layers of the target than this version taps";
      if (!untapped_device_.empty())
        return "reads the target's inner layers, which " + untapped_device_ +
               " does not hand to draft heads yet; use a head trained with --taps off there";
      return {};
    };
    if (h.n_embd != hp.n_embd || h.n_vocab != hp.n_vocab)
      throw Error("request: draft head '" + h.name + "' is for a model with n_embd " +
                  std::to_string(h.n_embd) + " and " + std::to_string(h.n_vocab) + " tokens, not " +
                  std::to_string(hp.n_embd) + " and " + std::to_string(hp.n_vocab));
    if (const std::string problem = taps_problem(h); !problem.empty())
      throw Error("request: draft head '" + h.name + "' " + problem);
    if (!request.tree_shape.empty()) {
      if (request.sampling.temperature > 0.0f)
        throw Error("request: tree speculation verifies greedily; use temperature 0 or a chain");
      if (static_cast<int32_t>(request.tree_shape.size()) > request.head->n_heads())
        throw Error("request: the tree is " + std::to_string(request.tree_shape.size()) +
                    " levels deep but draft head '" + h.name + "' has " +
                    std::to_string(request.head->n_heads()) + " heads");
      for (int32_t b : request.tree_shape)
        if (b < 1 || b > 16)
          throw Error("request: tree branching " + std::to_string(b) + " is outside 1..16");
    }
    if (request.tree_nodes != 0 && (request.tree_shape.empty() || request.tree_nodes < 1 ||
                                    request.tree_nodes > GenerationRequest::kMaxTreeNodes))
      throw Error("request: a dynamic tree needs a tree shape and 1.." +
                  std::to_string(GenerationRequest::kMaxTreeNodes) + " nodes (got " +
                  std::to_string(request.tree_nodes) + ")");
    // Candidates it could not use (another model's shape, a tree deeper than their heads) are
    // dropped: switching never makes a request invalid.
    std::erase_if(request.head_candidates, [&](const HeadCandidate& c) {
      return !c.head || c.head->info.n_embd != hp.n_embd || c.head->info.n_vocab != hp.n_vocab ||
             !taps_problem(c.head->info).empty() ||
             static_cast<int32_t>(request.tree_shape.size()) > c.head->n_heads();
    });
  }
  const int64_t limit = config_.context_limit(hp);
  const int64_t needed = static_cast<int64_t>(request.prompt.size()) + request.max_tokens;
  if (limit > 0 && needed > limit)
    throw Error("request: the prompt (" + std::to_string(request.prompt.size()) + " tokens) plus " +
                std::to_string(request.max_tokens) + " tokens to generate exceed the context of " +
                std::to_string(limit) + " tokens");
  std::shared_ptr<Record> record;
  {
    std::lock_guard lock(mutex_);
    const RequestId id = next_id_++;
    const MetricsTime now = MetricsClock::now();
    record = std::make_shared<Record>(id, std::move(request), now);
    record->on_event = std::move(on_event);
    requests_.emplace(id, record);
    if (n_active_++ == 0) busy_since_ = now;
  }
  metrics_.on_submitted(static_cast<int64_t>(record->request.prompt.size()));
  Worker& worker = router_->route_prompt(record->request.prompt);
  record->prefill_worker = &worker;
  if (worker.role() == WorkerRole::kDecode) record->decode_worker = &worker;
  worker.post_request(record);
  return record->id;
}

bool Engine::cancel(RequestId id, CancelReason reason) {
  {
    std::lock_guard lock(mutex_);
    const auto it = requests_.find(id);
    if (it == requests_.end() || request_ended(it->second->state())) return false;
    if (reason == CancelReason::kStopText) it->second->stopped_by_caller = true;
    it->second->cancelled = true;
  }
  for (auto& w : workers_) w->wake();
  return true;
}

namespace {

std::shared_ptr<const std::vector<Engine::TokenCallback>> list_of(
    const std::map<int64_t, Engine::TokenCallback>& subscribers) {
  auto list = std::make_shared<std::vector<Engine::TokenCallback>>();
  for (const auto& [id, cb] : subscribers) list->push_back(cb);
  return list;
}

}  // namespace

int64_t Engine::subscribe(TokenCallback callback) {
  std::lock_guard lock(subscribers_mutex_);
  const int64_t id = next_subscription_++;
  subscribers_.emplace(id, std::move(callback));
  subscriber_list_ = list_of(subscribers_);
  return id;
}

void Engine::unsubscribe(int64_t subscription) {
  std::lock_guard lock(subscribers_mutex_);
  subscribers_.erase(subscription);
  subscriber_list_ = list_of(subscribers_);
}

void Engine::publish(const Record& record, const TokenEvent& event) {
  if (record.on_event) record.on_event(event);
  std::shared_ptr<const std::vector<TokenCallback>> list;
  {
    std::lock_guard lock(subscribers_mutex_);
    list = subscriber_list_;
  }
  for (const TokenCallback& cb : *list) cb(event);
}

void Engine::on_ended(Record& record) {
  std::lock_guard lock(mutex_);
  --n_active_;
  // Ended requests stay queryable for a while; the oldest are forgotten beyond kEndedHistory so a
  // long-running app does not grow without bound.
  ended_ids_.push_back(record.id);
  while (ended_ids_.size() > kEndedHistory) {
    requests_.erase(ended_ids_.front());
    ended_ids_.pop_front();
  }
  ended_.notify_all();
}

void Engine::hand_off(std::shared_ptr<Record> record, Worker&, bool streamed) {
  Worker& decode = router_->route_decode();
  record->decode_worker = &decode;
  {
    std::lock_guard lock(record->mutex);
    record->info.decode_device = decode.name();
  }
  decode.post_incoming(std::move(record), streamed);
}

void Engine::on_transfer_ended(const KvTransferStats& stats) {
  if (stats.state == TransferState::kDone)
    metrics_.on_transfer(stats.bytes, stats.bytes > 0 ? stats.copy_seconds() : 0.0, stats.waited_s,
                         stats.layers_done, stats.layers_overlapped, stats.handed_over);
  std::lock_guard lock(mutex_);
  transfers_.push_back(stats);
  if (transfers_.size() > kTransferHistory)
    transfers_.erase(transfers_.begin(),
                     transfers_.begin() + (transfers_.size() - kTransferHistory));
}

RequestInfo Engine::request(RequestId id) const {
  std::lock_guard lock(mutex_);
  const auto it = requests_.find(id);
  if (it == requests_.end()) throw Error("engine: unknown request " + std::to_string(id));
  std::lock_guard record_lock(it->second->mutex);
  return it->second->info;
}

RequestInfo Engine::wait(RequestId id) {
  std::unique_lock lock(mutex_);
  const auto it = requests_.find(id);
  if (it == requests_.end()) throw Error("engine: unknown request " + std::to_string(id));
  const std::shared_ptr<Record> record = it->second;
  ended_.wait(lock, [&] { return request_ended(record->state()); });
  std::lock_guard record_lock(record->mutex);
  return record->info;
}

void Engine::wait_idle() {
  std::unique_lock lock(mutex_);
  ended_.wait(lock, [&] { return n_active_ == 0; });
}

ServingSummary Engine::summary() const {
  return metrics_.summary(MetricsClock::now());
}

Goodput Engine::goodput(const Slo& slo) const {
  return metrics_.goodput(slo, MetricsClock::now());
}

EngineSnapshot Engine::snapshot() const {
  EngineSnapshot snap;
  snap.time = MetricsClock::now();
  snap.mode = config_.disaggregated() ? "disaggregated" : "colocated";
  snap.connector = std::string(connector_->backend());
  for (const auto& w : workers_) snap.devices.push_back(w->snapshot());
  snap.summary = metrics_.summary(snap.time);
  MetricsTime busy_since;
  {
    std::lock_guard lock(mutex_);
    busy_since = busy_since_;
  }
  // The emission scan runs outside the engine's lock, which submit() and every request's end
  // take. A request submitted since snap.time was read makes the window empty: no rate yet.
  const auto since_busy =
      std::max(std::chrono::nanoseconds{0},
               std::chrono::duration_cast<std::chrono::nanoseconds>(snap.time - busy_since));
  snap.output_rate =
      metrics_.output_rate(snap.time, std::min<std::chrono::nanoseconds>(kRateWindow, since_busy));
  std::lock_guard lock(mutex_);
  snap.transfers = transfers_;
  for (const auto& [id, record] : requests_) {
    std::lock_guard record_lock(record->mutex);
    if (!request_ended(record->info.state)) snap.requests.push_back(record->info);
  }
  return snap;
}

void Engine::set_transfer_fault_injector(KvConnector::FaultInjector injector) {
  connector_->set_fault_injector(std::move(injector));
}

void Engine::set_step_fault_injector(StepFaultInjector injector) {
  std::lock_guard lock(step_fault_mutex_);
  step_fault_set_ = static_cast<bool>(injector);
  step_fault_ = std::move(injector);
}

std::string Engine::step_fault(const std::string& device, int64_t step) const {
  if (!step_fault_set_.load(std::memory_order_relaxed)) return {};
  std::lock_guard lock(step_fault_mutex_);
  return step_fault_ ? step_fault_(device, step) : std::string();
}

}  // namespace tokenfab
