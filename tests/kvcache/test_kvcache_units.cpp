// BlockPool, BlockTable through KvManager: allocation, rollback, fork / copy-on-write, errors.

#include <QtTest>
#include <numeric>
#include <vector>

#include "core/common/error.h"
#include "core/kvcache/kv_manager.h"
#include "test_kvcache.h"

using namespace tokenfab;

void TestKvCache::pool_allocates_retains_and_releases() {
  BlockPool pool(3, 16);
  QCOMPARE(pool.allocate(7), std::optional<BlockId>(0));
  QCOMPARE(pool.allocate(7), std::optional<BlockId>(1));
  QCOMPARE(pool.allocate(8), std::optional<BlockId>(2));
  QCOMPARE(pool.allocate(8), std::nullopt);
  QCOMPARE(pool.n_free(), 0);
  QCOMPARE(pool.n_owned(), 3);

  pool.retain(1, 8);
  QCOMPARE(pool.record(1).ref_count, 2);
  QCOMPARE(pool.record(1).owners, (std::vector<SequenceId>{7, 8}));
  QCOMPARE(pool.release(1, 7), BlockState::kOwned);
  QCOMPARE(pool.release(1, 8), BlockState::kFree);
  QVERIFY_THROWS_EXCEPTION(Error, pool.release(1, 8));  // double free
  QVERIFY_THROWS_EXCEPTION(Error, pool.release(0, 8));  // not an owner
  QVERIFY_THROWS_EXCEPTION(Error, pool.evict(0));       // owned, not cached
  QCOMPARE(pool.n_free(), 1);
  QCOMPARE(pool.allocate(9), std::optional<BlockId>(1));  // the freed block is reused

  // A registered block outlives its owners as kCached until evicted.
  pool.set_tokens(0, 16);
  pool.set_hash(0, 0xabcdef);
  QCOMPARE(pool.release(0, 7), BlockState::kCached);
  QCOMPARE(pool.n_cached(), 1);
  QVERIFY(pool.check_invariants().empty());
  pool.evict(0);
  QCOMPARE(pool.record(0).state, BlockState::kFree);
  QVERIFY(!pool.record(0).has_hash);
  QVERIFY2(pool.check_invariants().empty(), pool.check_invariants().c_str());
}

void TestKvCache::pool_sized_from_memory_budget() {
  // SmolLM2-135M: 30 layers, 3 KV heads of 64, F16 → 2·30·3·16·64·2 bytes per 16-token block.
  const uint64_t per_block = kv_bytes_per_block(30, 3, 64, 16, 2);
  QCOMPARE(per_block, uint64_t{368640});
  QCOMPARE(blocks_for_budget(uint64_t{256} << 20, per_block), 728);  // floor(268435456 / 368640)
  QCOMPARE(blocks_for_budget(per_block - 1, per_block), 0);
  QVERIFY_THROWS_EXCEPTION(Error, blocks_for_budget(1024, 0));
  QVERIFY_THROWS_EXCEPTION(Error, BlockPool(0, 16));
  QVERIFY_THROWS_EXCEPTION(Error, BlockPool(4, 0));
}

void TestKvCache::table_allocates_a_block_per_block_size_tokens() {
  KvManager kv(8, 16);
  QCOMPARE(kv.allocate_sequence(1, iota_tokens(20, 100)), std::optional<int32_t>(0));
  QCOMPARE(kv.table(1).blocks().size(), size_t{2});
  QCOMPARE(kv.blocks_needed(1, 12), 0);  // 20 + 12 = 32 fits two blocks
  QCOMPARE(kv.blocks_needed(1, 13), 1);
  QCOMPARE(kv.blocks_needed(1, 45), 3);  // 65 tokens → 5 blocks
  for (TokenId t = 0; t < 12; ++t) QVERIFY(kv.append(1, 200 + t).ok());
  QCOMPARE(kv.table(1).blocks().size(), size_t{2});
  QCOMPARE(kv.pool().record(kv.table(1).blocks()[1]).n_tokens, 16);
  QVERIFY(kv.append(1, 300).ok());
  QCOMPARE(kv.table(1).n_tokens(), 33);
  QCOMPARE(kv.table(1).blocks().size(), size_t{3});
  QCOMPARE(kv.pool().record(kv.table(1).blocks()[2]).n_tokens, 1);
  // Both full blocks are registered, the partial one is not.
  QVERIFY(kv.pool().record(kv.table(1).blocks()[0]).has_hash);
  QVERIFY(kv.pool().record(kv.table(1).blocks()[1]).has_hash);
  QVERIFY(!kv.pool().record(kv.table(1).blocks()[2]).has_hash);
  QCOMPARE(kv.table(1).full_block_hashes().size(), size_t{2});
  verify_consistent(kv);
  kv.free_sequence(1);
  QCOMPARE(kv.pool().n_free(), 6);
  QCOMPARE(kv.pool().n_cached(), 2);
  QCOMPARE(kv.evict_all(), 2);
  QCOMPARE(kv.pool().n_free(), 8);
  verify_consistent(kv);
}

