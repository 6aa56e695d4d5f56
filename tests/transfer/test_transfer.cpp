// The loopback KvConnector between two host pools: it copies exactly the listed blocks, layer by
// layer and never past the producer's layers_ready, hands blocks over within one store without
// copying, rejects specs it cannot carry out, and a failed or cancelled transfer stops only itself.

#include <QtTest>

#include <atomic>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/common/error.h"
#include "core/runtime/kv_storage.h"
#include "core/transfer/kv_connector.h"

using namespace tokenfab;

namespace {

constexpr int32_t kBlockSize = 4;

// A tiny model geometry: 3 layers of 2 KV heads of 8 dimensions (block_bytes = 128).
HParams tiny_hparams(int64_t n_layer = 3, int n_kv_head = 2) {
  HParams hp;
  hp.architecture = "llama";
  hp.n_layer = n_layer;
  hp.n_head = 4;
  hp.n_kv_head = n_kv_head;
  hp.head_dim = 8;
  hp.n_embd = hp.n_head * hp.head_dim;
  return hp;
}

// Every byte of every layer's K and V from a seeded generator.
void fill_random(KvStorage& store, uint32_t seed) {
  std::mt19937 rng(seed);
  for (int32_t l = 0; l < store.n_layers(); ++l)
    for (int32_t b = 0; b < store.n_blocks(); ++b)
      for (std::byte* p : {store.k_block(l, b), store.v_block(l, b)})
        for (size_t i = 0; i < store.block_bytes(); ++i) p[i] = static_cast<std::byte>(rng());
}

// The whole pool, layer by layer, K then V (for "untouched" checks).
std::vector<std::byte> snapshot(KvStorage& store) {
  std::vector<std::byte> out;
  for (int32_t l = 0; l < store.n_layers(); ++l)
    for (int32_t b = 0; b < store.n_blocks(); ++b)
      for (const std::byte* p : {store.k_block(l, b), store.v_block(l, b)})
        out.insert(out.end(), p, p + store.block_bytes());
  return out;
}

bool same_block(KvStorage& a, int32_t block_a, KvStorage& b, int32_t block_b, int32_t layer) {
  const size_t n = a.block_bytes();
  return std::memcmp(a.k_block(layer, block_a), b.k_block(layer, block_b), n) == 0 &&
         std::memcmp(a.v_block(layer, block_a), b.v_block(layer, block_b), n) == 0;
}

// A block as it was in a snapshot() of its pool.
bool block_as_in(KvStorage& store, const std::vector<std::byte>& snap, int32_t block,
                 int32_t layer) {
  const size_t n = store.block_bytes();
  const size_t at = (static_cast<size_t>(layer) * store.n_blocks() + block) * 2 * n;
  return std::memcmp(store.k_block(layer, block), snap.data() + at, n) == 0 &&
         std::memcmp(store.v_block(layer, block), snap.data() + at + n, n) == 0;
}

QString name(TransferState state) {
  return transfer_state_name(state);
}

// A pool in CUDA memory, as a CUDA backend's store would describe itself; only its description
// is read (the loopback connector must refuse it before touching any block).
class CudaStoreDescription final : public KvBlockStore {
 public:
  explicit CudaStoreDescription(const KvBlockStore& like) : like_(like) {}
  std::string_view device() const override { return "cuda:0"; }
  KvMemory memory() const override { return KvMemory::kCuda; }
  int32_t n_layers() const override { return like_.n_layers(); }
  int32_t n_blocks() const override { return like_.n_blocks(); }
  int32_t block_size() const override { return like_.block_size(); }
  size_t block_bytes() const override { return like_.block_bytes(); }
  std::byte* k_block(int32_t, int32_t) override { return nullptr; }
  std::byte* v_block(int32_t, int32_t) override { return nullptr; }

 private:
  const KvBlockStore& like_;
};

}  // namespace

class TransferTest : public QObject {
  Q_OBJECT

