#pragma once
// Worker: one device's serving loop on a thread of its own — the PrefillWorker and DecodeWorker
// boxes of the data path (DESIGN.md), and in colocated mode both at once. Each iteration:
//   1. drain the inbox: new requests (to prefill, or to serve whole), prompts arriving from a
//      prefill worker (decode role), holds to release (prefill role);
//   2. clean up requests whose cancel flag is set, wherever they are;
//   3. decode role: reserve blocks for arrived prompts and start their KV transfers; adopt the
//      finished transfers into the running batch; fail the failed ones;
//   4. run one scheduler step: plan → one batched pass on the device → sample each request with
//      its own sampler → complete; publish the tokens;
//   5. prefill role: a request whose prompt is done keeps its blocks under a "hold" sequence
//      (a fork, id −request) and is handed to the router, which picks its decode worker; the
//      decode worker releases the hold when the transfer has ended.
// Workers share nothing mutable: the inbox, a few atomics the router reads, and a snapshot
// published after steps are the only cross-thread state.

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/device/device.h"
#include "core/kvcache/kv_manager.h"
#include "core/serving/chunk_sizer.h"
#include "core/serving/engine.h"
#include "core/serving/scheduler.h"
#include "core/speculative/proposer.h"

namespace tokenfab {

enum class WorkerRole : uint8_t { kColocated, kPrefill, kLongPrefill, kDecode };
const char* worker_role_name(WorkerRole role);

class Worker {
 public:
  // kv_blocks: the blocks of this worker's pool. shared_slots: set for the two partitions of one
  // device, whose pools map onto one storage (core/kvcache/kv_slots.h); prompts then move from
  // the prefill partition to the decode partition without a copy (hand-overs).
  Worker(Engine& engine, std::unique_ptr<Device> device, WorkerRole role,
         const EngineConfig& config, KvConnector& connector,
         Scheduler::EndOfGeneration is_end_of_generation, int32_t kv_blocks,
         std::shared_ptr<KvSlots> shared_slots = nullptr);
  ~Worker();  // stop(): ends every request it still holds as cancelled, joins
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  void start();
  void stop();

  // Thread-safe; each wakes the worker.
  void post_request(std::shared_ptr<Engine::Record> record);  // prefill it (or serve it whole)
  // Decode role: a request whose prompt's KV is to arrive from its prefill worker. Streamed: handed
  // over before the prefill step that computes the prompt's last chunk; its prefill worker still
  // owns it until post_first_token() (the step ended with a token to decode from) or until it
  // ends the request itself (wake() then tells this worker to drop its side).
  void post_incoming(std::shared_ptr<Engine::Record> record, bool streamed = false);
  void post_first_token(std::shared_ptr<Engine::Record> record);
  void post_release(SequenceId hold);  // prefill role: drop a hold
  void wake();

  // Read by the router from any thread.
  WorkerRole role() const { return role_; }
  const std::string& name() const { return name_; }
  Device& device() { return *device_; }
  // Whether this worker's device hands draft heads the layer taps (Device::set_draft_taps).
  bool draft_taps() const { return draft_taps_; }
  int64_t queued_prefill_tokens() const { return queued_prefill_tokens_.load(); }
  int32_t free_blocks() const { return free_blocks_.load(); }
  // Leading prompt tokens this worker's pool holds in its prefix cache (per the last published
  // view; full blocks only).
  int32_t cached_prefix_tokens(std::span<const TokenId> prompt) const;
  DeviceSnapshot snapshot() const;  // as last published (after a step, at most every 20 ms)

 private:
  struct Incoming {
    std::shared_ptr<Engine::Record> record;
    bool reserved = false;
    TransferId transfer = -1;
    // A hand-over (both pools in one storage): on success the request's full blocks from
    // `first_block` on adopt `adopted`, the storage blocks its prefill side wrote.
    bool hand_over = false;
    int32_t first_block = 0;
    std::vector<int32_t> adopted;
    // False while a streamed request's prefill step runs: its blocks are reserved and its KV
    // copied, but only its prefill worker may end it. A failure found meanwhile waits in `error`.
    bool owned = true;
    std::optional<std::string> error;
  };

  // What one step carries from stage to stage (worker_step.cpp).
  struct StepRun {
    MetricsTime start{}, end{};  // end: when its tokens were accepted
    StepPlan plan;
    int32_t prompt_tokens = 0;  // of the step's rows, prompt tokens (the rest decode and verify)
    double compute_s = 0.0;     // inside the device's pass
    double propose_s = 0.0;     // proposing the next drafts
    std::vector<ChunkResult> results;
    std::vector<EmittedToken> emitted;
    std::unordered_map<RequestId, TokenEvent> events;  // each request's tokens of this step
    std::vector<SequenceState> finished;
  };

