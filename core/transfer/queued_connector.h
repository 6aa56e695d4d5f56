#pragma once
// QueuedConnector: the bookkeeping every KvConnector backend shares (core/transfer/kv_connector.h).
// Transfers are validated on send(), queued, and run one at a time in send() order on the
// connector's own thread, layer by layer: the backend only says how one layer of a transfer is
// copied. One exception: while a streamed transfer waits for its producer's next layer, a backend
// whose copies keep no state between layers (interleaves_ready_transfers()) runs the transfers
// queued behind it whose KV is complete, so that a prompt whose prefill has ended never waits
// behind another's prefill step (several prefill devices feeding one decode device). One mutex
// guards the bookkeeping and is never held while copying, so poll() and stats() answer at once
// however large the copy.
//
// A backend calls start() at the end of its constructor (the thread calls its virtuals) and stop()
// at the start of its destructor (before its own members go).

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>

#include "core/transfer/kv_connector.h"

namespace tokenfab {

class QueuedConnector : public KvConnector {
 public:
  ~QueuedConnector() override;
  QueuedConnector(const QueuedConnector&) = delete;
  QueuedConnector& operator=(const QueuedConnector&) = delete;

  TransferId send(KvTransferSpec spec) override;
  TransferState poll(TransferId id) const override;
  KvTransferStats stats(TransferId id) const override;
  TransferState wait(TransferId id) override;
  void cancel(TransferId id) override;
  KvTransferStats release(TransferId id) override;
  void set_fault_injector(FaultInjector injector) override;

 protected:
  QueuedConnector() = default;
  void start();
  void stop();  // fails whatever is still queued, lets the running transfer end, joins

  // Throws Error when this backend cannot reach the store's memory (checked on send()).
  virtual void check_store(const KvBlockStore& store) const = 0;
  // Before a transfer's first layer (on the connector's thread): "" or the error that fails it.
  virtual std::string begin_transfer(const KvTransferSpec&) { return {}; }
  // Copies one layer of every block of the transfer (or queues the copy); "" or the error that
  // fails it.
  virtual std::string copy_layer(const KvTransferSpec& spec, int32_t layer) = 0;
  // After the last layer, and after a failure or a cancel too: returns once nothing of the
  // transfer is still being written (a backend that queues copies waits for them here); "" or
  // the error that fails it.
  virtual std::string end_transfer(const KvTransferSpec&) { return {}; }
  // Whether a whole transfer may be copied while another waits between two of its layers.
  virtual bool interleaves_ready_transfers() const { return false; }

  // "KV transfer of request N (src → dst)", the start of every error about a transfer.
  static std::string describe(const KvTransferSpec& spec);

 private:
  struct Transfer {
    KvTransferSpec spec;  // immutable once queued: the worker reads it without the lock
    KvTransferStats stats;
    bool cancel_requested = false;
  };

  void validate(const KvTransferSpec& spec) const;
  void run();
  // Copies every layer of `t` (state kTransferring), then ends it; "" or the error that stopped it.
  std::string copy_layers(Transfer& t);
  // The layers of `spec`: t's own, or within one storage the pairs of t not handed over.
  std::string copy_each_layer(Transfer& t, const KvTransferSpec& spec);
  // Blocks until the producer has finished `layer` or the transfer is to stop; false: stop.
  // Adds the time it waited to t's stats.
  bool wait_for_layer(Transfer& t, int32_t layer);
  // Runs the first queued transfer whose KV is complete, start to end; false when there is none.
  bool run_ready_queued();
  void start_transfer(Transfer& t);           // lock held: state transferring, start time
  void copy_and_finish(Transfer& t);          // lock not held: copy_layers(t), then finish it
  bool should_stop(const Transfer& t) const;  // takes the lock
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
  std::thread worker_;
};

}  // namespace tokenfab
