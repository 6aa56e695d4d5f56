#pragma once
// KvSlots: the physical blocks ("slots") of one KV storage that several BlockPools share — the
// prefill and decode partitions of one device, each with its own pool, prefix cache and worker
// thread, over one set of K/V tensors. Each block of each pool maps to one slot (BlockPool::slot),
// and the tensors are addressed by slot.
//
// Why: a prompt prefilled by one partition is handed to the other without copying its KV. The
// receiving pool reserves blocks as for a copy, then adopts the slots that already hold the KV
// (BlockPool::adopt_slot): its blocks map onto them, and the slots its blocks held become spare.
// A slot may then be referenced by a block of each pool; both only read it (full prompt blocks,
// or a last partial block its prefill side no longer touches). A block about to take new content
// (BlockPool::allocate) gets a slot of its own again (make_private), from the spares.
//
// Invariant: every block of every pool holds exactly one slot reference, the pools' blocks
// together number n_slots, and a slot is spare ⟺ no block references it. So the spares number
// Σ (refs − 1) over referenced slots, and one exists whenever a block's slot is shared.
//
// Thread-safe (one mutex): each pool calls from its own worker thread.

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace tokenfab {

class KvSlots {
 public:
  // n_slots ≥ 1; all spare until pools claim them.
  explicit KvSlots(int32_t n_slots);
  KvSlots(const KvSlots&) = delete;
  KvSlots& operator=(const KvSlots&) = delete;

  int32_t n_slots() const { return static_cast<int32_t>(refs_.size()); }

  // n spare slots for a new pool's blocks (one reference each), lowest first. Throws Error when
  // fewer than n are spare.
  std::vector<int32_t> claim(int32_t n);
  // Drops one reference to each slot (a pool going away).
  void release(const std::vector<int32_t>& released);

  // For a block that held `slot` and is about to take new content: `slot` itself when the block
  // is its only reference, else a spare slot now referenced by the block alone.
  int32_t make_private(int32_t slot);
  // A block that held `own` now references `shared` instead (adoption): `shared` gains a
  // reference, `own` loses one. `shared` must be referenced already.
  void share(int32_t own, int32_t shared);

  int32_t refs(int32_t slot) const;  // blocks referencing `slot`
  // refs(of[i]) for every i, under one lock (a pool's snapshot).
  std::vector<int32_t> refs_of(const std::vector<int32_t>& of) const;
  int32_t n_spare() const;
  int32_t n_shared() const;  // slots referenced by more than one block

  // First violated invariant, or "": spare ⟺ refs 0, and the spares number the unclaimed slots
  // plus Σ (refs − 1).
  std::string check_invariants() const;

 private:
  void check_slot(int32_t slot, const char* what) const;  // lock held

  mutable std::mutex mu_;
  std::vector<int32_t> refs_;   // (n_slots) references
  std::vector<int32_t> spare_;  // slots with refs 0; LIFO, lowest on top at first
  int64_t claimed_ = 0;         // references held by pools' blocks: Σ refs
};

}  // namespace tokenfab
