#pragma once
// Qt Test suite for core/kvcache. Slots by theme: pool, table, fork and rollback
// (test_kvcache_units.cpp); prefix reuse, LRU eviction, snapshots (test_kvcache_prefix.cpp);
// randomized operation sequences checked against the invariants and main
// (test_kvcache_random.cpp); two pools over shared slots, prompts handed over without a copy
// (test_kvcache_slots.cpp).

#include <QObject>
#include <QtTest>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/kvcache/kv_manager.h"

class TestKvCache : public QObject {
  Q_OBJECT

 private slots:
  // test_kvcache_units.cpp
  void pool_allocates_retains_and_releases();
  void pool_sized_from_memory_budget();
  void table_allocates_a_block_per_block_size_tokens();
  void out_of_blocks_is_a_return_value();
  void truncate_releases_blocks_past_n();
  void unregistered_append_then_rewrite_registers_the_new_tokens();
  void fork_shares_blocks_and_copies_the_partial_one();
  void misuse_throws();

  // test_kvcache_prefix.cpp
  void hash_chain_names_tokens_and_prefix();
  void shared_prefix_reuses_full_blocks();
  void fully_cached_prompt_leaves_one_token_to_compute();
  void unreferenced_blocks_are_evicted_lru();
  void snapshot_is_a_consistent_copy();

  // test_kvcache_random.cpp
  void random_operations_keep_invariants_data();
  void random_operations_keep_invariants();

  // test_kvcache_slots.cpp
  void shared_slots_hand_over_without_copy();
  void shared_slots_random_hand_overs_data();
  void shared_slots_random_hand_overs();
};

// Helpers shared by the suites.
// Tokens first, first+1, …: distinct runs so unrelated prompts never share a block hash.
inline std::vector<tokenfab::TokenId> iota_tokens(int32_t n, tokenfab::TokenId first) {
  std::vector<tokenfab::TokenId> tokens(static_cast<size_t>(n));
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

// Seeded draws for the randomized suites. Tokens come from a small vocabulary, so independent
// sequences also produce equal blocks (and the prefix cache gets hits).
class RandomDraws {
 public:
  explicit RandomDraws(uint32_t seed) : rng_(seed) {}
  int32_t pick(int32_t lo, int32_t hi) { return std::uniform_int_distribution<>(lo, hi)(rng_); }
  std::vector<tokenfab::TokenId> tokens(int32_t n) {
    std::vector<tokenfab::TokenId> out(static_cast<size_t>(n));
    for (tokenfab::TokenId& t : out) t = pick(0, 3);
    return out;
  }

 private:
  std::mt19937 rng_;
};

inline void verify_consistent(const tokenfab::KvManager& kv) {
  const std::string violation = kv.check_invariants();
  QVERIFY2(violation.empty(), violation.c_str());
}
