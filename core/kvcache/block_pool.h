#pragma once
// BlockPool: the bookkeeping of one device's paged KV cache. Pure bookkeeping — the K/V tensors
// live with the device, shaped (n_blocks, n_layer, 2, n_kv_head, block_size, head_dim) or similar,
// and are indexed by the BlockId handed out here.
//
// A block is in exactly one state:
//   kFree   — on the free list; no owners, ref count 0, no hash, 0 tokens.
//   kOwned  — held by ≥ 1 sequences; ref count == number of owners (a sequence appears once per
//             block it holds).
//   kCached — held by no sequence but registered in the prefix cache (it has a hash and
//             block_size tokens); its KV is still valid and may be reused or evicted.
// Reference policy: the prefix cache holds no reference of its own. A registered block whose last
// owner releases it becomes kCached instead of kFree; eviction turns kCached into kFree.
//
// Slots: the K/V tensors are addressed by slot(id). A pool of its own storage maps each block to
// the slot of its id. A pool over storage shared with another pool (KvSlots: one device's prefill
// and decode partitions) maps its blocks onto the slots it claimed, and a block may adopt a slot
// that holds KV another pool wrote (adopt_slot); allocate() gives a block a slot of its own again
// before it takes new content.
//
// Not thread-safe: one pool belongs to one worker thread; others read it through KvSnapshot.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tokenfab {

using TokenId = int32_t;
using BlockId = int32_t;
using SequenceId = int64_t;

inline constexpr int32_t kDefaultBlockSize = 16;  // tokens per block

enum class BlockState : uint8_t { kFree, kOwned, kCached };

const char* block_state_name(BlockState state);

// Per-block record; also the element of KvSnapshot.
struct BlockRecord {
  BlockState state = BlockState::kFree;
  int32_t ref_count = 0;
  // Slots of this block holding written KV, 0..block_size. Set by the (sole) writer; a full
  // block has block_size.
  int32_t n_tokens = 0;
  bool has_hash = false;  // registered in the prefix cache
  uint64_t hash = 0;      // hash-chain value (see PrefixCache::hash_block); valid when has_hash
  std::vector<SequenceId> owners;  // size() == ref_count
};

// Number of blocks a memory budget holds: floor(budget_bytes / bytes_per_block).
int32_t blocks_for_budget(uint64_t budget_bytes, uint64_t bytes_per_block);

// Bytes of one block's K and V over all layers at `bytes_per_element` (e.g. 2 for F16):
// 2 (K,V) × n_layer × n_kv_head × block_size × head_dim × bytes_per_element.
uint64_t kv_bytes_per_block(int32_t n_layer, int32_t n_kv_head, int32_t head_dim,
                            int32_t block_size, int32_t bytes_per_element);

class KvSlots;  // core/kvcache/kv_slots.h

class BlockPool {
 public:
  // n_blocks ≥ 1, block_size ≥ 1; throws tokenfab::Error otherwise. With `shared`, the blocks map
  // onto n_blocks slots claimed from it (throws when it has fewer unclaimed).
  explicit BlockPool(int32_t n_blocks, int32_t block_size = kDefaultBlockSize,
                     std::shared_ptr<KvSlots> shared = nullptr);
  ~BlockPool();  // gives its slots back
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  int32_t n_blocks() const { return static_cast<int32_t>(records_.size()); }
  int32_t block_size() const { return block_size_; }
  int32_t n_free() const { return static_cast<int32_t>(free_list_.size()); }
  int32_t n_owned() const { return n_owned_; }
  int32_t n_cached() const { return n_blocks() - n_free() - n_owned_; }

  const BlockRecord& record(BlockId id) const;
  const std::vector<BlockRecord>& records() const { return records_; }

  // Takes a block from the free list for `owner` (kFree → kOwned, ref 1, 0 tokens), or nullopt
  // when no block is free. Cached blocks are not touched: evicting them is the caller's choice.
  std::optional<BlockId> allocate(SequenceId owner);

  // Adds `owner` to an owned or cached block (kCached → kOwned).
  void retain(BlockId id, SequenceId owner);

  // Removes one `owner` reference. At ref count 0 the block becomes kCached when registered,
  // kFree otherwise. Returns the new state. Throws if `owner` does not hold the block.
  BlockState release(BlockId id, SequenceId owner);

  void set_tokens(BlockId id, int32_t n_tokens);

  // Marks an owned, full block as registered in the prefix cache with `hash`.
  void set_hash(BlockId id, uint64_t hash);
  // Unregisters an owned block (its content is about to change).
  void clear_hash(BlockId id);

  // kCached → kFree (prefix-cache eviction).
  void evict(BlockId id);

  // Where block `id`'s K/V live in the storage: `id` itself without shared slots.
  int32_t slot(BlockId id) const { return slots_ ? slot_of_[static_cast<size_t>(id)] : id; }
  bool shares_slots() const { return slots_ != nullptr; }
  // Whether another block (of this pool or another) maps onto block `id`'s slot.
  bool slot_shared(BlockId id) const;
  // With shared slots: every block's slot, and how many blocks of all pools map each of them
  // ((n_blocks) each). Without: both empty.
  void slot_view(std::vector<int32_t>& block_slots, std::vector<int32_t>& refs) const;
  // Owned block `id` now maps onto `slot`, which holds the KV it is to hold (written by another
  // pool over the same KvSlots); its own slot becomes spare. Throws without shared slots.
  void adopt_slot(BlockId id, int32_t slot);

  // First violation of the states described above, or "" when consistent.
  std::string check_invariants() const;

 private:
  BlockRecord& mutable_record(BlockId id);
  void push_free(BlockId id);

  int32_t block_size_;
  int32_t n_owned_ = 0;
  std::vector<BlockRecord> records_;  // (n_blocks)
  // LIFO stack of free ids; in_free_list_[id] mirrors membership so checks are O(1).
  std::vector<BlockId> free_list_;
  std::vector<uint8_t> in_free_list_;  // (n_blocks) 0/1
  std::shared_ptr<KvSlots> slots_;     // null: slot(id) == id
  std::vector<int32_t> slot_of_;       // (n_blocks) with slots_: each block's slot
};

}  // namespace tokenfab