 private slots:
  void init();
  void copies_blocks_layer_by_layer();
  void empty_transfer_is_done_at_once();
  void hand_over_within_one_store_copies_nothing();
  void rejects_bad_specs();
  void unknown_ids_and_backends_throw();
  void injected_fault_fails_only_that_transfer();
  void cancel_pending_and_running();
  void layers_ready_gates_copy();
  void complete_transfers_pass_one_waiting_for_its_producer();
  void destructor_ends_pending_transfers();

 private:
  KvTransferSpec spec(int64_t request, std::vector<int32_t> src_blocks,
                      std::vector<int32_t> dst_blocks) {
    const auto n_tokens = static_cast<int32_t>(src_blocks.size()) * kBlockSize;
    return {request,  src_.get(), dst_.get(), std::move(src_blocks), std::move(dst_blocks),
            n_tokens, nullptr};
  }

  HParams hp_ = tiny_hparams();
  std::unique_ptr<KvStorage> src_, dst_;  // fresh random pools for every test function
};

void TransferTest::init() {
  src_ = std::make_unique<KvStorage>(hp_, 10, kBlockSize, "cpu:0");
  dst_ = std::make_unique<KvStorage>(hp_, 12, kBlockSize, "cpu:1");
  fill_random(*src_, 1);
  fill_random(*dst_, 2);
}

void TransferTest::copies_blocks_layer_by_layer() {
  const auto connector = make_loopback_connector();
  QCOMPARE(QString::fromUtf8(connector->backend()), QString("loopback"));
  const auto src_before = snapshot(*src_);
  const auto dst_before = snapshot(*dst_);
  // Neither list contiguous nor sorted, and the two in different orders.
  const std::vector<int32_t> from = {7, 2, 5, 0};
  const std::vector<int32_t> to = {3, 11, 0, 6};
  KvTransferSpec s = spec(42, from, to);
  s.n_tokens = 14;  // last block partial
  const TransferId id = connector->send(s);
  QCOMPARE(name(connector->wait(id)), QString("done"));

  for (int32_t l = 0; l < hp_.n_layer; ++l) {
    for (size_t i = 0; i < from.size(); ++i) QVERIFY(same_block(*dst_, to[i], *src_, from[i], l));
    for (int32_t b = 0; b < dst_->n_blocks(); ++b)
      if (std::find(to.begin(), to.end(), b) == to.end())
        QVERIFY(block_as_in(*dst_, dst_before, b, l));
  }
  QVERIFY(snapshot(*src_) == src_before);

  const KvTransferStats st = connector->stats(id);
  QCOMPARE(st.id, id);
  QCOMPARE(st.request, int64_t{42});
  QCOMPARE(name(st.state), QString("done"));
  QVERIFY(st.error.empty());
  QCOMPARE(QString::fromStdString(st.src), QString("cpu:0"));
  QCOMPARE(QString::fromStdString(st.dst), QString("cpu:1"));
  QCOMPARE(st.blocks, 4);
  QCOMPARE(st.tokens, 14);
  QCOMPARE(st.layers_done, 3);
  QCOMPARE(st.bytes, static_cast<int64_t>(2 * 3 * 4 * src_->block_bytes()));
  QVERIFY(st.queued <= st.started && st.started <= st.ended);
  QVERIFY(st.gb_per_s().has_value());
  QVERIFY(*st.gb_per_s() > 0);

  const KvTransferStats released = connector->release(id);
  QCOMPARE(released.bytes, st.bytes);
  QVERIFY_THROWS_EXCEPTION(Error, connector->poll(id));
}

// The decode side may already hold every block (its prefix cache): nothing to move, done at once.
void TransferTest::empty_transfer_is_done_at_once() {
  const auto connector = make_loopback_connector();
  std::atomic<int32_t> ready{0};  // would hold a copying transfer forever
  KvTransferSpec s = spec(5, {}, {});
  s.layers_ready = &ready;
  const TransferId id = connector->send(s);
  QCOMPARE(name(connector->poll(id)), QString("done"));
  const KvTransferStats st = connector->release(id);
  QCOMPARE(st.bytes, int64_t{0});
  QCOMPARE(st.blocks, 0);
  QVERIFY(!st.gb_per_s().has_value());
}

