#include "core/kvcache/block_pool.h"

#include <algorithm>
#include <utility>

#include "core/common/error.h"
#include "core/kvcache/kv_slots.h"

namespace tokenfab {

const char* block_state_name(BlockState state) {
  switch (state) {
    case BlockState::kFree:
      return "free";
    case BlockState::kOwned:
      return "owned";
    case BlockState::kCached:
      return "cached";
  }
  return "?";
}

int32_t blocks_for_budget(uint64_t budget_bytes, uint64_t bytes_per_block) {
  if (bytes_per_block == 0) throw Error("kv cache: bytes per block must be > 0");
  const uint64_t n = budget_bytes / bytes_per_block;
  return static_cast<int32_t>(std::min<uint64_t>(n, INT32_MAX));
}

uint64_t kv_bytes_per_block(int32_t n_layer, int32_t n_kv_head, int32_t head_dim,
                            int32_t block_size, int32_t bytes_per_element) {
  return uint64_t{2} * static_cast<uint64_t>(n_layer) * static_cast<uint64_t>(n_kv_head) *
         static_cast<uint64_t>(block_size) * static_cast<uint64_t>(head_dim) *
         static_cast<uint64_t>(bytes_per_element);
}

BlockPool::BlockPool(int32_t n_blocks, int32_t block_size, std::shared_ptr<KvSlots> shared)
    : block_size_(block_size), slots_(std::move(shared)) {
  if (n_blocks < 1) {
    throw Error("kv cache: pool needs at least 1 block, got " + std::to_string(n_blocks));
  }
  if (block_size < 1) {
    throw Error("kv cache: block size must be ≥ 1 token, got " + std::to_string(block_size));
  }
  records_.resize(static_cast<size_t>(n_blocks));
  in_free_list_.assign(static_cast<size_t>(n_blocks), 0);
  free_list_.reserve(static_cast<size_t>(n_blocks));
  // Pushed in reverse so the first allocations hand out 0, 1, 2, … (easier to read in the map).
  for (BlockId id = n_blocks - 1; id >= 0; --id) push_free(id);
  if (slots_) slot_of_ = slots_->claim(n_blocks);
}

BlockPool::~BlockPool() {
  if (slots_) slots_->release(slot_of_);
}

bool BlockPool::slot_shared(BlockId id) const {
  record(id);  // throws for an id outside the pool
  return slots_ && slots_->refs(slot_of_[static_cast<size_t>(id)]) > 1;
}

void BlockPool::slot_view(std::vector<int32_t>& block_slots, std::vector<int32_t>& refs) const {
  block_slots.clear();
  refs.clear();
  if (!slots_) return;
  block_slots = slot_of_;
  refs = slots_->refs_of(slot_of_);
}

void BlockPool::adopt_slot(BlockId id, int32_t slot) {
  const BlockRecord& r = record(id);
  if (!slots_)
    throw Error("kv cache: block " + std::to_string(id) +
                " cannot adopt a slot: its pool has storage of its own");
  if (r.state != BlockState::kOwned)
    throw Error("kv cache: block " + std::to_string(id) + " adopts a slot while " +
                block_state_name(r.state));
  int32_t& mine = slot_of_[static_cast<size_t>(id)];
  slots_->share(mine, slot);
  mine = slot;
}

const BlockRecord& BlockPool::record(BlockId id) const {
  if (id < 0 || id >= n_blocks()) {
    throw Error("kv cache: block id " + std::to_string(id) + " out of range [0, " +
                std::to_string(n_blocks()) + ")");
  }
  return records_[static_cast<size_t>(id)];
}

BlockRecord& BlockPool::mutable_record(BlockId id) {
  return const_cast<BlockRecord&>(static_cast<const BlockPool*>(this)->record(id));
}

void BlockPool::push_free(BlockId id) {
  free_list_.push_back(id);
  in_free_list_[static_cast<size_t>(id)] = 1;
}

std::optional<BlockId> BlockPool::allocate(SequenceId owner) {
  if (free_list_.empty()) return std::nullopt;
  const BlockId id = free_list_.back();
  free_list_.pop_back();
  in_free_list_[static_cast<size_t>(id)] = 0;
  BlockRecord& r = records_[static_cast<size_t>(id)];
  r.state = BlockState::kOwned;
  r.ref_count = 1;
  r.n_tokens = 0;
  r.owners.assign(1, owner);
  ++n_owned_;
  // New content: never written into a slot another pool's block still reads.
  if (slots_)
    slot_of_[static_cast<size_t>(id)] = slots_->make_private(slot_of_[static_cast<size_t>(id)]);
  return id;
}

void BlockPool::retain(BlockId id, SequenceId owner) {
  BlockRecord& r = mutable_record(id);
  if (r.state == BlockState::kFree) {
    throw Error("kv cache: retain of free block " + std::to_string(id));
  }
  if (r.state == BlockState::kCached) {
    r.state = BlockState::kOwned;
    ++n_owned_;
  }
  ++r.ref_count;
  r.owners.push_back(owner);
}

BlockState BlockPool::release(BlockId id, SequenceId owner) {
  BlockRecord& r = mutable_record(id);
  const auto it = std::find(r.owners.begin(), r.owners.end(), owner);
  if (r.state != BlockState::kOwned || it == r.owners.end()) {
    throw Error("kv cache: sequence " + std::to_string(owner) + " releases block " +
                std::to_string(id) + " it does not hold (state " + block_state_name(r.state) + ")");
  }
  r.owners.erase(it);
  if (--r.ref_count > 0) return BlockState::kOwned;
  --n_owned_;
  if (r.has_hash) {
    r.state = BlockState::kCached;
  } else {
    r.state = BlockState::kFree;
    r.n_tokens = 0;
    push_free(id);
  }
  return r.state;
}

void BlockPool::set_tokens(BlockId id, int32_t n_tokens) {
  BlockRecord& r = mutable_record(id);
  if (n_tokens < 0 || n_tokens > block_size_) {
    throw Error("kv cache: block " + std::to_string(id) + " cannot hold " +
                std::to_string(n_tokens) + " tokens");
  }
  r.n_tokens = n_tokens;
}

void BlockPool::set_hash(BlockId id, uint64_t hash) {
  BlockRecord& r = mutable_record(id);
  if (r.state != BlockState::kOwned || r.n_tokens != block_size_) {
    throw Error("kv cache: only an owned, full block can be registered (block " +
                std::to_string(id) + ")");
  }
  r.has_hash = true;
  r.hash = hash;
}

void BlockPool::clear_hash(BlockId id) {
  BlockRecord& r = mutable_record(id);
  r.has_hash = false;
  r.hash = 0;
}

void BlockPool::evict(BlockId id) {
  BlockRecord& r = mutable_record(id);
  if (r.state != BlockState::kCached) {
    throw Error("kv cache: evict of block " + std::to_string(id) + " in state " +
                block_state_name(r.state));
  }
  r.state = BlockState::kFree;
  r.has_hash = false;
  r.hash = 0;
  r.n_tokens = 0;
  push_free(id);
}

std::string BlockPool::check_invariants() const {
  int32_t n_free = 0;
  int32_t n_owned = 0;
  for (BlockId id = 0; id < n_blocks(); ++id) {
    const BlockRecord& r = records_[static_cast<size_t>(id)];
    const std::string where = "block " + std::to_string(id) + ": ";
    const bool listed = in_free_list_[static_cast<size_t>(id)] != 0;
    if (r.ref_count != static_cast<int32_t>(r.owners.size())) {
      return where + "ref count " + std::to_string(r.ref_count) +
             " != " + std::to_string(r.owners.size()) + " owners";
    }
    if (r.n_tokens < 0 || r.n_tokens > block_size_) return where + "token count out of range";
    switch (r.state) {
      case BlockState::kFree:
        ++n_free;
        if (!listed) return where + "free but not on the free list";
        if (r.ref_count != 0) return where + "free and owned";
        if (r.has_hash || r.n_tokens != 0) return where + "free but keeps a hash or tokens";
        break;
      case BlockState::kOwned:
        ++n_owned;
        if (listed) return where + "owned but on the free list";
        if (r.ref_count < 1) return where + "owned with ref count 0";
        if (r.has_hash && r.n_tokens != block_size_) return where + "registered but not full";
        break;
      case BlockState::kCached:
        if (listed) return where + "cached but on the free list";
        if (r.ref_count != 0) return where + "cached but referenced";
        if (!r.has_hash || r.n_tokens != block_size_) return where + "cached without full hash";
        break;
    }
  }
  if (n_free != static_cast<int32_t>(free_list_.size())) {
    return "free list holds " + std::to_string(free_list_.size()) + " ids but " +
           std::to_string(n_free) + " blocks are free";
  }
  if (n_owned != n_owned_) return "owned counter out of step with the records";
  return {};
}

}  // namespace tokenfab
