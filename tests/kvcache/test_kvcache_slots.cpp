// Shared storage (KvSlots): two pools — a device's prefill and decode partitions — over one set
// of slots, prompts handed from the first to the second by adopting slots instead of copying.
// The randomized run keeps a stand-in for the K/V tensors (one token id per slot row, addressed
// through each pool's slot map) and checks after every operation that each live sequence of
// either pool reads back exactly its own tokens: a slot reused while the other pool still reads
// it, or a write into a slot the other pool's cache still serves, shows up there.

#include <QtTest>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "core/common/error.h"
#include "core/kvcache/kv_manager.h"
#include "core/kvcache/kv_slots.h"
#include "test_kvcache.h"

using namespace tokenfab;

namespace {

constexpr TokenId kUnwritten = -1;

// Hands `seq` of `from` over to `to` (as the serving loop does): a hold keeps the prompt's
// blocks, the receiver reserves blocks for the prompt and adopts the slots of the full ones its
// own prefix cache did not supply (the partial last block, which it will write, is copied), and
// the sender drops both. Returns the tokens the receiver found cached, or nullopt when it had no
// room (nothing changed then).
std::optional<int32_t> hand_over(KvManager& from, KvManager& to, SequenceId seq, SequenceId hold) {
  const std::vector<TokenId> tokens = from.table(seq).tokens();
  from.fork(seq, hold);
  const std::optional<int32_t> cached = to.allocate_sequence(seq, tokens);
  if (cached) {
    std::vector<int32_t> held;
    from.storage_slots(hold, held);
    const int32_t first = *cached / to.block_size();
    const int32_t n_full = static_cast<int32_t>(tokens.size()) / to.block_size();
    if (n_full > first)
      to.adopt_slots(seq, first,
                     std::span<const int32_t>(held).subspan(static_cast<size_t>(first),
                                                            static_cast<size_t>(n_full - first)));
  }
  from.free_sequence(hold);
  if (cached) from.free_sequence(seq);
  return cached;
}

class SharedRandomRun {
 public:
  SharedRandomRun(uint32_t seed, int32_t n_blocks, int32_t block_size)
      : draws_(seed),
        slots_(std::make_shared<KvSlots>(2 * n_blocks)),
        kv_{std::make_unique<KvManager>(n_blocks, block_size, slots_),
            std::make_unique<KvManager>(n_blocks, block_size, slots_)},
        rows_(static_cast<size_t>(2 * n_blocks) * static_cast<size_t>(block_size), kUnwritten) {
    for (int32_t i = 0; i < 4; ++i) prefixes_.push_back(random_tokens(pick(0, 3 * block_size)));
  }

  std::string step() {
    const int32_t op = pick(0, 99);
    if (op < 20 || shadow_[0].empty()) {
      allocate(0);
    } else if (op < 30) {
      allocate(1);
    } else if (op < 50) {
      hand_over_one();
    } else if (op < 75) {
      append(pick(0, 1));
    } else if (op < 82) {
      truncate(pick(0, 1));
    } else if (op < 95) {
      const int p = pick(0, 1);
      if (!shadow_[p].empty()) free_one(p, random_sequence(p));
    } else {
      kv_[static_cast<size_t>(pick(0, 1))]->evict(pick(0, 4));
    }
    for (const auto& kv : kv_)
      if (std::string e = kv->check_invariants(); !e.empty()) return e;
    if (std::string e = slots_->check_invariants(); !e.empty()) return e;
    return check_contents();
  }

  std::string finish() {
    for (int p = 0; p < 2; ++p)
      while (!shadow_[p].empty()) free_one(p, shadow_[p].begin()->first);
    for (const auto& kv : kv_) kv->evict_all();
    // Every block free, and the slots of each pool's blocks once again all different as soon as
    // they take new content.
    for (const auto& kv : kv_) {
      if (kv->pool().n_free() != kv->pool().n_blocks()) return "blocks not free at the end";
      for (int32_t b = 0; b < kv->pool().n_blocks(); ++b)
        if (!kv->allocate_sequence(1000000 + b, iota_tokens(1, 0))) return "pool refilled short";
    }
    if (slots_->n_shared() != 0) return "a slot is still shared once every block was rewritten";
    return slots_->check_invariants();
  }

  int64_t handed_over() const { return handed_over_; }
  int64_t max_shared() const { return max_shared_; }

 private:
  int32_t pick(int32_t lo, int32_t hi) { return draws_.pick(lo, hi); }
  std::vector<TokenId> random_tokens(int32_t n) { return draws_.tokens(n); }

  SequenceId random_sequence(int p) {
    auto it = shadow_[p].begin();
    std::advance(it, pick(0, static_cast<int32_t>(shadow_[p].size()) - 1));
    return it->first;
  }

