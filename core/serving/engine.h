#pragma once
// Engine: the one facade the CLI, the GUI and later an API server use (DESIGN.md "Data path").
//
//   submit(request) → id      routed to a prefill (or colocated) device; returns at once
//   subscribe(callback)       token events: request id, tokens, timestamp, step id, device
//   cancel(id)                in any state; frees every block the request holds, on every device
//   snapshot()                metrics summary, per-device KV snapshots, recent transfers, requests
//
// Modes:
//   colocated       (default; `devices`) every device is a Worker that prefills and decodes its
//                   own requests: one scheduler, token budget shared by prefill chunks and
//                   decodes, chunked prefill (or not, for comparison).
//   disaggregated   (`prefill` and `decode` both set, disjoint) prefill Workers compute prompts
//                   and sample the first token; the KvConnector moves the prompt's KV blocks to a
//                   decode Worker, which decodes the rest in continuous batches. Optionally a
//                   long-prompt pool (`long_prefill`, `long_prompt_tokens`) prefills prompts
//                   longer than N tokens on devices of their own.
// Router (router.h): prefill device by least queued prefill tokens; decode device by most free KV
// blocks; a prompt mostly cached on some decode device with a short uncached tail (a follow-up
// turn whose earlier turns that device decoded) is prefilled right there, so only its new tokens
// are computed.
//
// Request lifecycle: queued → prefilling → transferring → decoding → finished | cancelled |
// failed, each transition timestamped (colocated requests skip transferring). Outputs do not
// depend on the mode: a row's result depends only on its tokens (see paged_attention.h), and each
// request's sampler travels with it, so greedy — or seeded — generation gives the same tokens
// colocated, disaggregated, batched or alone.
//
// Threads: one worker thread per device, plus the connector's. Callbacks run on worker threads
// (keep them short; they may call cancel() and submit(), not wait()). All methods are
// thread-safe.

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/kvcache/kv_snapshot.h"
#include "core/metrics/aggregate.h"
#include "core/metrics/request_metrics.h"
#include "core/model/llama_model.h"
#include "core/runtime/sampler.h"
#include "core/runtime/token_logprobs.h"
#include "core/serving/request.h"
#include "core/speculative/draft_head.h"
#include "core/speculative/draft_tree.h"
#include "core/speculative/head_switch.h"
#include "core/transfer/kv_connector.h"

namespace tokenfab {

struct EngineConfig {
  std::string devices = "cpu:0";   // colocated mode: these devices, each a full worker
  std::string prefill;             // disaggregated mode: prefill devices ...
  std::string decode;              // ... and decode devices (disjoint)
  std::string long_prefill;        // optional long-prompt prefill pool (disaggregated only)
  int32_t long_prompt_tokens = 0;  // prompts longer than this go to long_prefill (0: off)
  int threads = 0;                 // total threads over all devices (0: the hardware's)
  int64_t kv_mem_mb = 512;         // KV pool per device, MiB (unless kv_blocks > 0)
  int32_t kv_blocks = 0;           // KV pool per device, blocks
  int32_t block_size = 16;         // tokens per KV block
  int32_t token_budget = 512;      // tokens computed per step per device
  int32_t max_running = 64;        // sequences per device batch
  bool chunked_prefill = true;     // colocated: read long prompts in budget-sized chunks
  // Colocated, chunked: while decodes run, a step reads only as many prompt tokens as keep it near
  // this many milliseconds by the device's measured speeds (chunk_sizer.h), at most the token
  // budget; 0: every step may fill the budget.
  double step_target_ms = 50.0;
  std::string connector = "loopback";
  // Disaggregated: hand a request to its decode device before the prefill step that computes its
  // prompt's last chunk, so its KV is copied layer by layer while that step runs (false: after
  // the step, for comparison).
  bool streamed_transfer = true;
  // Disaggregated: a prompt is prefilled on a decode device when that device's prefix cache
  // leaves at most this many tokens to compute (0: never).
  int32_t decode_side_prefill_tokens = 256;
  int64_t max_context = 0;  // prompt + max_tokens limit (0: the model's training context)
  // One GPU as both the prefill and the decode device: SMs the decode partition gets to itself
  // (green contexts, CudaOptions::decode_sms); 0: the partitions share the SMs.
  int32_t decode_sms = 0;
  // GPUs: few-row steps run their layers in one cooperative kernel (CudaOptions::fused_layers).
  bool fused_layers = false;
  // With fused_layers: their products on tensor cores (CudaOptions::fused_tensor_cores).
  bool fused_tensor_cores = false;
  // GPUs: the layered path computes the non-Llama families (CudaOptions::families; not yet
  // verified on a GPU, so off by default and such a model is refused on a GPU without it).
  bool cuda_families = false;

