// QueuedConnector (queued_connector.h): validation, the queue, states and stats shared by the
// KvConnector backends; the backend copies one layer at a time.

#include "core/transfer/queued_connector.h"

#include <atomic>
#include <chrono>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/common/error.h"
#include "core/common/log.h"

namespace tokenfab {
namespace {

// How long the worker sleeps between looks at a producer's layers_ready: short against a layer's
// compute time (milliseconds), long enough not to keep a core busy while it waits.
constexpr auto kLayerPollInterval = std::chrono::microseconds(200);

constexpr const char* kCancelled = "cancelled";

bool has_ended(TransferState state) {
  return state == TransferState::kDone || state == TransferState::kFailed;
}

// Checks one side's block ids against its pool; throws naming the first bad one.
void check_block_ids(const std::string& what, const KvBlockStore& store,
                     const std::vector<int32_t>& blocks, const char* side) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i] < 0 || blocks[i] >= store.n_blocks())
      throw Error(what + ": " + side + " block " + std::to_string(blocks[i]) + " (entry " +
                  std::to_string(i) + ") is outside " + std::string(store.device()) +
                  "'s pool of " + std::to_string(store.n_blocks()) + " blocks");
  }
}

}  // namespace

void QueuedConnector::validate(const KvTransferSpec& spec) const {
  if (spec.src == nullptr || spec.dst == nullptr)
    throw Error("KV transfer of request " + std::to_string(spec.request) + ": " +
                (spec.src == nullptr ? "no source" : "no destination") + " KV store given");
  const KvBlockStore& src = *spec.src;
  const KvBlockStore& dst = *spec.dst;
  check_store(src);
  check_store(dst);
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
  check_block_ids(describe(spec), src, spec.src_blocks, "source");
  check_block_ids(describe(spec), dst, spec.dst_blocks, "destination");
  // Two source blocks onto one destination block would leave it holding whichever came last.
  std::unordered_set<int32_t> seen;
  for (const int32_t b : spec.dst_blocks) {
    if (!seen.insert(b).second)
      throw Error(describe(spec) + ": destination block " + std::to_string(b) +
                  " is listed more than once");
  }
  // Within one storage a block is either handed over (the same block on both sides) or copied
  // onto a block that is no source: a copy must not overwrite KV the transfer still reads.
  if (same_storage(src, dst)) {
    const std::unordered_set<int32_t> sources(spec.src_blocks.begin(), spec.src_blocks.end());
    for (size_t i = 0; i < spec.dst_blocks.size(); ++i)
      if (spec.dst_blocks[i] != spec.src_blocks[i] && sources.count(spec.dst_blocks[i]))
        throw Error(describe(spec) + ": destination block " + std::to_string(spec.dst_blocks[i]) +
                    " is also a source block of this storage (both ends share it: a block is "
                    "either handed over, the same on both sides, or copied onto another)");
  }
  const int64_t capacity = static_cast<int64_t>(spec.dst_blocks.size()) * dst.block_size();
  if (spec.n_tokens < 0 || spec.n_tokens > capacity)
    throw Error(describe(spec) + ": " + std::to_string(spec.n_tokens) + " tokens do not fit in " +
                std::to_string(spec.dst_blocks.size()) + " blocks of " +
                std::to_string(dst.block_size()) + " tokens");
}

QueuedConnector::~QueuedConnector() {
  stop();
}

void QueuedConnector::start() {
  worker_ = std::thread([this] { run(); });
}

void QueuedConnector::stop() {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    for (const TransferId id : queue_) finish(find(id), TransferState::kFailed, kCancelled);
    queue_.clear();
  }
  work_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

std::string QueuedConnector::describe(const KvTransferSpec& spec) {
  return "KV transfer of request " + std::to_string(spec.request) + " (" +
         std::string(spec.src->device()) + " → " + std::string(spec.dst->device()) + ")";
}