// One storage shared by both ends (a device's two partitions): a pair naming the same block hands
// it over (no byte moves), a pair naming another block copies as usual, and the transfer still
// ends only once its producer has written every layer.
void TransferTest::hand_over_within_one_store_copies_nothing() {
  const auto connector = make_loopback_connector();
  const auto before = snapshot(*src_);
  std::atomic<int32_t> ready{1};
  KvTransferSpec s = spec(9, {7, 2, 5}, {7, 2, 9});  // 7 and 2 handed over, 5 copied onto 9
  s.dst = src_.get();
  s.layers_ready = &ready;
  const TransferId id = connector->send(s);
  QTRY_COMPARE(connector->stats(id).layers_done, 1);
  QTest::qSleep(20);
  QCOMPARE(name(connector->poll(id)), QString("transferring"));
  ready.store(static_cast<int32_t>(hp_.n_layer), std::memory_order_release);
  QCOMPARE(name(connector->wait(id)), QString("done"));
  const KvTransferStats st = connector->release(id);
  QCOMPARE(st.handed_over, 2);
  QCOMPARE(st.blocks, 3);
  QCOMPARE(st.bytes, static_cast<int64_t>(2 * hp_.n_layer * src_->block_bytes()));
  QCOMPARE(st.layers_done, static_cast<int32_t>(hp_.n_layer));
  for (int32_t l = 0; l < hp_.n_layer; ++l) {
    QVERIFY(same_block(*src_, 9, *src_, 5, l));
    for (int32_t b = 0; b < src_->n_blocks(); ++b)
      if (b != 9) QVERIFY(block_as_in(*src_, before, b, l));
  }
  // Every block handed over: nothing copied at all, and still not done before the producer.
  std::atomic<int32_t> written{0};
  KvTransferSpec all = spec(10, {3, 4}, {3, 4});
  all.dst = src_.get();
  all.layers_ready = &written;
  const TransferId whole = connector->send(all);
  QTest::qSleep(20);
  QCOMPARE(connector->stats(whole).layers_done, 0);
  written.store(static_cast<int32_t>(hp_.n_layer), std::memory_order_release);
  QCOMPARE(name(connector->wait(whole)), QString("done"));
  const KvTransferStats handed = connector->release(whole);
  QCOMPARE(handed.handed_over, 2);
  QCOMPARE(handed.bytes, int64_t{0});
  QVERIFY(!handed.gb_per_s().has_value());
  // Between two stores nothing is handed over, even where the ids agree.
  const TransferId copy = connector->send(spec(11, {1}, {1}));
  QCOMPARE(name(connector->wait(copy)), QString("done"));
  QCOMPARE(connector->release(copy).handed_over, 0);
}