  // Writes tokens [from, end) of `seq` in pool p through the pool's slot map.
  void write(int p, SequenceId seq, int32_t from) {
    const KvManager& kv = *kv_[static_cast<size_t>(p)];
    const BlockTable& table = kv.table(seq);
    const int32_t bs = table.block_size();
    for (int32_t i = from; i < table.n_tokens(); ++i) {
      const int32_t slot = kv.pool().slot(table.blocks()[static_cast<size_t>(i / bs)]);
      rows_[static_cast<size_t>(slot) * bs + i % bs] = table.tokens()[static_cast<size_t>(i)];
    }
  }

  void allocate(int p) {
    if (shadow_[p].size() >= 10) return;
    std::vector<TokenId> prompt = prefixes_[static_cast<size_t>(pick(0, 3))];
    const std::vector<TokenId> tail = random_tokens(pick(1, 20));
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    const SequenceId seq = next_id_++;
    const std::optional<int32_t> cached =
        kv_[static_cast<size_t>(p)]->allocate_sequence(seq, prompt);
    if (!cached) return;
    write(p, seq, *cached);
    shadow_[p][seq] = prompt;
  }

  void hand_over_one() {
    if (shadow_[0].empty() || shadow_[1].size() >= 10) return;
    const SequenceId seq = random_sequence(0);
    const std::optional<int32_t> cached = hand_over(*kv_[0], *kv_[1], seq, -seq);
    if (!cached) return;
    // The partial last block's copy: the same tokens, written through the receiver's own slot.
    const int32_t bs = kv_[1]->block_size();
    const int32_t n_full = static_cast<int32_t>(shadow_[0][seq].size()) / bs;
    write(1, seq, std::max(*cached, n_full * bs));
    shadow_[1][seq] = shadow_[0][seq];
    shadow_[0].erase(seq);
    ++handed_over_;
    max_shared_ = std::max<int64_t>(max_shared_, slots_->n_shared());
  }

  void append(int p) {
    if (shadow_[p].empty()) return;
    KvManager& kv = *kv_[static_cast<size_t>(p)];
    const SequenceId seq = random_sequence(p);
    const std::vector<TokenId> tokens = random_tokens(pick(1, 6));
    const int32_t before = kv.table(seq).n_tokens();
    const AppendResult r = kv.append(seq, tokens);
    if (!r.ok()) {
      free_one(p, seq);
      return;
    }
    if (r.copy) {
      const int32_t bs = kv.block_size();
      const int32_t src = r.copy->src_slot, dst = r.copy->dst_slot;
      for (int32_t s = 0; s < r.copy->n_tokens; ++s)
        rows_[static_cast<size_t>(dst) * bs + s] = rows_[static_cast<size_t>(src) * bs + s];
    }
    write(p, seq, before);
    shadow_[p][seq].insert(shadow_[p][seq].end(), tokens.begin(), tokens.end());
  }

  void truncate(int p) {
    if (shadow_[p].empty()) return;
    const SequenceId seq = random_sequence(p);
    const int32_t n = pick(0, static_cast<int32_t>(shadow_[p][seq].size()));
    kv_[static_cast<size_t>(p)]->truncate(seq, n);
    shadow_[p][seq].resize(static_cast<size_t>(n));
  }

  void free_one(int p, SequenceId seq) {
    kv_[static_cast<size_t>(p)]->free_sequence(seq);
    shadow_[p].erase(seq);
  }

  std::string check_contents() const {
    for (int p = 0; p < 2; ++p) {
      const KvManager& kv = *kv_[static_cast<size_t>(p)];
      const int32_t bs = kv.block_size();
      for (const auto& [seq, tokens] : shadow_[p]) {
        const BlockTable& table = kv.table(seq);
        if (table.tokens() != tokens) return "sequence " + std::to_string(seq) + ": tokens differ";
        for (size_t i = 0; i < tokens.size(); ++i) {
          const int32_t slot = kv.pool().slot(table.blocks()[i / static_cast<size_t>(bs)]);
          if (rows_[static_cast<size_t>(slot) * bs + i % bs] != tokens[i])
            return "pool " + std::to_string(p) + ", sequence " + std::to_string(seq) +
                   ": the slot of token " + std::to_string(i) + " holds another token";
        }
      }
    }
    return {};
  }

  RandomDraws draws_;
  std::shared_ptr<KvSlots> slots_;
  std::unique_ptr<KvManager> kv_[2];  // 0: the prefill side, 1: the decode side
  std::vector<TokenId> rows_;         // (2 · n_blocks slots, block_size)
  std::vector<std::vector<TokenId>> prefixes_;
  std::map<SequenceId, std::vector<TokenId>> shadow_[2];
  SequenceId next_id_ = 1;
  int64_t handed_over_ = 0;
  int64_t max_shared_ = 0;
};

}  // namespace