TransferId QueuedConnector::send(KvTransferSpec spec) {
  validate(spec);
  const MetricsTime now = MetricsClock::now();
  KvTransferStats stats;
  stats.request = spec.request;
  stats.src = std::string(spec.src->device());
  stats.dst = std::string(spec.dst->device());
  stats.blocks = static_cast<int32_t>(spec.src_blocks.size());
  stats.tokens = spec.n_tokens;
  stats.queued = now;
  if (same_storage(*spec.src, *spec.dst))
    for (size_t i = 0; i < spec.src_blocks.size(); ++i)
      stats.handed_over += spec.src_blocks[i] == spec.dst_blocks[i] ? 1 : 0;
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

const QueuedConnector::Transfer& QueuedConnector::find(TransferId id) const {
  const auto it = transfers_.find(id);
  if (it == transfers_.end())
    throw Error("unknown KV transfer " + std::to_string(id) + " (never sent, or released)");
  return it->second;
}

TransferState QueuedConnector::poll(TransferId id) const {
  std::lock_guard lock(mu_);
  return find(id).stats.state;
}

KvTransferStats QueuedConnector::stats(TransferId id) const {
  std::lock_guard lock(mu_);
  return find(id).stats;
}

TransferState QueuedConnector::wait(TransferId id) {
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

void QueuedConnector::cancel(TransferId id) {
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

KvTransferStats QueuedConnector::release(TransferId id) {
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

void QueuedConnector::set_fault_injector(FaultInjector injector) {
  auto shared = injector ? std::make_shared<const FaultInjector>(std::move(injector)) : nullptr;
  std::lock_guard lock(mu_);
  injector_ = std::move(shared);
}

void QueuedConnector::finish(Transfer& t, TransferState state, std::string error) {
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

bool QueuedConnector::should_stop(const Transfer& t) const {
  std::lock_guard lock(mu_);
  return t.cancel_requested || stopping_;
}

void QueuedConnector::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;  // the destructor has failed whatever was queued
    Transfer& t = find(queue_.front());
    queue_.pop_front();
    start_transfer(t);
    lock.unlock();
    copy_and_finish(t);
    lock.lock();
  }
}

void QueuedConnector::copy_and_finish(Transfer& t) {
  std::string error = copy_layers(t);
  const TransferState state = error.empty() ? TransferState::kDone : TransferState::kFailed;
  std::lock_guard lock(mu_);
  finish(t, state, std::move(error));
}

void QueuedConnector::start_transfer(Transfer& t) {
  t.stats.state = TransferState::kTransferring;
  t.stats.started = MetricsClock::now();
}

bool QueuedConnector::run_ready_queued() {
  Transfer* ready = nullptr;
  {
    std::lock_guard lock(mu_);
    if (stopping_) return false;
    for (auto it = queue_.begin(); it != queue_.end(); ++it) {
      Transfer& c = find(*it);
      const std::atomic<int32_t>* layers = c.spec.layers_ready;
      if (layers == nullptr || layers->load(std::memory_order_acquire) >= c.spec.src->n_layers()) {
        ready = &c;
        queue_.erase(it);
        start_transfer(c);
        break;
      }
    }
  }
  if (ready == nullptr) return false;
  copy_and_finish(*ready);  // its layers are all written, so it never waits in turn: no nesting
  return true;
}

bool QueuedConnector::wait_for_layer(Transfer& t, int32_t layer) {
  const std::atomic<int32_t>* ready = t.spec.layers_ready;
  if (ready == nullptr || ready->load(std::memory_order_acquire) > layer) return true;
  // The producer only stores into the atomic (it knows nothing of this connector), so there is
  // nothing to be woken by: look again after a short sleep, or after copying a transfer queued
  // behind this one whose KV is complete.
  // The whole wait counts as waiting, copies of other transfers included: copy_seconds() stays
  // this transfer's own copying.
  const MetricsTime from = MetricsClock::now();
  bool go = true;
  while (ready->load(std::memory_order_acquire) <= layer) {
    if (should_stop(t)) {
      go = false;
      break;
    }
    if (interleaves_ready_transfers() && run_ready_queued()) continue;
    std::this_thread::sleep_for(kLayerPollInterval);
  }
  const double waited = seconds_between(from, MetricsClock::now());
  std::lock_guard lock(mu_);
  t.stats.waited_s += waited;
  return go;
}

std::string QueuedConnector::copy_layers(Transfer& t) {
  // Within one storage the backend copies only the blocks not handed over.
  KvTransferSpec copied;
  const bool filtered = same_storage(*t.spec.src, *t.spec.dst);
  if (filtered) {
    copied = t.spec;
    copied.src_blocks.clear();
    copied.dst_blocks.clear();
    for (size_t i = 0; i < t.spec.src_blocks.size(); ++i) {
      if (t.spec.src_blocks[i] == t.spec.dst_blocks[i]) continue;
      copied.src_blocks.push_back(t.spec.src_blocks[i]);
      copied.dst_blocks.push_back(t.spec.dst_blocks[i]);
    }
  }
  const KvTransferSpec& spec = filtered ? copied : t.spec;
  std::string error = copy_each_layer(t, spec);
  if (spec.src_blocks.empty()) return error;  // the backend was never asked to copy
  std::string end = end_transfer(spec);
  if (error.empty() && !end.empty()) error = describe(t.spec) + ": " + end;
  return error;
}

std::string QueuedConnector::copy_each_layer(Transfer& t, const KvTransferSpec& spec) {
  // Nothing to copy (every block handed over): the layers are still awaited.
  const bool copy = !spec.src_blocks.empty();
  const auto layer_bytes =
      static_cast<int64_t>(2 * spec.src->block_bytes() * spec.src_blocks.size());
  if (copy)
    if (std::string error = begin_transfer(spec); !error.empty())
      return describe(spec) + ": " + error;
  for (int32_t layer = 0; layer < spec.src->n_layers(); ++layer) {
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
    if (copy)
      if (std::string error = copy_layer(spec, layer); !error.empty())
        return describe(spec) + " failed at layer " + std::to_string(layer) + ": " + error;
    const bool overlapped =
        spec.layers_ready != nullptr &&
        spec.layers_ready->load(std::memory_order_acquire) < spec.src->n_layers();
    std::lock_guard lock(mu_);
    t.stats.bytes += layer_bytes;
    t.stats.layers_done = layer + 1;
    if (overlapped) ++t.stats.layers_overlapped;
  }
  return {};
}

}  // namespace tokenfab