void TransferTest::rejects_bad_specs() {
  const auto connector = make_loopback_connector();
  const auto dst_before = snapshot(*dst_);
  const auto expect_error = [&](const KvTransferSpec& s, const char* needle) {
    try {
      connector->send(s);
    } catch (const Error& e) {
      if (!QString::fromUtf8(e.what()).contains(needle))
        qWarning("message \"%s\" does not mention \"%s\"", e.what(), needle);
      return QString::fromUtf8(e.what()).contains(needle);
    }
    qWarning("no error; expected one about \"%s\"", needle);
    return false;
  };
  KvTransferSpec s = spec(1, {0, 1}, {2, 3});
  s.src = nullptr;
  QVERIFY(expect_error(s, "no source"));
  s = spec(1, {0, 1}, {2, 3});
  s.dst = nullptr;
  QVERIFY(expect_error(s, "no destination"));
  s.dst = src_.get();
  s.dst_blocks = {1, 3};  // within one storage, block 1 is a source yet also copied onto
  QVERIFY(expect_error(s, "also a source block"));

  const HParams four_layers = tiny_hparams(4);
  KvStorage deeper(four_layers, 12, kBlockSize, "cpu:2");
  s = spec(1, {0, 1}, {2, 3});
  s.dst = &deeper;
  QVERIFY(expect_error(s, "geometry"));
  KvStorage longer_blocks(hp_, 12, kBlockSize * 2, "cpu:2");
  s.dst = &longer_blocks;
  QVERIFY(expect_error(s, "geometry"));
  const HParams more_heads = tiny_hparams(3, 4);  // same block_size, twice the block_bytes
  KvStorage wider(more_heads, 12, kBlockSize, "cpu:2");
  s.dst = &wider;
  QVERIFY(expect_error(s, "geometry"));

  QVERIFY(expect_error(spec(1, {0, 1}, {2}), "2 source blocks but 1 destination blocks"));
  QVERIFY(expect_error(spec(1, {0, 10}, {2, 3}), "source block 10"));
  QVERIFY(expect_error(spec(1, {0, 1}, {-1, 3}), "destination block -1"));
  QVERIFY(expect_error(spec(1, {0, 1}, {2, 12}), "destination block 12"));
  QVERIFY(expect_error(spec(1, {0, 1}, {4, 4}), "destination block 4 is listed more than once"));
  s = spec(1, {0, 1}, {2, 3});
  s.n_tokens = 2 * kBlockSize + 1;
  QVERIFY(expect_error(s, "do not fit"));

  CudaStoreDescription gpu(*dst_);
  s = spec(1, {0, 1}, {2, 3});
  s.dst = &gpu;
  QVERIFY(expect_error(s, "host memory only; cuda:0 holds its KV in CUDA memory"));
  s = spec(1, {0, 1}, {2, 3});
  s.src = &gpu;
  QVERIFY(expect_error(s, "cuda:0"));

  // The rejected specs were neither queued nor given ids, and wrote nothing.
  const TransferId id = connector->send(spec(1, {0}, {0}));
  QCOMPARE(id, TransferId{1});
  QCOMPARE(name(connector->wait(id)), QString("done"));
  for (int32_t l = 0; l < hp_.n_layer; ++l)
    for (int32_t b = 1; b < dst_->n_blocks(); ++b) QVERIFY(block_as_in(*dst_, dst_before, b, l));
}

void TransferTest::unknown_ids_and_backends_throw() {
  const auto connector = make_kv_connector("loopback");
  QCOMPARE(QString::fromUtf8(connector->backend()), QString("loopback"));
  QVERIFY_THROWS_EXCEPTION(Error, connector->poll(99));
  QVERIFY_THROWS_EXCEPTION(Error, connector->stats(99));
  QVERIFY_THROWS_EXCEPTION(Error, connector->wait(99));
  QVERIFY_THROWS_EXCEPTION(Error, connector->cancel(99));
  QVERIFY_THROWS_EXCEPTION(Error, connector->release(99));
  try {
    make_kv_connector("nccl");
    QFAIL("an unknown backend was accepted");
  } catch (const Error& e) {
    const QString message = QString::fromUtf8(e.what());
    QVERIFY2(message.contains("\"nccl\"") && message.contains("loopback") &&
                 message.contains("host_staged"),
             e.what());
  }
}

void TransferTest::injected_fault_fails_only_that_transfer() {
  const auto connector = make_loopback_connector();
  std::atomic<int> calls_for_other{0};
  connector->set_fault_injector([&](const KvTransferSpec& s, int32_t layer) -> std::string {
    if (s.request != 7) {
      ++calls_for_other;
      return {};
    }
    return layer == 1 ? "link down" : "";
  });
  const auto dst_before = snapshot(*dst_);
  const TransferId failing = connector->send(spec(7, {0, 1}, {2, 3}));
  const TransferId after = connector->send(spec(8, {4, 5}, {6, 7}));

  QCOMPARE(name(connector->wait(failing)), QString("failed"));
  const KvTransferStats st = connector->stats(failing);
  QCOMPARE(QString::fromStdString(st.error),
           QString("KV transfer of request 7 (cpu:0 → cpu:1) failed at layer 1: link down"));
  QCOMPARE(st.layers_done, 1);
  QCOMPARE(st.bytes, static_cast<int64_t>(2 * 2 * src_->block_bytes()));
  QVERIFY(same_block(*dst_, 2, *src_, 0, 0));  // layer 0 went before the fault
  QVERIFY(block_as_in(*dst_, dst_before, 2, 1));

  QCOMPARE(name(connector->wait(after)), QString("done"));
  QCOMPARE(calls_for_other.load(), 3);  // once per layer
  for (int32_t l = 0; l < hp_.n_layer; ++l) {
    QVERIFY(same_block(*dst_, 6, *src_, 4, l));
    QVERIFY(same_block(*dst_, 7, *src_, 5, l));
  }
  QVERIFY(connector->stats(after).error.empty());

  connector->set_fault_injector(nullptr);  // unset: request 7 goes through
  const TransferId retry = connector->send(spec(7, {0, 1}, {2, 3}));
  QCOMPARE(name(connector->wait(retry)), QString("done"));
}

