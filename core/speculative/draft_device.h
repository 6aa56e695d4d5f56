#pragma once
// What the proposer (proposer.h) needs of a device: its draft heads' batched proposals on the
// device's own compute. core/device's Device provides it (the CPU's host threads, a GPU's kernels).

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "core/model/llama_model.h"

namespace tokenfab {

struct DraftHead;  // draft_head.h

// One request's Medusa proposal: its head (type medusa), the hidden state its drafts start
// from (n_embd floats in host memory), and how many of the head's levels it drafts.
struct MedusaProposal {
  std::shared_ptr<const DraftHead> head;
  const float* hidden = nullptr;
  int32_t levels = 0;
};

// One request's mtp drafts: its head (type mtp), the hidden state of its last token's row
// (n_embd floats in host memory), that token, and the tree to draft: every node of depth l gets
// its widths[l] best tokens as children (all 1: a chain), at most max_nodes nodes in level order
// (DraftHead::mtp_propose); with best_first, the max_nodes nodes of that tree with the highest
// path probability instead (DraftHead::mtp_propose_best_first).
struct MtpProposal {
  std::shared_ptr<const DraftHead> head;
  const float* hidden = nullptr;
  int32_t last = 0;
  std::vector<int32_t> widths;
  int32_t max_nodes = 0;
  bool best_first = false;
};

class DraftDevice {
 public:
  virtual ~DraftDevice() = default;
  virtual int threads() const = 0;
  virtual const LlamaModel& model() const = 0;
  // best[i]: the wanted[i] best tokens of Medusa level row i (proposal 0's levels, then 1's, …).
  virtual void medusa_top(std::span<const MedusaProposal> proposals,
                          std::span<const int32_t> wanted,
                          std::vector<std::vector<int32_t>>& best) = 0;
  // Whether mtp_propose drafts on the device; false: the proposer drafts mtp heads on the host.
  virtual bool mtp_on_device() const = 0;
  virtual void mtp_propose(std::span<const MtpProposal> proposals,
                           std::vector<std::vector<int32_t>>& drafts,
                           std::vector<std::vector<int32_t>>& parents) = 0;
  // fn(i) for i in [0, n) on the device's host threads.
  virtual void parallel_for(int64_t n, const std::function<void(int64_t)>& fn) = 0;
};

}  // namespace tokenfab