  // Throws Error naming the field for an inconsistent configuration.
  void validate() const;
  int total_threads() const;  // `threads`, or the hardware's when 0
  // The most tokens a request's prompt and max_tokens may add up to: max_context, or the model's
  // training context when 0 (0 when neither is known: no limit).
  int64_t context_limit(const HParams& hp) const;
  bool disaggregated() const { return !prefill.empty() || !decode.empty(); }
  // The devices in a line: "cuda:0" (colocated), or "prefill cpu:0, decode cuda:0" (with ", long
  // prefill cpu:1" when a long-prompt pool is set); ", fused decode layers" follows when they are
  // on and a GPU is named.
  std::string devices_text() const;
};

enum class RequestState : uint8_t {
  kQueued,
  kPrefilling,
  kTransferring,
  kDecoding,
  kFinished,
  kCancelled,
  kFailed,
};
inline constexpr size_t kRequestStateCount = 7;
const char* request_state_name(RequestState state);
inline bool request_ended(RequestState s) {
  return s == RequestState::kFinished || s == RequestState::kCancelled ||
         s == RequestState::kFailed;
}

struct GenerationRequest {
  GenerationRequest() = default;
  GenerationRequest(std::vector<TokenId> prompt_tokens, int32_t max_new_tokens)
      : prompt(std::move(prompt_tokens)), max_tokens(max_new_tokens) {}

