#pragma once
// Devices: where a worker's compute and KV pool live. Today the CPU backend provides "virtual"
// CPU devices (cpu:0, cpu:1, …): each has its own thread team and its own paged KV pool, so a
// prefill device and a decode device on one machine really run in parallel and really copy KV
// between two pools. They share the model's weights, read-only (one copy in memory; a CUDA device
// will hold its own copy in device memory). The CUDA backend plugs in as another Device.
//
// Threads are divided between devices explicitly: `--threads N` is the total, split as evenly as
// possible in device-list order (divide_threads).

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/model/llama_model.h"
#include "core/runtime/kv_storage.h"
#include "core/runtime/model_runner.h"
#include "core/runtime/sampler.h"
#include "core/speculative/draft_device.h"
#include "kernels/cpu/thread_pool.h"

namespace tokenfab {

struct DraftHead;  // core/speculative/draft_head.h

enum class DeviceKind : uint8_t { kCpu, kCuda };

// A device named in both --prefill and --decode serves as two partitions of itself: two workers,
// each with its own pool of blocks over one KV storage (core/kvcache/kv_slots.h: a prompt moves
// from the prefill partition to the decode partition without a copy) and one copy of the weights.
// A GPU's partitions have a stream each (decode at the higher priority, and with --decode-sms SMs
// of their own: core/device/cuda_model.h); a CPU's have a thread team each.
enum class DevicePartition : uint8_t { kWhole, kPrefill, kDecode };

struct DeviceSpec {
  DeviceKind kind = DeviceKind::kCpu;
  int32_t index = 0;
  DevicePartition partition = DevicePartition::kWhole;
  std::string name() const;  // "cpu:0", "cuda:1", "cuda:0/prefill"
  bool operator==(const DeviceSpec&) const = default;
};

// Parses "cpu:0,cpu:1" (a bare "cpu" means cpu:0). `flag` names the option in errors. Throws
// Error on an empty list, an unknown kind, a bad index, a duplicate, or a CUDA device in a build
// without CUDA support.
std::vector<DeviceSpec> parse_device_list(std::string_view text,
                                          std::string_view flag = "--devices");
std::string device_list_name(const std::vector<DeviceSpec>& devices);  // "cpu:0,cpu:1"

// `total` threads over n devices, the first ones getting one more when it does not divide; throws
// Error when total < n_devices (every device needs a thread of its own).
std::vector<int> divide_threads(int total, int n_devices);

// KV pool size from a budget: `kv_blocks` when > 0, else as many blocks as kv_mem_mb MiB hold.
// Throws Error when the result is below one block.
int32_t kv_blocks_for_budget(const HParams& hp, int32_t block_size, int64_t kv_mem_mb,
                             int32_t kv_blocks);

// Throws Error unless `prefill` and `decode` are the prefill and decode partitions of one device.
void check_partition_specs(const DeviceSpec& prefill, const DeviceSpec& decode);

// A device is also what the proposer drafts on (core/speculative/draft_device.h).
class Device : public DraftDevice {
 public:
  virtual ~Device() = default;
  virtual const DeviceSpec& spec() const = 0;
  std::string name() const { return spec().name(); }
  int threads() const override = 0;
  const LlamaModel& model() const override = 0;
  virtual KvPool& kv_storage() = 0;
  // Runs one planned batch (see ModelRunner::run). Call from the device's worker thread only.
  virtual void run(std::span<const BatchSequence> batch, std::vector<float>& logits,
                   std::vector<float>* hidden = nullptr) = 0;
  // Draft taps: with `on`, the hidden rows of later runs are each row's draft features
  // (ModelRunner::run: the final-norm hidden state, then the residual stream after each of
  // draft_tap_layers), hidden_width() floats a row. Returns whether they are on; a device that
  // cannot tap the layers returns false and keeps n_embd-wide rows (CPU and CUDA devices can).
  virtual bool set_draft_taps(bool on) {
    (void)on;
    return false;
  }
  virtual int64_t hidden_width() const { return model().hparams().n_embd; }
  // Whether run_greedy computes the rows' argmax on the device (a GPU: only n_logit ids cross
  // back instead of n_logit · n_vocab logits). False: the caller samples host logits.
  virtual bool greedy_on_device() const { return false; }
  // As run, but gives each logit row's argmax (kernels::argmax's choice: the lowest id among equal
  // maxima) instead of its logits; for steps whose every sampled row is greedy. The default runs
  // run() and takes the argmax on the host.
  virtual void run_greedy(std::span<const BatchSequence> batch, std::vector<int32_t>& argmax,
                          std::vector<float>* hidden = nullptr);
  // Whether run_filtered reduces rows to their sampling candidates on the device (a GPU: a few
  // dozen (logit, id) pairs cross back per row instead of n_vocab logits). False: it sends every
  // row whole.
  virtual bool filters_on_device() const { return false; }
  // As run, but each logit row r comes back as its candidates under filters[r] (one filter per
  // logit row, from the row's request: candidate_filter(params)), or whole where the filter
  // leaves too many (see kernels/cpu/candidates.h); the sampler draws the same tokens from
  // either. The default runs run() and sends every row whole.
  virtual void run_filtered(std::span<const BatchSequence> batch,
                            std::span<const kernels::CandidateFilter> filters, FilteredRows& rows,
                            std::vector<float>* hidden = nullptr);
  // logits (n, n_vocab) of the model's LM head over z (n, n_embd) (draft heads). Worker thread.
  virtual void lm_head(const float* z, int64_t n, std::vector<float>& logits) = 0;
  // Medusa heads' proposals: row i of the levels in order (proposal 0's levels 0..levels-1, then
  // proposal 1's, ...) is z_i = the level's residual block over the proposal's hidden state
  // (DraftHead::residual), and best[i] = lm_head_top's wanted[i] tokens of z_i. The default runs
  // the residual blocks on the host and then lm_head_top; a GPU runs both there, the heads'
  // weights kept on the device while it is used. Worker thread.
  void medusa_top(std::span<const MedusaProposal> proposals, std::span<const int32_t> wanted,
                  std::vector<std::vector<int32_t>>& best) override;
  // Whether mtp_propose drafts on the device (a GPU); false: the worker drafts mtp heads on its
  // host threads, where it can also split one request's steps over them.
  bool mtp_on_device() const override { return false; }
  // mtp heads' chains and trees: drafts[i] and parents[i] as DraftHead::mtp_propose (or
  // mtp_propose_best_first) gives them for proposal i (parent −1: the last token), each node's
  // children the best tokens of the head's draft vocabulary (ties to the lower id). A GPU computes
  // in BF16 where the host reads the LM head's stored type, so a draft may differ where two logits
  // nearly tie (drafts only propose: the output is the same). The default drafts on the calling
  // thread. Worker thread.
  void mtp_propose(std::span<const MtpProposal> proposals,
                   std::vector<std::vector<int32_t>>& drafts,
                   std::vector<std::vector<int32_t>>& parents) override;
  // Draft heads' proposals: best[r] = the wanted[r] tokens with the largest logits of the LM
  // head over z's row r (z: (n, n_embd)), best first, ties to the lower id (kernels::argmax's
  // choice for one; top_tokens). The default runs lm_head and picks on the host threads; a GPU
  // picks on the device and sends back only the ids. Worker thread.
  virtual void lm_head_top(const float* z, int64_t n, std::span<const int32_t> wanted,
                           std::vector<std::vector<int32_t>>& best);
  // Calls fn(i) for i in [0, n) on the device's host threads (sampling a batch's rows); fn must
  // be safe to run concurrently for different i. From the worker thread only.
  void parallel_for(int64_t n, const std::function<void(int64_t)>& fn) override = 0;
  // Streamed KV hand-off: during later runs, store into *counter (release order) how many layers'
  // KV are written to the pool for every row of the batch, as each layer completes; nullptr: off.
  // A device that cannot tell before its run returns (a GPU computing asynchronously) ignores it:
  // the worker stores the last layer when run() has returned. Worker thread only.
  virtual void set_layer_progress(std::atomic<int32_t>* counter) { (void)counter; }
};

// The n tokens with the largest logits (n_vocab), best first (ties: the lower id first).
std::vector<int32_t> top_tokens(const float* logits, int64_t n_vocab, int32_t n);

// Calls fn(i) for i in [0, n) on the threads of `pool` (the caller is one of them); fn must be
// safe to run concurrently for different i.
void parallel_for_on(kernels::ThreadPool& pool, int64_t n, const std::function<void(int64_t)>& fn);

// A CPU virtual device: a thread team of `threads` (the calling worker thread is one of them),
// a KV pool of `kv_blocks` blocks, and a ModelRunner over the shared model.
class CpuDevice final : public Device {
 public:
  CpuDevice(DeviceSpec spec, const LlamaModel& model, int threads, int32_t kv_blocks,
            int32_t block_size);
  // Over `storage`, which another device (the other partition of this CPU) may also use.
  CpuDevice(DeviceSpec spec, const LlamaModel& model, int threads,
            std::shared_ptr<KvStorage> storage);