void TransferTest::cancel_pending_and_running() {
  const auto connector = make_loopback_connector();
  const auto dst_before = snapshot(*dst_);
  // The producer has finished layer 0 only: `running` copies it, then waits.
  std::atomic<int32_t> ready{1};
  KvTransferSpec gated = spec(1, {0, 1}, {2, 3});
  gated.layers_ready = &ready;
  const TransferId running = connector->send(gated);
  // Queued behind it, its own producer not yet done with any layer (a complete one would be run
  // while `running` waits, see complete_transfers_pass_one_waiting_for_its_producer).
  std::atomic<int32_t> nothing_ready{0};
  KvTransferSpec queued = spec(2, {4}, {5});
  queued.layers_ready = &nothing_ready;
  const TransferId pending = connector->send(queued);
  QTRY_COMPARE(connector->stats(running).layers_done, 1);
  QCOMPARE(name(connector->poll(running)), QString("transferring"));
  QCOMPARE(name(connector->poll(pending)), QString("pending"));
  QVERIFY_THROWS_EXCEPTION(Error, connector->release(running));  // not ended

  // A pending transfer ends at once, without waiting for the one ahead of it.
  connector->cancel(pending);
  QCOMPARE(name(connector->poll(pending)), QString("failed"));
  QCOMPARE(name(connector->wait(pending)), QString("failed"));
  const KvTransferStats cancelled_pending = connector->release(pending);
  QCOMPARE(QString::fromStdString(cancelled_pending.error), QString("cancelled"));
  QCOMPARE(cancelled_pending.bytes, int64_t{0});
  QCOMPARE(cancelled_pending.seconds(), 0.0);
  QVERIFY(block_as_in(*dst_, dst_before, 5, 0));

  // A running one ends at its next layer boundary; what it copied stays, nothing more is written.
  connector->cancel(running);
  QCOMPARE(name(connector->wait(running)), QString("failed"));
  const KvTransferStats cancelled_running = connector->release(running);
  QCOMPARE(QString::fromStdString(cancelled_running.error), QString("cancelled"));
  QCOMPARE(cancelled_running.layers_done, 1);
  QVERIFY(same_block(*dst_, 2, *src_, 0, 0));
  for (int32_t l = 1; l < hp_.n_layer; ++l) QVERIFY(block_as_in(*dst_, dst_before, 2, l));

  // The connector goes on: a later transfer is copied, and cancelling it once ended is a no-op.
  const TransferId later = connector->send(spec(3, {6}, {7}));
  QCOMPARE(name(connector->wait(later)), QString("done"));
  connector->cancel(later);
  QCOMPARE(name(connector->poll(later)), QString("done"));
  for (int32_t l = 0; l < hp_.n_layer; ++l) QVERIFY(same_block(*dst_, 7, *src_, 6, l));
}

