// The loopback KvConnector: both pools live in this process's host memory (CPU virtual devices),
// so a transfer is a memcpy per (layer, block) on the connector's own thread. Transfers run one at
// a time in send() order; one mutex guards the bookkeeping and is never held while copying, so
// poll() and stats() answer at once however large the copy.

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "core/common/error.h"
#include "core/common/log.h"
#include "core/transfer/kv_connector.h"

namespace tokenfab {
namespace {

// How long the worker sleeps between looks at a producer's layers_ready: short against a layer's
// compute time (milliseconds), long enough not to keep a core busy while it waits.
constexpr auto kLayerPollInterval = std::chrono::microseconds(50);

constexpr const char* kCancelled = "cancelled";

bool has_ended(TransferState state) {
  return state == TransferState::kDone || state == TransferState::kFailed;
}

std::string describe(const KvTransferSpec& spec) {
  return "KV transfer of request " + std::to_string(spec.request) + " (" +
         std::string(spec.src->device()) + " → " + std::string(spec.dst->device()) + ")";
}

// Checks one side's block ids against its pool; throws naming the first bad one.
void check_block_ids(const KvTransferSpec& spec, const KvBlockStore& store,
                     const std::vector<int32_t>& blocks, const char* side) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i] < 0 || blocks[i] >= store.n_blocks())
      throw Error(describe(spec) + ": " + side + " block " + std::to_string(blocks[i]) +
                  " (entry " + std::to_string(i) + ") is outside " + std::string(store.device()) +
                  "'s pool of " + std::to_string(store.n_blocks()) + " blocks");
  }
}

void check_host_memory(const KvBlockStore& store) {
  if (store.memory() != KvMemory::kHost)
    throw Error("the loopback connector copies host memory only; " + std::string(store.device()) +
                " holds its KV in CUDA memory");
}

void validate(const KvTransferSpec& spec) {
  if (spec.src == nullptr || spec.dst == nullptr)
    throw Error("KV transfer of request " + std::to_string(spec.request) + ": " +
                (spec.src == nullptr ? "no source" : "no destination") + " KV store given");
  if (spec.src == spec.dst)
    throw Error(describe(spec) + ": source and destination are the same KV store");
  const KvBlockStore& src = *spec.src;
  const KvBlockStore& dst = *spec.dst;
  check_host_memory(src);
  check_host_memory(dst);
  if (src.n_layers() != dst.n_layers() || src.block_size() != dst.block_size() ||
      src.block_bytes() != dst.block_bytes())
    throw Error(describe(spec) + ": the pools differ in geometry (" + std::string(src.device()) +
                ": " + std::to_string(src.n_layers()) + " layers, blocks of " +
                std::to_string(src.block_size()) + " tokens and " +
                std::to_string(src.block_bytes()) + " bytes; " + std::string(dst.device()) + ": " +
                std::to_string(dst.n_layers()) + " layers, blocks of " +
                std::to_string(dst.block_size()) + " tokens and " +
                std::to_string(dst.block_bytes()) + " bytes)");
  if (spec.src_blocks.size() != spec.dst_blocks.size())
    throw Error(describe(spec) + ": " + std::to_string(spec.src_blocks.size()) +
                " source blocks but " + std::to_string(spec.dst_blocks.size()) +
                " destination blocks");
  check_block_ids(spec, src, spec.src_blocks, "source");
  check_block_ids(spec, dst, spec.dst_blocks, "destination");
  // Two source blocks onto one destination block would leave it holding whichever came last.
  std::unordered_set<int32_t> seen;
  for (const int32_t b : spec.dst_blocks) {
    if (!seen.insert(b).second)
      throw Error(describe(spec) + ": destination block " + std::to_string(b) +
                  " is listed more than once");
  }
  const int64_t capacity = static_cast<int64_t>(spec.dst_blocks.size()) * dst.block_size();
  if (spec.n_tokens < 0 || spec.n_tokens > capacity)
    throw Error(describe(spec) + ": " + std::to_string(spec.n_tokens) + " tokens do not fit in " +
                std::to_string(spec.dst_blocks.size()) + " blocks of " +
                std::to_string(dst.block_size()) + " tokens");
}

class LoopbackConnector final : public KvConnector {
 public:
  LoopbackConnector() : worker_([this] { run(); }) {}
  ~LoopbackConnector() override;
  LoopbackConnector(const LoopbackConnector&) = delete;
  LoopbackConnector& operator=(const LoopbackConnector&) = delete;