  std::vector<TokenId> prompt;
  int32_t max_tokens = 128;
  SamplingParams sampling{.temperature = 0.0f};  // greedy unless set
  bool stop_at_end_of_generation = true;
  // Speculative decoding: `head` proposes tokens after each step's token and the target verifies
  // them in its next step. Lossless: greedy output equals the output without a head; with
  // temperature, speculative sampling keeps the target's distribution.
  //   chain (tree_shape empty): draft_len tokens, head k's top token at depth k;
  //   tree: tree_shape[d] children per node at depth d + 1 (head d's top tree_shape[d] tokens),
  //   at most kMaxTreeNodes nodes, verified in one pass with each node attending only its
  //   ancestors; greedy only (temperature 0).
  std::shared_ptr<const DraftHead> head;
  // `auto` selection: the heads this request may switch to mid-generation (head_switch.h), best
  // recorded first, `head` among them; empty: `head` holds for the whole request.
  std::vector<HeadCandidate> head_candidates;
  int32_t draft_len = 4;  // chain: at most the head's number of heads
  // Chain only: choose each step's length in [0, draft_len] from the device's measured step costs
  // and the request's acceptance so far (draft_length.h) instead of always draft_len.
  bool adaptive_draft = false;
  std::vector<int32_t> tree_shape;
  // tree, mtp heads: > 0 grows a dynamic tree of at most this many nodes, the most probable ones
  // of the tree_shape tree by the head's own path probability
  // (DraftHead::mtp_propose_best_first), instead of the whole static tree; 0: the static tree. A
  // Medusa head, whose candidates do not depend on their parents, always drafts the static tree.
  int32_t tree_nodes = 0;
  static constexpr int32_t kMaxTreeNodes = kMaxDraftTreeNodes;
  // > 0: context lookup drafts (context_lookup.h) — the tokens that followed the latest earlier
  // occurrence of the context's last 1..lookup tokens. With a head they are one more branch of
  // its proposal, as long as its chain or as deep as its tree (a chain becomes a tree where they
  // differ); without a head they are the whole proposal, a chain of up to draft_len tokens.
  // Greedy only (temperature 0).
  int32_t lookup = 0;
  static constexpr int32_t kMaxLookup = 8;
  // >= 0: every emitted token's log-probability under the model's raw distribution, with this
  // many most probable alternatives (TokenEvent::logprobs); −1: none. A step with such a request
  // brings its logits rows to the host (no argmax or filter on the device).
  int32_t logprobs = -1;
  static constexpr int32_t kMaxLogprobs = 20;
};

// Speculation figures of one request (per draft position: proposed and accepted counts).
struct SpeculationStats {
  std::vector<int64_t> proposed_at, accepted_at;
  int64_t verify_steps = 0;  // steps that verified drafts
  double draft_s = 0.0;      // time spent proposing
  double verify_s = 0.0;     // the verifying steps' time, each from its start to its emission
  struct HeadSwitch {
    int32_t at_token = 0;  // output tokens emitted before the switch
    std::string from, to;
    double live_accept_per_step = 0.0;  // the left head's, over the policy's window
    double from_record = 0.0, to_record = 0.0;
  };
  std::vector<HeadSwitch> switches;  // mid-generation head switches (auto selection)
  // Adaptive chains: steps proposed with each draft length (index = length; 0: a plain step).
  std::vector<int64_t> length_steps;
};

struct TokenEvent {
  RequestId id = 0;
  std::vector<TokenId> tokens;         // emitted by one step (empty on the final event of a request
                                       // that ended without new tokens: cancelled or failed)
  std::vector<bool> drafted;           // per token: proposed by the draft head and accepted
  std::vector<TokenLogprob> logprobs;  // per token, when the request asked (logprobs >= 0)
  // A step that verified drafts of this request: the time spent proposing them (0 for context
  // lookup drafts alone) and this step's time from its start to this emission — the forward pass
  // over the drafts, sampling and acceptance. Both 0 for a plain step.
  double draft_s = 0.0;
  double verify_s = 0.0;
  MetricsTime time{};
  int64_t step = -1;  // the device's step id
  std::string device;
  RequestState state = RequestState::kDecoding;  // after this event; an ended state is the last
  std::string error;                             // kFailed: why
};

struct RequestInfo {
  RequestId id = 0;
  RequestState state = RequestState::kQueued;
  int32_t n_prompt = 0;
  int32_t cached_prompt_tokens = 0;  // prompt tokens found in the prefill device's prefix cache
  std::vector<TokenId> output;       // tokens generated so far
  std::string prefill_device, decode_device;
  std::array<std::optional<MetricsTime>, kRequestStateCount> entered;  // by RequestState
  std::string error;
  int32_t preemptions = 0;
  std::string head;  // the draft head's name, or empty
  SpeculationStats speculation;
  std::optional<RequestMetrics> metrics;  // once ended with at least one token
};

// One step of a device, for the roofline view: what it computed and how long it took.
struct StepSample {
  MetricsTime end{};
  int32_t rows = 0;                // tokens through the layers (batch rows)
  int32_t logit_rows = 0;          // rows through the LM head
  int32_t sequences = 0;           // sequences in the batch
  int64_t attended_positions = 0;  // Σ over rows of the positions each attends (attention work)
  int64_t kv_positions = 0;        // Σ over sequences of their context (KV rows read once)
  double seconds = 0.0;            // the whole step (planning … events)
  double compute_s = 0.0;          // inside the device's batched pass
};

struct DeviceSnapshot {
  std::string name;
  std::string role;  // "colocated", "prefill", "long-prefill", "decode"
  int threads = 0;
  KvSnapshot kv;
  int32_t running = 0, waiting = 0, receiving = 0;
  int64_t steps = 0;
  int64_t queued_prefill_tokens = 0;
  // Where the worker's time went, seconds since start: `busy_s` in steps (planning, the pass,
  // sampling, bookkeeping, events), `compute_s` inside the device's batched pass. The same for
  // steps that were all decodes, with the rows they computed: the engine's own overhead on a
  // decode step is 1 − decode_compute_s / decode_busy_s.
  double busy_s = 0, compute_s = 0;
  int64_t decode_steps = 0, decode_rows = 0;
  double decode_busy_s = 0, decode_compute_s = 0;
  // Colocated, chunked, with a step target: prompt tokens a step with decodes may read now
  // (ChunkSizer); 0 when the worker has no target.
  int32_t prefill_limit = 0;
  std::vector<StepSample> recent_steps;  // the last kRecentSteps steps, oldest first
  static constexpr size_t kRecentSteps = 64;
};

struct EngineSnapshot {
  MetricsTime time{};
  std::string mode;  // "colocated" or "disaggregated"
  std::string connector;
  std::vector<DeviceSnapshot> devices;
  ServingSummary summary;  // since the engine started
  // Output tokens per second over the last kRateWindow, or since the engine last went from no
  // request to one when that is later: idle time before a run's first request does not count
  // (so a run shorter than the window shows its own rate, not a share of it).
  WindowRate output_rate;
  std::vector<KvTransferStats> transfers;  // most recent last (up to kTransferHistory)
  std::vector<RequestInfo> requests;       // not yet ended
};

class Worker;
class Router;

class Engine {
 public:
  using TokenCallback = std::function<void(const TokenEvent&)>;
  using EndOfGeneration = std::function<bool(TokenId)>;
  static constexpr size_t kTransferHistory = 256;
  static constexpr size_t kEndedHistory = 10000;         // ended requests request() still knows
  static constexpr std::chrono::seconds kRateWindow{2};  // the live output rate's window