  const DeviceSpec& spec() const override { return spec_; }
  int threads() const override { return pool_.size(); }
  const LlamaModel& model() const override { return model_; }
  KvStorage& kv_storage() override { return *storage_; }
  void run(std::span<const BatchSequence> batch, std::vector<float>& logits,
           std::vector<float>* hidden = nullptr) override {
    runner_.run(batch, logits, hidden);
  }
  bool set_draft_taps(bool on) override {
    runner_.set_draft_taps(on);
    return on;
  }
  int64_t hidden_width() const override { return runner_.hidden_width(); }
  void lm_head(const float* z, int64_t n, std::vector<float>& logits) override {
    runner_.lm_head(z, n, logits);
  }
  void parallel_for(int64_t n, const std::function<void(int64_t)>& fn) override {
    parallel_for_on(pool_, n, fn);
  }
  void set_layer_progress(std::atomic<int32_t>* counter) override {
    runner_.set_layer_progress(counter);
  }

 private:
  DeviceSpec spec_;
  const LlamaModel& model_;
  kernels::ThreadPool pool_;
  std::shared_ptr<KvStorage> storage_;
  ModelRunner runner_;
};

// The two partitions of one CPU device (check_partition_specs): two thread teams over one KV
// storage of kv_slots blocks, which their workers' pools divide (core/kvcache/kv_slots.h).
std::pair<std::unique_ptr<Device>, std::unique_ptr<Device>> make_cpu_partitions(
    DeviceSpec prefill, DeviceSpec decode, const LlamaModel& model, int prefill_threads,
    int decode_threads, int32_t kv_slots, int32_t block_size);

}  // namespace tokenfab