  std::string_view backend() const override { return "loopback"; }
  TransferId send(KvTransferSpec spec) override;
  TransferState poll(TransferId id) const override;
  KvTransferStats stats(TransferId id) const override;
  TransferState wait(TransferId id) override;
  void cancel(TransferId id) override;
  KvTransferStats release(TransferId id) override;
  void set_fault_injector(FaultInjector injector) override;

 private:
  struct Transfer {
    KvTransferSpec spec;  // immutable once queued: the worker reads it without the lock
    KvTransferStats stats;
    bool cancel_requested = false;
  };

  void run();
  // Copies every layer of `t` (state kTransferring); returns "" or the error that stopped it.
  std::string copy_layers(Transfer& t);
  // Blocks until the producer has finished `layer` or the transfer is to stop; false: stop.
  bool wait_for_layer(const Transfer& t, int32_t layer);
  bool should_stop(const Transfer& t) const;                         // takes the lock
  void finish(Transfer& t, TransferState state, std::string error);  // lock held
  const Transfer& find(TransferId id) const;                         // lock held
  Transfer& find(TransferId id) { return const_cast<Transfer&>(std::as_const(*this).find(id)); }

  mutable std::mutex mu_;
  std::condition_variable work_cv_;   // the worker: a transfer was queued, or shutdown
  std::condition_variable ended_cv_;  // wait(): some transfer ended
  // Node-based, so a Transfer stays put while the worker copies it without the lock; release()
  // erases only ended transfers, which the worker no longer touches.
  std::unordered_map<TransferId, Transfer> transfers_;
  std::deque<TransferId> queue_;  // pending, in send() order
  TransferId next_id_ = 1;
  bool stopping_ = false;
  // Shared so the worker can pick up the current one per layer without copying the function.
  std::shared_ptr<const FaultInjector> injector_;
  std::thread worker_;  // last: started once everything above is constructed
};

LoopbackConnector::~LoopbackConnector() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    for (const TransferId id : queue_) finish(find(id), TransferState::kFailed, kCancelled);
    queue_.clear();
  }
  work_cv_.notify_all();
  worker_.join();
}

TransferId LoopbackConnector::send(KvTransferSpec spec) {
  validate(spec);
  const MetricsTime now = MetricsClock::now();
  KvTransferStats stats;
  stats.request = spec.request;
  stats.src = std::string(spec.src->device());
  stats.dst = std::string(spec.dst->device());
  stats.blocks = static_cast<int32_t>(spec.src_blocks.size());
  stats.tokens = spec.n_tokens;
  stats.queued = now;
  // Nothing to copy (the destination already holds every block, e.g. through its prefix cache):
  // done at once rather than behind other transfers or waiting on a producer.
  const bool empty = spec.src_blocks.empty();
  if (empty) {
    stats.state = TransferState::kDone;
    stats.layers_done = spec.src->n_layers();
    stats.started = stats.ended = now;
  }
  TransferId id;
  {
    std::lock_guard lock(mu_);
    id = next_id_++;
    stats.id = id;
    transfers_.emplace(id, Transfer{std::move(spec), std::move(stats), false});
    if (!empty) queue_.push_back(id);
  }
  if (!empty) work_cv_.notify_one();
  return id;
}

const LoopbackConnector::Transfer& LoopbackConnector::find(TransferId id) const {
  const auto it = transfers_.find(id);
  if (it == transfers_.end())
    throw Error("unknown KV transfer " + std::to_string(id) + " (never sent, or released)");
  return it->second;
}

TransferState LoopbackConnector::poll(TransferId id) const {
  std::lock_guard lock(mu_);
  return find(id).stats.state;
}

KvTransferStats LoopbackConnector::stats(TransferId id) const {
  std::lock_guard lock(mu_);
  return find(id).stats;
}

TransferState LoopbackConnector::wait(TransferId id) {
  std::unique_lock lock(mu_);
  find(id);  // throws for an unknown id before blocking
  // Looked up afresh on every wake-up: another thread may release the transfer once it ended.
  TransferState state = TransferState::kPending;
  bool released = false;
  ended_cv_.wait(lock, [&] {
    const auto it = transfers_.find(id);
    if (it == transfers_.end()) return released = true;
    state = it->second.stats.state;
    return has_ended(state);
  });
  if (released)
    throw Error("KV transfer " + std::to_string(id) + " was released while being waited for");
  return state;
}

