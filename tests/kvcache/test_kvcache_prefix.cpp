// Prefix cache: hash chain, reuse of shared prefixes, hit counts, LRU eviction; snapshots.

#include <QtTest>
#include <numeric>
#include <vector>

#include "core/kvcache/kv_manager.h"
#include "test_kvcache.h"

using namespace tokenfab;

namespace {

std::vector<TokenId> concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

void TestKvCache::hash_chain_names_tokens_and_prefix() {
  const std::vector<TokenId> a = iota_tokens(16, 0);
  std::vector<TokenId> b = a;
  b[15] = 99;
  const uint64_t ha = PrefixCache::hash_block(PrefixCache::kRootHash, a);
  QCOMPARE(PrefixCache::hash_block(PrefixCache::kRootHash, a), ha);   // deterministic
  QVERIFY(PrefixCache::hash_block(PrefixCache::kRootHash, b) != ha);  // one token differs
  QVERIFY(PrefixCache::hash_block(ha, a) != ha);                      // same tokens, other parent
}

void TestKvCache::shared_prefix_reuses_full_blocks() {
  KvManager kv(16, 16);
  const std::vector<TokenId> system = iota_tokens(40, 1000);  // shared 40-token prefix
  const std::vector<TokenId> a = concat(system, iota_tokens(10, 0));
  const std::vector<TokenId> b = concat(system, iota_tokens(10, 500));

  QCOMPARE(kv.allocate_sequence(1, a), std::optional<int32_t>(0));
  // b differs from a at token 40, inside the third block: the first two full blocks are reused.
  QCOMPARE(kv.blocks_needed_for_prompt(b), 2);  // 4 blocks for 50 tokens, 2 found
  QCOMPARE(kv.allocate_sequence(2, b), std::optional<int32_t>(32));
  const std::vector<BlockId>& ta = kv.table(1).blocks();
  const std::vector<BlockId>& tb = kv.table(2).blocks();
  QCOMPARE(tb[0], ta[0]);
  QCOMPARE(tb[1], ta[1]);
  QVERIFY(tb[2] != ta[2]);
  QCOMPARE(kv.pool().record(ta[0]).ref_count, 2);
  QCOMPARE(kv.pool().record(ta[1]).owners, (std::vector<SequenceId>{1, 2}));
  QCOMPARE(kv.pool().record(ta[2]).ref_count, 1);

  // Lookups cover (50 - 1) / 16 = 3 full blocks per prompt: a 0 hits / 3 misses, b 2 / 1.
  const PrefixCacheStats& s = kv.prefix_cache().stats();
  QCOMPARE(s.hit_blocks, int64_t{2});
  QCOMPARE(s.miss_blocks, int64_t{4});
  QCOMPARE(s.hit_tokens, int64_t{32});
  QCOMPARE(s.miss_tokens, int64_t{50 + 18});
  QCOMPARE(s.hit_rate(), 32.0 / 100.0);
  verify_consistent(kv);

  // After both finish, a follow-up turn of a (a + new tokens) finds all three of a's full blocks.
  kv.free_sequence(1);
  kv.free_sequence(2);
  QCOMPARE(kv.pool().n_owned(), 0);
  QCOMPARE(kv.pool().n_cached(), 4);  // a's 3 full blocks and b's third
  QCOMPARE(kv.allocate_sequence(3, concat(a, iota_tokens(5, 7000))), std::optional<int32_t>(48));
  QCOMPARE(kv.pool().n_cached(), 1);
  verify_consistent(kv);
}

void TestKvCache::fully_cached_prompt_leaves_one_token_to_compute() {
  KvManager kv(8, 16);
  const std::vector<TokenId> p = iota_tokens(32, 0);
  QVERIFY(kv.allocate_sequence(1, p));
  // Both blocks are cached, but only the first is reused: the last token's logits must be
  // computed, so the second block is allocated anew (and stays unregistered: its hash is taken).
  QCOMPARE(kv.allocate_sequence(2, p), std::optional<int32_t>(16));
  QCOMPARE(kv.table(2).blocks()[0], kv.table(1).blocks()[0]);
  QVERIFY(kv.table(2).blocks()[1] != kv.table(1).blocks()[1]);
  QVERIFY(!kv.pool().record(kv.table(2).blocks()[1]).has_hash);
  verify_consistent(kv);
  kv.free_sequence(2);
  kv.free_sequence(1);
  QCOMPARE(kv.pool().n_cached(), 2);
  QCOMPARE(kv.pool().n_free(), 6);
}

void TestKvCache::unreferenced_blocks_are_evicted_lru() {
  KvManager kv(4, 16);
  const std::vector<TokenId> pa = iota_tokens(16, 0);
  const std::vector<TokenId> pb = iota_tokens(16, 100);
  const std::vector<TokenId> pc = iota_tokens(16, 200);
  QVERIFY(kv.allocate_sequence(1, pa));
  QVERIFY(kv.allocate_sequence(2, pb));
  QVERIFY(kv.allocate_sequence(3, pc));
  const BlockId ba = kv.table(1).blocks()[0];
  const BlockId bb = kv.table(2).blocks()[0];
  const BlockId bc = kv.table(3).blocks()[0];
  kv.free_sequence(2);
  kv.free_sequence(1);
  kv.free_sequence(3);
  QCOMPARE(kv.prefix_cache().lru_order(), (std::vector<BlockId>{bb, ba, bc}));
  QCOMPARE(kv.n_available_blocks(), 4);

  // Reusing a's block takes it off the list; releasing it (after the partial tail) puts it last.
  QCOMPARE(kv.allocate_sequence(4, concat(pa, {1})), std::optional<int32_t>(16));  // 2 blocks
  QCOMPARE(kv.prefix_cache().lru_order(), (std::vector<BlockId>{bb, bc}));
  kv.free_sequence(4);
  QCOMPARE(kv.prefix_cache().lru_order(), (std::vector<BlockId>{bb, bc, ba}));
  QCOMPARE(kv.pool().n_free(), 1);

  // 3 new blocks: the free one, then b's and c's (least recently released first).
  QCOMPARE(kv.allocate_sequence(5, iota_tokens(40, 300)), std::optional<int32_t>(0));
  QCOMPARE(kv.prefix_cache().lru_order(), (std::vector<BlockId>{ba}));
  QCOMPARE(kv.pool().record(bb).state, BlockState::kOwned);
  QCOMPARE(kv.pool().record(bc).state, BlockState::kOwned);
  QVERIFY(!kv.prefix_cache().find(PrefixCache::hash_block(PrefixCache::kRootHash, pb)));
  QVERIFY(kv.prefix_cache().find(PrefixCache::hash_block(PrefixCache::kRootHash, pa)));
  verify_consistent(kv);

  kv.free_sequence(5);
  QCOMPARE(kv.evict(1), 1);
  QVERIFY(!kv.prefix_cache().find(PrefixCache::hash_block(PrefixCache::kRootHash, pa)));
  kv.evict_all();
  QCOMPARE(kv.pool().n_free(), 4);
  verify_consistent(kv);
}

void TestKvCache::snapshot_is_a_consistent_copy() {
  KvManager kv(6, 16);
  QVERIFY(kv.allocate_sequence(1, iota_tokens(20, 0)));
  kv.fork(1, 2);
  QVERIFY(kv.allocate_sequence(3, iota_tokens(16, 100)));
  kv.free_sequence(3);
  const KvSnapshot snap = kv.snapshot();
  QCOMPARE(snap.n_blocks, 6);
  QCOMPARE(snap.block_size, 16);
  QCOMPARE(snap.n_sequences, 2);
  QCOMPARE(snap.n_owned, 2);
  QCOMPARE(snap.n_cached, 1);
  QCOMPARE(snap.n_free, 3);
  QCOMPARE(snap.n_free + snap.n_owned + snap.n_cached, snap.n_blocks);
  QCOMPARE(snap.blocks.size(), size_t{6});
  const BlockRecord& shared = snap.blocks[static_cast<size_t>(kv.table(1).blocks()[1])];
  QCOMPARE(shared.state, BlockState::kOwned);
  QCOMPARE(shared.owners, (std::vector<SequenceId>{1, 2}));
  QCOMPARE(shared.n_tokens, 4);
  QVERIFY(!shared.has_hash);
  QVERIFY(snap.blocks[static_cast<size_t>(kv.table(1).blocks()[0])].has_hash);

  // Later changes do not reach a snapshot already taken.
  kv.free_sequence(1);
  kv.free_sequence(2);
  kv.evict_all();
  QCOMPARE(snap.n_owned, 2);
  QCOMPARE(shared.owners.size(), size_t{2});
  QCOMPARE(kv.snapshot().n_free, 6);
}
