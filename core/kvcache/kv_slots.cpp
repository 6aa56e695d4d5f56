#include "core/kvcache/kv_slots.h"

#include "core/common/error.h"

namespace tokenfab {

KvSlots::KvSlots(int32_t n_slots) {
  if (n_slots < 1)
    throw Error("kv cache: shared storage needs at least 1 slot, got " + std::to_string(n_slots));
  refs_.assign(static_cast<size_t>(n_slots), 0);
  spare_.reserve(static_cast<size_t>(n_slots));
  for (int32_t s = n_slots - 1; s >= 0; --s) spare_.push_back(s);
}

void KvSlots::check_slot(int32_t slot, const char* what) const {
  if (slot < 0 || slot >= n_slots())
    throw Error(std::string("kv cache: ") + what + " of slot " + std::to_string(slot) +
                ", outside the storage's " + std::to_string(n_slots()) + " slots");
}

std::vector<int32_t> KvSlots::claim(int32_t n) {
  std::lock_guard lock(mu_);
  // Spares owed to shared slots are not for claiming: claims stop at n_slots references.
  const int64_t unclaimed = static_cast<int64_t>(refs_.size()) - claimed_;
  if (n < 0 || n > unclaimed)
    throw Error("kv cache: a pool of " + std::to_string(n) + " blocks does not fit in the " +
                std::to_string(unclaimed) + " unclaimed slots of the shared storage");
  std::vector<int32_t> claimed(static_cast<size_t>(n));
  for (int32_t& s : claimed) {
    s = spare_.back();
    spare_.pop_back();
    refs_[static_cast<size_t>(s)] = 1;
  }
  claimed_ += n;
  return claimed;
}

void KvSlots::release(const std::vector<int32_t>& released) {
  std::lock_guard lock(mu_);
  for (const int32_t s : released) {
    check_slot(s, "release");
    int32_t& r = refs_[static_cast<size_t>(s)];
    if (r < 1) throw Error("kv cache: release of unreferenced slot " + std::to_string(s));
    if (--r == 0) spare_.push_back(s);
    --claimed_;
  }
}

int32_t KvSlots::make_private(int32_t slot) {
  std::lock_guard lock(mu_);
  check_slot(slot, "make_private");
  int32_t& r = refs_[static_cast<size_t>(slot)];
  if (r < 1) throw Error("kv cache: make_private of unreferenced slot " + std::to_string(slot));
  if (r == 1) return slot;
  // Shared, so Σ (refs − 1) ≥ 1 and a spare exists (see the invariant).
  if (spare_.empty()) throw Error("kv cache: shared slots without a spare (bookkeeping broken)");
  --r;
  const int32_t fresh = spare_.back();
  spare_.pop_back();
  refs_[static_cast<size_t>(fresh)] = 1;
  return fresh;
}

void KvSlots::share(int32_t own, int32_t shared) {
  std::lock_guard lock(mu_);
  check_slot(own, "share");
  check_slot(shared, "share");
  if (own == shared) return;
  int32_t& r_own = refs_[static_cast<size_t>(own)];
  int32_t& r_shared = refs_[static_cast<size_t>(shared)];
  if (r_own < 1 || r_shared < 1)
    throw Error("kv cache: share of slot " + std::to_string(shared) + " by the block of slot " +
                std::to_string(own) + ": " + (r_own < 1 ? "the latter" : "the former") +
                " is not referenced");
  ++r_shared;
  if (--r_own == 0) spare_.push_back(own);
}

int32_t KvSlots::refs(int32_t slot) const {
  std::lock_guard lock(mu_);
  check_slot(slot, "refs");
  return refs_[static_cast<size_t>(slot)];
}

std::vector<int32_t> KvSlots::refs_of(const std::vector<int32_t>& of) const {
  std::lock_guard lock(mu_);
  std::vector<int32_t> out(of.size());
  for (size_t i = 0; i < of.size(); ++i) {
    check_slot(of[i], "refs");
    out[i] = refs_[static_cast<size_t>(of[i])];
  }
  return out;
}

int32_t KvSlots::n_spare() const {
  std::lock_guard lock(mu_);
  return static_cast<int32_t>(spare_.size());
}

int32_t KvSlots::n_shared() const {
  std::lock_guard lock(mu_);
  int32_t n = 0;
  for (const int32_t r : refs_) n += r > 1;
  return n;
}

std::string KvSlots::check_invariants() const {
  std::lock_guard lock(mu_);
  std::vector<uint8_t> listed(refs_.size(), 0);
  for (const int32_t s : spare_) {
    if (s < 0 || s >= n_slots()) return "spare list holds slot " + std::to_string(s);
    if (listed[static_cast<size_t>(s)]++) return "slot " + std::to_string(s) + " spare twice";
  }
  int64_t extra_refs = 0;
  for (size_t s = 0; s < refs_.size(); ++s) {
    const int32_t r = refs_[s];
    if (r < 0) return "slot " + std::to_string(s) + " has negative references";
    if ((r == 0) != (listed[s] != 0))
      return "slot " + std::to_string(s) +
             (r == 0 ? " unreferenced but not spare" : " referenced but spare");
    if (r > 0) extra_refs += r - 1;
  }
  // Each block holds one reference: referenced slots = claimed − Σ (refs − 1).
  const int64_t want = static_cast<int64_t>(refs_.size()) - claimed_ + extra_refs;
  if (static_cast<int64_t>(spare_.size()) != want)
    return std::to_string(spare_.size()) + " spare slots, expected " + std::to_string(want) + " (" +
           std::to_string(claimed_) + " claimed, " + std::to_string(extra_refs) +
           " shared references)";
  return {};
}

}  // namespace tokenfab