void TestKvCache::shared_slots_hand_over_without_copy() {
  auto shared = std::make_shared<KvSlots>(16);
  KvManager prefill(8, 4, shared), decode(8, 4, shared);
  QCOMPARE(shared->n_spare(), 0);
  // Each pool starts on slots of its own.
  std::vector<int32_t> a, b;
  QVERIFY(prefill.allocate_sequence(1, iota_tokens(10, 0)));  // 3 blocks, the last partial
  QVERIFY(decode.allocate_sequence(7, iota_tokens(5, 100)));
  prefill.storage_slots(1, a);
  decode.storage_slots(7, b);
  for (const int32_t s : a) QVERIFY(std::find(b.begin(), b.end(), s) == b.end());

  QCOMPARE(hand_over(prefill, decode, 1, -1), std::optional<int32_t>(0));
  decode.storage_slots(1, b);
  // The decode side reads the very slots the prefill side wrote for the full blocks (still in
  // the prefill side's cache); the partial last block, which it will write, is its own.
  QCOMPARE(b[0], a[0]);
  QCOMPARE(b[1], a[1]);
  QVERIFY(b[2] != a[2]);
  QCOMPARE(shared->n_spare(), 2);  // the slots its first two reserved blocks held
  QCOMPARE(shared->n_shared(), 2);
  QCOMPARE(shared->refs(a[0]), 2);
  QCOMPARE(shared->refs(a[2]), 1);  // the prefill side's freed partial block
  verify_consistent(prefill);
  verify_consistent(decode);
  QVERIFY(shared->check_invariants().empty());
  // Snapshots (the inspector) show each block's slot and how many blocks map it.
  const KvSnapshot snap = decode.snapshot();
  const BlockId first = decode.table(1).blocks()[0];
  QCOMPARE(snap.block_slots.size(), snap.blocks.size());
  QCOMPARE(snap.block_slots[static_cast<size_t>(first)], a[0]);
  QCOMPARE(snap.slot_refs[static_cast<size_t>(first)], 2);
  QVERIFY(KvManager(4, 4).snapshot().block_slots.empty());

  // A full block whose slot is shared is copied before it is written (after a rollback).
  decode.truncate(1, 6);
  const AppendResult r = decode.append(1, 42);
  QVERIFY(r.ok() && r.copy.has_value());
  QCOMPARE(decode.table(1).blocks()[1], r.copy->dst);
  decode.storage_slots(1, b);
  QVERIFY(b[1] != a[1]);
  // The copy's slots are fixed when it is planned: it reads the shared slot, whatever the
  // released source block maps to later.
  QCOMPARE(r.copy->src_slot, a[1]);
  QCOMPARE(r.copy->dst_slot, b[1]);

  // The prefill side's next prompt takes new content into fresh slots.
  QVERIFY(prefill.allocate_sequence(2, iota_tokens(8, 50)));
  std::vector<int32_t> c;
  prefill.storage_slots(2, c);
  for (const int32_t s : c) QVERIFY(s != a[0] && s != a[1]);
  // A prefix hit on the prefill side reads the shared slots (the KV is the same).
  QCOMPARE(prefill.allocate_sequence(3, iota_tokens(12, 0)), std::optional<int32_t>(8));
  prefill.storage_slots(3, c);
  QCOMPARE(c[0], a[0]);
  QCOMPARE(c[1], a[1]);
  QVERIFY(shared->check_invariants().empty());

  // Misuse is refused with a message.
  KvManager own(4, 4);
  QVERIFY(own.allocate_sequence(1, iota_tokens(4, 0)));
  const std::vector<int32_t> one = {0}, two = {0, 1};
  QVERIFY_THROWS_EXCEPTION(Error, own.adopt_slots(1, 0, one));     // no shared storage
  QVERIFY_THROWS_EXCEPTION(Error, decode.adopt_slots(1, 2, two));  // past the table's end
  QVERIFY_THROWS_EXCEPTION(Error, KvManager(1, 4, shared));        // every slot is claimed
}

void TestKvCache::shared_slots_random_hand_overs_data() {
  QTest::addColumn<uint32_t>("seed");
  QTest::addColumn<int32_t>("n_blocks");
  QTest::addColumn<int32_t>("block_size");
  QTest::newRow("seed 1, 2 × 32 × 4") << 1u << 32 << 4;
  QTest::newRow("seed 2, 2 × 24 × 16") << 2u << 24 << 16;
  QTest::newRow("seed 3, 2 × 20 × 3") << 3u << 20 << 3;
}

void TestKvCache::shared_slots_random_hand_overs() {
  QFETCH(uint32_t, seed);
  QFETCH(int32_t, n_blocks);
  QFETCH(int32_t, block_size);
  SharedRandomRun run(seed, n_blocks, block_size);
  for (int32_t i = 0; i < 5000; ++i) {
    const std::string problem = run.step();
    if (!problem.empty()) QFAIL(qPrintable(QString("step %1: %2").arg(i).arg(problem.c_str())));
  }
  const std::string problem = run.finish();
  QVERIFY2(problem.empty(), problem.c_str());
  QVERIFY(run.handed_over() > 100);  // it exercised what it checks
  QVERIFY(run.max_shared() > 0);
}