void TestKvCache::out_of_blocks_is_a_return_value() {
  KvManager kv(2, 16);
  QVERIFY(!kv.can_allocate(iota_tokens(33, 0)));
  QCOMPARE(kv.allocate_sequence(1, iota_tokens(33, 0)), std::nullopt);
  QVERIFY(!kv.has_sequence(1));
  QCOMPARE(kv.pool().n_free(), 2);
  QCOMPARE(kv.allocate_sequence(1, iota_tokens(32, 0)), std::optional<int32_t>(0));
  QVERIFY(!kv.can_append(1));
  const AppendResult r = kv.append(1, 5);
  QCOMPARE(r.status, AppendStatus::kOutOfBlocks);
  QCOMPARE(kv.table(1).n_tokens(), 32);  // nothing appended
  // A multi-token append is all or nothing.
  kv.truncate(1, 30);
  QCOMPARE(kv.append(1, iota_tokens(3, 50)).status, AppendStatus::kOutOfBlocks);
  QCOMPARE(kv.table(1).n_tokens(), 30);
  QVERIFY(kv.append(1, iota_tokens(2, 50)).ok());
  verify_consistent(kv);
}

// A draft tree's append fills a block without offering it to the prefix cache; after the rollback,
// rewrite() puts the accepted tokens in and registers the full block under their hash.
void TestKvCache::unregistered_append_then_rewrite_registers_the_new_tokens() {
  KvManager kv(8, 16);
  QVERIFY(kv.allocate_sequence(1, iota_tokens(10, 0)));
  const std::vector<TokenId> drafts = iota_tokens(12, 500);  // tokens 10..21: fills block 0
  QVERIFY(kv.append(1, drafts, false).ok());
  const BlockId b0 = kv.table(1).blocks()[0];
  QVERIFY(!kv.pool().record(b0).has_hash);
  QCOMPARE(kv.table(1).full_block_hashes().size(), size_t{1});
  kv.truncate(1, 16);  // 6 drafts kept (the accepted path, to be rewritten)
  std::vector<TokenId> accepted = iota_tokens(6, 900);
  kv.rewrite(1, 10, accepted);
  QVERIFY(kv.pool().record(b0).has_hash);
  std::vector<TokenId> want = iota_tokens(10, 0);
  want.insert(want.end(), accepted.begin(), accepted.end());
  QCOMPARE(kv.table(1).tokens(), want);
  // A new prompt with those 16 tokens (and more) finds the block.
  std::vector<TokenId> prompt = want;
  prompt.push_back(7);
  QVERIFY(kv.allocate_sequence(2, prompt));
  QCOMPARE(kv.table(2).blocks()[0], b0);
  QVERIFY_THROWS_EXCEPTION(tokenfab::Error, kv.rewrite(1, 10, iota_tokens(7, 0)));
  verify_consistent(kv);
}