  void loop();
  void drain_inbox();
  void handle_cancellations();
  void handle_incoming();
  // One scheduler step: plan → lay_out_batch → run_batch → verify_and_accept → publish_tokens →
  // propose_drafts → end_or_hand_off → record_step. False when there was nothing to run.
  bool step();
  void lay_out_batch(StepRun& run);      // block copies, the batch's rows, prefill progress
  void run_batch(StepRun& run);          // the pass on the device (greedy, filtered or whole)
  void verify_and_accept(StepRun& run);  // sample / verify each request, complete the step
  void publish_tokens(StepRun& run);     // token events, timelines, request info
  void end_or_hand_off(StepRun& run);    // finished requests: end, or to their decode worker
  void record_step(const StepRun& run);  // preemptions, prefix cache, step costs, samples
  // Prefill role: holds for this step's finished prompts, the streamed ones handed off now; the
  // counter of layers written that their transfers follow (null when none is streamed).
  std::shared_ptr<std::atomic<int32_t>> hand_off_streamed(const StepPlan& plan);
  // A verification's acceptance per draft position, and the confidence rule's calibration.
  void record_verification(Engine::Record& record, const ScheduledChunk& chunk,
                           const ChunkResult& result);
  void admit(const std::shared_ptr<Engine::Record>& record);
  void handle_finished();
  void end(const std::shared_ptr<Engine::Record>& record, RequestState state, std::string error,
           TokenEvent last, int64_t step, MetricsTime t);
  // Samples each chunk with logits with its request's sampler: one token, or for a verification
  // chunk the accepted drafts and one token of the target's.
  std::vector<ChunkResult> sample(const StepPlan& plan);
  // Draft trees: the accepted path's KV rows are copied onto the positions after the last token.
  void move_accepted_tree_rows(const StepPlan& plan, const std::vector<ChunkResult>& results);
  // Keeps the hidden row each speculating request's next drafts start from and, on decoding
  // workers, asks the proposer for every decoding request's drafts (worker_drafts.cpp).
  void propose_drafts(const StepPlan& plan, const std::vector<ChunkResult>& results);
  // After a verifying step of `record` that emitted `tokens`: the proposer's head switch, if any.
  void consider_head_switch(Engine::Record& record, int32_t tokens);
  void release_hold(SequenceId hold);
  // After a step threw (a device error: a CUDA call that failed, an injected fault): every
  // request this worker owns ends as failed with `error`, giving back its blocks, holds and
  // transfers, so that the worker goes on with an empty batch instead of taking the process down.
  // A device whose errors are sticky (a CUDA context after a trap) fails each later step the same
  // way, so the requests routed to it fail with the same message.
  void fail_all(const std::string& error);
  void finish_transfer(Incoming& in, MetricsTime t);
  // Decode role: `in` fails with `error`, now if this worker owns it, else once it does; its
  // reservation, transfer and hold are given back at once. False: it stays in incoming_.
  bool fail_incoming(Incoming& in, std::string error);
  // Decode role: gives back what `in` holds (its transfer, stopped; its reservation; the prefill
  // side's hold, unless a failure already gave it back) without ending the request.
  void give_back(Incoming& in);
  void publish(bool force);
  // The sequence that keeps a prefilled prompt's blocks for its transfer (prefill role).
  static SequenceId hold_id(RequestId id) { return -id; }
  bool prefill_role() const {
    return role_ == WorkerRole::kPrefill || role_ == WorkerRole::kLongPrefill;
  }

  Engine& engine_;
  std::unique_ptr<Device> device_;
  const bool streamed_transfer_;
  const WorkerRole role_;
  const std::string name_;
  const int64_t n_embd_, n_vocab_;
  bool draft_taps_ = false;
  int64_t hidden_width_ = 0;  // floats of a hidden_ row: the device's draft features
  KvConnector& connector_;
  KvManager kv_;
  Scheduler scheduler_;

  // Worker thread only.
  std::unordered_map<RequestId, std::shared_ptr<Engine::Record>> requests_;  // in the scheduler
  std::deque<Incoming> incoming_;  // decode role: arrived prompts, oldest first
  std::vector<float> logits_;
  std::vector<int32_t> argmax_;  // greedy steps on a device that takes the argmax: one id per row
  bool greedy_step_ = false;
  // Sampled steps on a device that filters rows: each logit row's filter, and the rows back as
  // sampling candidates (or whole).
  std::vector<kernels::CandidateFilter> filters_;
  FilteredRows filtered_;
  bool filtered_step_ = false;
  std::vector<float> hidden_;  // final-norm hidden states of the logit rows (draft features)
  // Drafts for the next steps, and the step and proposal costs that adaptive lengths weigh.
  Proposer proposer_;
  // Colocated, chunked, with a step target: sizes prompt chunks while decodes run.
  std::optional<ChunkSizer> chunk_sizer_;

  std::vector<BatchSequence> batch_;
  std::vector<std::vector<int32_t>> tables_;  // each chunk's blocks as storage slots
  std::vector<TokenId> sampled_;
  std::vector<Engine::Record*> sampling_;  // the records of the rows with logits, in plan order
  int64_t steps_ = 0;
  double busy_s_ = 0, compute_s_ = 0;
  int64_t decode_steps_ = 0, decode_rows_ = 0;
  double decode_busy_s_ = 0, decode_compute_s_ = 0;
  std::deque<StepSample> recent_steps_;
  int64_t seen_preemptions_ = 0;
  PrefixCacheStats seen_prefix_{};
  MetricsTime last_publish_{};

  // Inbox.
  std::mutex inbox_mutex_;
  std::condition_variable inbox_cv_;
  std::vector<std::shared_ptr<Engine::Record>> new_requests_;
  std::vector<std::shared_ptr<Engine::Record>> new_incoming_;
  std::vector<bool> new_incoming_streamed_;  // pairwise with new_incoming_
  std::vector<std::shared_ptr<Engine::Record>> first_tokens_;
  std::vector<SequenceId> releases_;
  bool woken_ = false;
  bool stopping_ = false;
  std::thread thread_;

  // Published.
  std::atomic<int64_t> queued_prefill_tokens_{0};
  std::atomic<int32_t> free_blocks_{0};
  mutable std::mutex published_mutex_;
  DeviceSnapshot published_;
  std::unordered_set<uint64_t> published_hashes_;
};

}  // namespace tokenfab