  // Creates the devices and workers and starts their threads. `model` outlives the engine.
  // Throws Error for a bad configuration (see EngineConfig::validate, parse_device_list).
  Engine(const LlamaModel& model, EngineConfig config, EndOfGeneration is_end_of_generation = {});
  ~Engine();  // cancels what is left and joins the workers
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Throws Error for an empty prompt, a token outside the vocabulary, max_tokens < 1, bad
  // sampling values, or prompt + max_tokens beyond the context limit.
  RequestId submit(GenerationRequest request);
  // The same, with `on_event` called for this request's events only (on worker threads, one at
  // a time, from before submit() returns): what a caller that follows its own requests uses
  // instead of subscribe(), which hands every caller every request's events.
  RequestId submit(GenerationRequest request, TokenCallback on_event);
  // Why a caller cancels: it gave up on the request (the client went away, the user pressed
  // stop), or the caller found a stop string in its text — the request then counts as finished
  // with reason "stop" in the live counters (its state is kCancelled either way).
  enum class CancelReason { kAbort, kStopText };
  // False when the id is unknown or the request has already ended.
  bool cancel(RequestId id, CancelReason reason = CancelReason::kAbort);
  // The cumulative counters (GET /metrics): ServingMetrics::live_counters.
  LiveCounters live_counters() const { return metrics_.live_counters(); }
  int64_t subscribe(TokenCallback callback);
  void unsubscribe(int64_t subscription);

  RequestInfo request(RequestId id) const;  // throws Error for an unknown id
  RequestInfo wait(RequestId id);           // blocks until the request has ended
  void wait_idle();                         // blocks until every submitted request has ended
  EngineSnapshot snapshot() const;
  ServingSummary summary() const;  // snapshot().summary, without the KV copies
  Goodput goodput(const Slo& slo) const;
  // Fault drills and tests: see KvConnector::set_fault_injector.
  void set_transfer_fault_injector(KvConnector::FaultInjector injector);
  // Fault drills and tests: called before each step's pass on a device (its name and step id); a
  // non-empty result makes that step fail with it as a device error would (the worker ends its
  // requests as failed and goes on). Unset by default.
  using StepFaultInjector = std::function<std::string(const std::string& device, int64_t step)>;
  void set_step_fault_injector(StepFaultInjector injector);

  const EngineConfig& config() const { return config_; }
  MetricsTime started() const { return started_; }

  // For workers (engine.cpp, worker.cpp): not part of the facade.
  struct Record;
  // `record`'s event: to its own callback, then to every subscriber.
  void publish(const Record& record, const TokenEvent& event);
  void on_ended(Record& record);
  // Prefill worker → the decode worker the router picks. Streamed: before the step that computes
  // the prompt's last chunk (the prefill worker still owns the request until that step ends).
  void hand_off(std::shared_ptr<Record> record, Worker& from, bool streamed);
  ServingMetrics& metrics() { return metrics_; }
  void on_transfer_ended(const KvTransferStats& stats);
  // The step fault injector's verdict for (device, step); empty when none is set.
  std::string step_fault(const std::string& device, int64_t step) const;

 private:
  const LlamaModel& model_;
  EngineConfig config_;
  EndOfGeneration is_end_of_generation_;
  const MetricsTime started_;
  ServingMetrics metrics_;
  std::unique_ptr<KvConnector> connector_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::string untapped_device_;  // a worker's device without draft taps, or empty
  std::unique_ptr<Router> router_;

  mutable std::mutex mutex_;  // requests_, transfers_, next_id_
  std::condition_variable ended_;
  std::map<RequestId, std::shared_ptr<Record>> requests_;
  std::deque<RequestId> ended_ids_;  // oldest first
  std::vector<KvTransferStats> transfers_;
  RequestId next_id_ = 1;
  int64_t n_active_ = 0;
  MetricsTime busy_since_{};  // when n_active_ last rose from 0

  mutable std::mutex step_fault_mutex_;
  std::atomic<bool> step_fault_set_{false};  // read on every step without the mutex
  StepFaultInjector step_fault_;

  mutable std::mutex subscribers_mutex_;
  std::map<int64_t, TokenCallback> subscribers_;
  // What publish() calls: the subscribers as of the last change, shared (no copy per event).
  std::shared_ptr<const std::vector<TokenCallback>> subscriber_list_ =
      std::make_shared<const std::vector<TokenCallback>>();
  int64_t next_subscription_ = 1;
};

}  // namespace tokenfab