void TestKvCache::truncate_releases_blocks_past_n() {
  KvManager kv(8, 16);
  QVERIFY(kv.allocate_sequence(1, iota_tokens(40, 0)));  // blocks b0 b1 full, b2 has 8
  const std::vector<BlockId> blocks = kv.table(1).blocks();
  QCOMPARE(blocks.size(), size_t{3});

  kv.truncate(1, 17);  // b2 (unregistered) → free; b1 cut to 1 token but stays registered
  QCOMPARE(kv.table(1).blocks(), (std::vector<BlockId>{blocks[0], blocks[1]}));
  QCOMPARE(kv.pool().record(blocks[2]).state, BlockState::kFree);
  QVERIFY(kv.pool().record(blocks[1]).has_hash);
  QCOMPARE(kv.table(1).full_block_hashes().size(), size_t{1});
  verify_consistent(kv);

  kv.truncate(1, 10);  // b1 is released with its full, registered content → cached
  QCOMPARE(kv.pool().record(blocks[1]).state, BlockState::kCached);
  // Writing into the sole-held, registered b0 unregisters it instead of copying it.
  const AppendResult r = kv.append(1, 999);
  QVERIFY(r.ok());
  QVERIFY(!r.copy);
  QCOMPARE(kv.table(1).blocks(), (std::vector<BlockId>{blocks[0]}));
  QVERIFY(!kv.pool().record(blocks[0]).has_hash);
  QCOMPARE(kv.pool().record(blocks[0]).n_tokens, 11);
  QCOMPARE(kv.table(1).tokens().back(), 999);
  verify_consistent(kv);

  kv.truncate(1, 0);
  QVERIFY(kv.table(1).blocks().empty());
  QCOMPARE(kv.pool().n_owned(), 0);
  verify_consistent(kv);
}

void TestKvCache::fork_shares_blocks_and_copies_the_partial_one() {
  KvManager kv(8, 16);
  QVERIFY(kv.allocate_sequence(1, iota_tokens(20, 0)));
  const std::vector<BlockId> parent = kv.table(1).blocks();
  kv.fork(1, 2);
  QCOMPARE(kv.table(2).blocks(), parent);
  QCOMPARE(kv.pool().record(parent[0]).ref_count, 2);
  QCOMPARE(kv.pool().record(parent[1]).ref_count, 2);
  QCOMPARE(kv.pool().record(parent[1]).owners, (std::vector<SequenceId>{1, 2}));
  QCOMPARE(kv.table(1).copy_on_write_block(kv.pool()), std::optional<BlockId>(parent[1]));
  QCOMPARE(kv.blocks_needed(1, 1), 1);  // the copy
  verify_consistent(kv);

  // The parent's first write copies the shared partial block (4 tokens) and writes the copy.
  const AppendResult r = kv.append(1, 77);
  QVERIFY(r.ok());
  QVERIFY(r.copy.has_value());
  QCOMPARE(r.copy->src, parent[1]);
  QCOMPARE(r.copy->n_tokens, 4);
  QCOMPARE(kv.table(1).blocks()[1], r.copy->dst);
  QVERIFY(r.copy->dst != parent[1]);
  QCOMPARE(kv.pool().record(parent[1]).owners, (std::vector<SequenceId>{2}));
  QCOMPARE(kv.pool().record(parent[0]).ref_count, 2);  // the full block stays shared
  // The child now holds the old block alone and writes into it in place.
  const AppendResult c = kv.append(2, 88);
  QVERIFY(c.ok());
  QVERIFY(!c.copy);
  QCOMPARE(kv.table(2).blocks(), parent);
  QCOMPARE(kv.table(1).tokens().back(), 77);
  QCOMPARE(kv.table(2).tokens().back(), 88);
  verify_consistent(kv);

  // A fork at a block boundary needs no copy.
  QVERIFY(kv.allocate_sequence(3, iota_tokens(32, 500)));
  kv.fork(3, 4);
  QVERIFY(!kv.table(4).copy_on_write_block(kv.pool()));
  QVERIFY(!kv.append(4, 1).copy);
  for (const SequenceId s : kv.sequences()) kv.free_sequence(s);
  kv.evict_all();
  QCOMPARE(kv.pool().n_free(), 8);
  verify_consistent(kv);
}

void TestKvCache::misuse_throws() {
  KvManager kv(4, 16);
  QVERIFY(kv.allocate_sequence(1, iota_tokens(5, 0)));
  QVERIFY_THROWS_EXCEPTION(Error, kv.allocate_sequence(1, iota_tokens(5, 0)));
  QVERIFY_THROWS_EXCEPTION(Error, kv.append(2, 0));
  QVERIFY_THROWS_EXCEPTION(Error, kv.truncate(1, 6));
  QVERIFY_THROWS_EXCEPTION(Error, kv.fork(2, 3));
  QVERIFY_THROWS_EXCEPTION(Error, kv.fork(1, 1));
  QVERIFY_THROWS_EXCEPTION(Error, kv.table(9));
  kv.free_sequence(1);
  QVERIFY_THROWS_EXCEPTION(Error, kv.free_sequence(1));  // double free
  QCOMPARE(kv.pool().n_free(), 4);
  verify_consistent(kv);
}
