#pragma once
// KvConnector: moves the KV of a finished prefill from the prefill device's paged pool to the
// decode device's pool (DESIGN.md "Data path"). The engine asks for a transfer with send(), keeps
// serving, and polls; the backend copies in the background, layer by layer, and records bytes,
// blocks, duration and GB/s for each transfer.
//
// Backends:
//   loopback     two pools of this process in host memory (CPU virtual devices): memcpy on the
//                connector's own thread (loopback_connector.cpp).
//   host_staged  GPU → pinned host memory → GPU (or a host pool on either side), double-buffered.
//   cuda_p2p     cudaMemcpyPeerAsync between two GPUs' pools, or no move at all between two pools
//                of one GPU (its prefill and decode partitions).
//   cuda         cuda_p2p where the two GPUs have peer access, host_staged otherwise.
// (cuda_connector.cpp; the CUDA ones exist in builds with the CUDA backend.)
// All three see a pool only through KvBlockStore: per (layer, block), where its K and V bytes
// live and in which memory; a backend refuses stores whose memory it cannot reach.
//
// Hand-overs: within one storage (same_storage: the storage a device's prefill and decode
// partitions share, core/kvcache/kv_slots.h), a pair whose source and destination are the same
// block is handed over: no byte moves, and the receiving pool adopts the block. The other pairs of
// such a spec (a prompt's partial last block, which the receiver will write) are copied as usual.
// Every backend treats hand-overs alike: they wait for the producer's layers as a copy would.
//
// Layer by layer: a transfer copies layer 0 of every block, then layer 1, ... It may start
// before the producer has written the last layers: KvTransferSpec::layers_ready, when set, is
// advanced by the producer as each layer's KV is complete, and the backend never copies a layer
// at or above it. The engine's prefill workers hand a request to its decode worker before the step
// that computes the prompt's last chunk, so its transfer copies layer l while the step computes
// the layers after l (Worker::step, "streamed hand-off"). The stats say how long a transfer waited
// for the producer and how many layers it copied while the producer was still computing.
//
// Thread-safety: every method may be called from any thread.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/metrics/request_metrics.h"

namespace tokenfab {

using TransferId = int64_t;

enum class TransferState : uint8_t {
  kPending,       // queued behind other transfers
  kTransferring,  // copying; layers_done says how far
  kDone,          // every layer of every block copied
  kFailed,        // stopped; error says why (a copy failed, an injected fault, or cancel())
};
const char* transfer_state_name(TransferState state);

enum class KvMemory : uint8_t { kHost, kCuda };

// One device's paged KV pool as a connector sees it. For block b of layer l, K is
// block_bytes() contiguous bytes at k_block(l, b), V likewise at v_block(l, b).
class KvBlockStore {
 public:
  virtual ~KvBlockStore() = default;
  virtual std::string_view device() const = 0;  // "cpu:0"
  virtual KvMemory memory() const = 0;
  virtual int32_t n_layers() const = 0;
  virtual int32_t n_blocks() const = 0;
  virtual int32_t block_size() const = 0;  // tokens per block
  virtual size_t block_bytes() const = 0;  // bytes of K (or of V) of one block in one layer
  virtual std::byte* k_block(int32_t layer, int32_t block) = 0;
  virtual std::byte* v_block(int32_t layer, int32_t block) = 0;
  // The tensors behind the store: two stores with the same id are views of one storage (a
  // device's two partitions, each queueing on its own stream), between which blocks are handed
  // over rather than copied.
  virtual const void* storage_id() const { return this; }
};

inline bool same_storage(const KvBlockStore& a, const KvBlockStore& b) {
  return a.storage_id() == b.storage_id();
}

struct KvTransferSpec {
  int64_t request = 0;  // the request whose KV moves (for stats and errors)
  KvBlockStore* src = nullptr;
  KvBlockStore* dst = nullptr;
  std::vector<int32_t> src_blocks;  // copied onto dst_blocks, pairwise; same length
  std::vector<int32_t> dst_blocks;  // same_storage: equal to src_blocks[i] for a hand-over
  int32_t n_tokens = 0;             // tokens the blocks hold (for stats)
  // Layers [0, *layers_ready) of src are complete; nullptr: all of them. Owned by the producer,
  // which keeps it alive until the transfer has ended.
  const std::atomic<int32_t>* layers_ready = nullptr;
};

struct KvTransferStats {
  TransferId id = 0;
  int64_t request = 0;
  std::string src, dst;  // device names
  TransferState state = TransferState::kPending;
  std::string error;  // when kFailed
  int32_t blocks = 0;
  int32_t tokens = 0;
  int32_t layers_done = 0;
  // Layers copied while the producer had not yet finished the last layer (streamed transfers).
  int32_t layers_overlapped = 0;
  int64_t bytes = 0;        // copied so far (K and V)
  int32_t handed_over = 0;  // of blocks: those handed over within one storage (no bytes moved)
  MetricsTime queued{}, started{}, ended{};
  double waited_s = 0.0;   // of seconds(), the time spent waiting for the producer's layers
  double seconds() const;  // started → ended (or → now while copying); 0 if not started
  double copy_seconds() const { return seconds() > waited_s ? seconds() - waited_s : 0.0; }
  // Decimal GB/s over copy_seconds() (the producer's compute time left out); absent when 0 and
  // when nothing was copied.
  std::optional<double> gb_per_s() const;
};

class KvConnector {
 public:
  // Called for each (transfer, layer) before the layer is copied; returning a non-empty string
  // fails the transfer with that error. For tests and fault drills; unset by default.
  using FaultInjector = std::function<std::string(const KvTransferSpec&, int32_t layer)>;

  virtual ~KvConnector() = default;
  virtual std::string_view backend() const = 0;  // "loopback", ...

  // Validates the spec (stores set and of the same geometry, equal block counts, ids inside the
  // pools, a memory this backend reaches) and throws Error naming what is wrong; otherwise queues
  // it and returns at once.
  virtual TransferId send(KvTransferSpec spec) = 0;
  // State of a transfer not yet released. Throws Error for an unknown id.
  virtual TransferState poll(TransferId id) const = 0;
  virtual KvTransferStats stats(TransferId id) const = 0;
  // Blocks until the transfer has ended (done or failed); returns its state.
  virtual TransferState wait(TransferId id) = 0;
  // Stops a pending or running transfer: it ends kFailed ("cancelled") at the next layer
  // boundary; wait() to know the destination blocks are no longer written. No-op once ended.
  virtual void cancel(TransferId id) = 0;
  // Forgets an ended transfer and returns its final stats. Throws Error if it has not ended.
  virtual KvTransferStats release(TransferId id) = 0;

  virtual void set_fault_injector(FaultInjector injector) = 0;
};

// Copies between KvBlockStores in host memory on one background thread, in send() order.
std::unique_ptr<KvConnector> make_loopback_connector();

// A CUDA backend by name (cuda_p2p, host_staged, cuda); throws Error in a build without CUDA.
std::unique_ptr<KvConnector> make_cuda_connector(std::string_view backend);

// Makes a connector by backend name; throws Error naming the backends for an unknown one.
std::unique_ptr<KvConnector> make_kv_connector(std::string_view backend);

}  // namespace tokenfab