void LoopbackConnector::cancel(TransferId id) {
  std::lock_guard lock(mu_);
  Transfer& t = find(id);
  if (has_ended(t.stats.state)) return;
  t.cancel_requested = true;
  if (t.stats.state == TransferState::kPending) {
    // Not started: it ends now, so wait() need not sit behind the transfers queued before it.
    std::erase(queue_, id);
    finish(t, TransferState::kFailed, kCancelled);
  }
}

KvTransferStats LoopbackConnector::release(TransferId id) {
  std::lock_guard lock(mu_);
  const auto it = transfers_.find(id);
  if (it == transfers_.end())
    throw Error("unknown KV transfer " + std::to_string(id) + " (never sent, or released)");
  if (!has_ended(it->second.stats.state))
    throw Error("KV transfer " + std::to_string(id) + " is still " +
                transfer_state_name(it->second.stats.state) +
                "; cancel() and wait() for it before releasing it");
  KvTransferStats stats = std::move(it->second.stats);
  transfers_.erase(it);
  return stats;
}

void LoopbackConnector::set_fault_injector(FaultInjector injector) {
  auto shared = injector ? std::make_shared<const FaultInjector>(std::move(injector)) : nullptr;
  std::lock_guard lock(mu_);
  injector_ = std::move(shared);
}

void LoopbackConnector::finish(Transfer& t, TransferState state, std::string error) {
  t.stats.state = state;
  t.stats.error = std::move(error);
  t.stats.ended = MetricsClock::now();
  if (state == TransferState::kDone)
    logger("transfer")
        ->debug("transfer {} (request {}, {} → {}): {} blocks, {} bytes in {:.3f} ms", t.stats.id,
                t.stats.request, t.stats.src, t.stats.dst, t.stats.blocks, t.stats.bytes,
                t.stats.seconds() * 1e3);
  else
    logger("transfer")
        ->debug("transfer {} (request {}) failed: {}", t.stats.id, t.stats.request, t.stats.error);
  ended_cv_.notify_all();
}

bool LoopbackConnector::should_stop(const Transfer& t) const {
  std::lock_guard lock(mu_);
  return t.cancel_requested || stopping_;
}

void LoopbackConnector::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;  // the destructor has failed whatever was queued
    Transfer& t = find(queue_.front());
    queue_.pop_front();
    t.stats.state = TransferState::kTransferring;
    t.stats.started = MetricsClock::now();
    lock.unlock();
    std::string error = copy_layers(t);
    const TransferState state = error.empty() ? TransferState::kDone : TransferState::kFailed;
    lock.lock();
    finish(t, state, std::move(error));
  }
}

bool LoopbackConnector::wait_for_layer(const Transfer& t, int32_t layer) {
  const std::atomic<int32_t>* ready = t.spec.layers_ready;
  if (ready == nullptr) return true;
  // The producer only stores into the atomic (it knows nothing of this connector), so there is
  // nothing to be woken by: look again after a short sleep.
  while (ready->load(std::memory_order_acquire) <= layer) {
    if (should_stop(t)) return false;
    std::this_thread::sleep_for(kLayerPollInterval);
  }
  return true;
}

std::string LoopbackConnector::copy_layers(Transfer& t) {
  const KvTransferSpec& spec = t.spec;
  KvBlockStore& src = *spec.src;
  KvBlockStore& dst = *spec.dst;
  const size_t block_bytes = src.block_bytes();
  const auto layer_bytes = static_cast<int64_t>(2 * block_bytes * spec.src_blocks.size());
  for (int32_t layer = 0; layer < src.n_layers(); ++layer) {
    if (!wait_for_layer(t, layer)) return kCancelled;
    std::shared_ptr<const FaultInjector> injector;
    {
      std::lock_guard lock(mu_);
      if (t.cancel_requested || stopping_) return kCancelled;
      injector = injector_;
    }
    if (injector) {
      std::string fault = (*injector)(spec, layer);
      if (!fault.empty())
        return describe(spec) + " failed at layer " + std::to_string(layer) + ": " + fault;
    }
    for (size_t i = 0; i < spec.src_blocks.size(); ++i) {
      const int32_t from = spec.src_blocks[i];
      const int32_t to = spec.dst_blocks[i];
      std::memcpy(dst.k_block(layer, to), src.k_block(layer, from), block_bytes);
      std::memcpy(dst.v_block(layer, to), src.v_block(layer, from), block_bytes);
    }
    std::lock_guard lock(mu_);
    t.stats.bytes += layer_bytes;
    t.stats.layers_done = layer + 1;
  }
  return {};
}

}  // namespace

std::unique_ptr<KvConnector> make_loopback_connector() {
  return std::make_unique<LoopbackConnector>();
}

}  // namespace tokenfab