void TransferTest::layers_ready_gates_copy() {
  const auto connector = make_loopback_connector();
  const auto dst_before = snapshot(*dst_);
  std::atomic<int32_t> ready{1};
  KvTransferSpec s = spec(3, {8, 1}, {0, 9});
  s.layers_ready = &ready;
  const TransferId id = connector->send(s);
  QTRY_COMPARE(connector->stats(id).layers_done, 1);
  // Long enough for the worker to have gone on, were it not held (it polls every 200 µs).
  QTest::qSleep(30);
  QCOMPARE(connector->stats(id).layers_done, 1);
  QCOMPARE(name(connector->poll(id)), QString("transferring"));
  QVERIFY(same_block(*dst_, 0, *src_, 8, 0));
  for (int32_t l = 1; l < hp_.n_layer; ++l) {
    QVERIFY(block_as_in(*dst_, dst_before, 0, l));
    QVERIFY(block_as_in(*dst_, dst_before, 9, l));
  }

  ready.store(static_cast<int32_t>(hp_.n_layer), std::memory_order_release);
  QCOMPARE(name(connector->wait(id)), QString("done"));
  for (int32_t l = 0; l < hp_.n_layer; ++l) {
    QVERIFY(same_block(*dst_, 0, *src_, 8, l));
    QVERIFY(same_block(*dst_, 9, *src_, 1, l));
  }
  // Layer 0 was copied while the producer had not finished the others; the wait (at least the
  // 30 ms held above) is counted apart from the copy, and the rate is over the copy alone.
  const KvTransferStats st = connector->release(id);
  QCOMPARE(st.layers_overlapped, 1);
  QVERIFY2(st.waited_s >= 0.030, qPrintable(QString("waited %1 s").arg(st.waited_s)));
  QVERIFY(st.waited_s <= st.seconds());
  QCOMPARE(st.copy_seconds(), st.seconds() - st.waited_s);
  QVERIFY(st.gb_per_s().has_value());
  QVERIFY(*st.gb_per_s() >= static_cast<double>(st.bytes) / st.seconds() / 1e9);
}

// A transfer whose producer is still computing does not hold back one queued behind it whose KV
// is complete (another prefill device's prompt): the second ends first, copied exactly, while the
// first still waits; the first then ends when its producer has finished.
void TransferTest::complete_transfers_pass_one_waiting_for_its_producer() {
  const auto connector = make_loopback_connector();
  std::atomic<int32_t> ready{1};
  KvTransferSpec gated = spec(1, {8, 1}, {0, 9});
  gated.layers_ready = &ready;
  const TransferId first = connector->send(gated);
  QTRY_COMPARE(connector->stats(first).layers_done, 1);
  const TransferId second = connector->send(spec(2, {3, 4}, {5, 6}));
  QCOMPARE(name(connector->wait(second)), QString("done"));
  QCOMPARE(name(connector->poll(first)), QString("transferring"));
  QCOMPARE(connector->stats(first).layers_done, 1);
  for (int32_t l = 0; l < hp_.n_layer; ++l) {
    QVERIFY(same_block(*dst_, 5, *src_, 3, l));
    QVERIFY(same_block(*dst_, 6, *src_, 4, l));
  }
  const KvTransferStats done = connector->release(second);
  QCOMPARE(done.layers_done, static_cast<int32_t>(hp_.n_layer));
  QCOMPARE(done.layers_overlapped, 0);

  ready.store(static_cast<int32_t>(hp_.n_layer), std::memory_order_release);
  QCOMPARE(name(connector->wait(first)), QString("done"));
  for (int32_t l = 0; l < hp_.n_layer; ++l) {
    QVERIFY(same_block(*dst_, 0, *src_, 8, l));
    QVERIFY(same_block(*dst_, 9, *src_, 1, l));
  }
}

// Destroying the connector with a transfer held by its producer and one queued behind it
// returns (it must not wait for a producer that will never advance).
void TransferTest::destructor_ends_pending_transfers() {
  auto connector = make_loopback_connector();
  std::atomic<int32_t> ready{0};
  KvTransferSpec gated = spec(1, {0}, {1});
  gated.layers_ready = &ready;
  const TransferId held = connector->send(gated);
  connector->send(spec(2, {2}, {3}));
  QTRY_COMPARE(name(connector->poll(held)), QString("transferring"));
  connector.reset();
  QVERIFY(!connector);
}

QTEST_GUILESS_MAIN(TransferTest)
#include "test_transfer.moc"
