// The CUDA Device's draft support (cuda_model_impl.h): the layer taps (set_draft_taps, and the
// tapped rows a pass keeps: enqueue_taps, gather_logit_rows), the draft heads' weights on the GPU
// (draft_weights, evict_draft_heads), and Medusa proposals (medusa_top). mtp drafting is in
// cuda_model_mtp.cpp.

#if TOKENFAB_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/common/error.h"
#include "core/device/cuda_model_impl.h"
#include "core/model/transformer_pass.h"
#include "kernels/cpu/quant_types.h"
#include "kernels/cuda/draft_residual.cuh"
#include "kernels/cuda/gather_rows.cuh"
#include "kernels/cuda/rms_norm.cuh"

namespace tokenfab::cuda_backend {

void CudaDevice::enqueue_taps(int64_t layer, int64_t n_logit, bool gathered) {
  const auto at = std::find(taps_.begin(), taps_.end(), static_cast<int32_t>(layer));
  if (at == taps_.end()) return;
  const int64_t d = hp_.n_embd;
  float* out = taps_rows_.get() + (at - taps_.begin()) * n_logit * d;
  if (gathered) gather_logit_rows(n_logit);
  kernels::launch_rms_norm(gathered ? xg_.get() : x_.get(), ones_.get(), out, n_logit, d,
                           hp_.rms_eps, stream_, overlap_);
}

void CudaDevice::gather_logit_rows(int64_t n_logit) {
  // Each f32 row as 2 · n_embd 16-bit halves: a plain copy, bit for bit.
  kernels::launch_gather_rows_u16(reinterpret_cast<const uint16_t*>(x_.get()), 2 * hp_.n_embd,
                                  logit_rows_.get(), n_logit,
                                  reinterpret_cast<uint16_t*>(xg_.get()), stream_);
}

bool CudaDevice::set_draft_taps(bool on) {
  std::vector<int32_t> layers = on ? draft_tap_layers(hp_.n_layer) : std::vector<int32_t>{};
  if (!layers.empty() && ones_.size() == 0) {
    check(cudaSetDevice(spec_.index), name_, "selecting the device");
    const std::vector<float> ones(static_cast<size_t>(hp_.n_embd), 1.0f);
    ones_.reserve(ones.size(), name_, "layer taps");
    // On the device's stream, which the taps' kernels run on (a pageable source is staged before
    // the call returns).
    check(cudaMemcpyAsync(ones_.get(), ones.data(), ones.size() * sizeof(float),
                          cudaMemcpyHostToDevice, stream_),
          name_, "uploading the layer taps' norm");
  }
  if (layers != taps_) drop_graphs();  // a captured step keeps the layers it tapped
  taps_ = std::move(layers);
  return !taps_.empty();
}

const CudaDevice::DraftWeights& CudaDevice::draft_weights(
    const std::shared_ptr<const DraftHead>& head) {
  if (auto it = draft_heads_.find(head.get());
      it != draft_heads_.end() && it->second.head == head) {
    it->second.last_used = ++draft_uses_;
    return it->second;
  }
  // Built aside and entered only once complete, so a failed upload leaves no half entry.
  DraftWeights kept;
  size_t w_floats = 0, b_floats = 0;
  for (const auto& w : head->w) w_floats += w.size();
  for (const auto& b : head->b) b_floats += b.size();
  kept.w.reserve(w_floats, name_, "a draft head's weights");
  kept.b.reserve(b_floats, name_, "a draft head's weights");
  size_t w_at = 0, b_at = 0;
  for (size_t k = 0; k < head->w.size(); ++k) {
    check(cudaMemcpyAsync(kept.w.get() + w_at, head->w[k].data(), head->w[k].size() * sizeof(float),
                          cudaMemcpyHostToDevice, stream_),
          name_, "uploading a draft head");
    check(cudaMemcpyAsync(kept.b.get() + b_at, head->b[k].data(), head->b[k].size() * sizeof(float),
                          cudaMemcpyHostToDevice, stream_),
          name_, "uploading a draft head");
    w_at += head->w[k].size();
    b_at += head->b[k].size();
  }
  if (head->is_mtp()) {
    const size_t n = head->vocab.size();
    kept.vocab.reserve(n, name_, "a draft head's vocabulary");
    kept.vocab_rows.reserve(n * static_cast<size_t>(hp_.n_embd), name_,
                            "a draft head's vocabulary");
    check(cudaMemcpyAsync(kept.vocab.get(), head->vocab.data(), n * sizeof(int32_t),
                          cudaMemcpyHostToDevice, stream_),
          name_, "uploading a draft head's vocabulary");
    launch(name_, "gathering a draft vocabulary's LM-head rows", [&] {
      kernels::launch_gather_rows_u16(w_->lm_head.get(), hp_.n_embd, kept.vocab.get(),
                                      static_cast<int64_t>(n), kept.vocab_rows.get(), stream_);
    });
    if (!head->fuse_w.empty()) {
      // W_f rounded to bf16 here (the products' weight type), uploaded on the stream its
      // products run on, as the vocabulary is (a pageable source is staged before the call
      // returns).
      std::vector<uint16_t> fuse(head->fuse_w.size());
      std::transform(head->fuse_w.begin(), head->fuse_w.end(), fuse.begin(),
                     [](float x) { return kernels::fp32_to_bf16(x); });
      kept.fuse_w.reserve(fuse.size(), name_, "a draft head's weights");
      check(cudaMemcpyAsync(kept.fuse_w.get(), fuse.data(), fuse.size() * sizeof(uint16_t),
                            cudaMemcpyHostToDevice, stream_),
            name_, "uploading a draft head's layer-tap fusion");
    }
  }
  kept.head = head;
  kept.last_used = ++draft_uses_;
  return draft_heads_[head.get()] = std::move(kept);
}

void CudaDevice::evict_draft_heads() {
  // After a call's work has finished (its sync): no kernel reads an evicted head any more.
  while (draft_heads_.size() > kMaxHeadsKept) {
    auto oldest = draft_heads_.begin();
    for (auto it = draft_heads_.begin(); it != draft_heads_.end(); ++it)
      if (it->second.last_used < oldest->second.last_used) oldest = it;
    draft_heads_.erase(oldest);
  }
}

void CudaDevice::medusa_top(std::span<const MedusaProposal> proposals,
                            std::span<const int32_t> wanted,
                            std::vector<std::vector<int32_t>>& best) {
  check(cudaSetDevice(spec_.index), name_, "selecting the device");
  const auto d = static_cast<size_t>(hp_.n_embd);
  int64_t rows = 0;
  for (const MedusaProposal& p : proposals) rows += p.levels;
  best.clear();
  if (static_cast<int64_t>(wanted.size()) != rows)
    throw Error(name_ + ": " + std::to_string(wanted.size()) + " top-token counts for " +
                std::to_string(rows) + " Medusa levels");
  if (rows <= 0) return;
  reserve_rows(1, std::max(rows, static_cast<int64_t>(proposals.size())), 1);
  // xg_: one hidden state per proposal. Row j of the levels reads its level's W and b and its
  // proposal's hidden state; the residual outputs z go to xgn_, the LM head's input.
  std::vector<const float*> h_w, h_b;
  std::vector<int32_t> h_src;
  for (size_t i = 0; i < proposals.size(); ++i) {
    const MedusaProposal& p = proposals[i];
    if (p.head->is_mtp() || p.head->info.n_embd != hp_.n_embd || p.levels > p.head->n_heads())
      throw Error(name_ + ": draft head '" + p.head->info.name + "' cannot propose " +
                  std::to_string(p.levels) + " Medusa levels for this model");
    const DraftWeights& weights = draft_weights(p.head);
    check(cudaMemcpyAsync(xg_.get() + i * d, p.hidden, d * sizeof(float), cudaMemcpyHostToDevice,
                          stream_),
          name_, "uploading draft states");
    for (int32_t level = 0; level < p.levels; ++level) {
      h_w.push_back(weights.w.get() + static_cast<size_t>(level) * d * d);
      h_b.push_back(weights.b.get() + static_cast<size_t>(level) * d);
      h_src.push_back(static_cast<int32_t>(i));
    }
  }
  medusa_w_.reserve(h_w.size(), name_, "draft-head rows");
  medusa_b_.reserve(h_b.size(), name_, "draft-head rows");
  medusa_src_.reserve(h_src.size(), name_, "draft-head rows");
  check(cudaMemcpyAsync(medusa_w_.get(), h_w.data(), h_w.size() * sizeof(h_w[0]),
                        cudaMemcpyHostToDevice, stream_),
        name_, "uploading draft-head rows");
  check(cudaMemcpyAsync(medusa_b_.get(), h_b.data(), h_b.size() * sizeof(h_b[0]),
                        cudaMemcpyHostToDevice, stream_),
        name_, "uploading draft-head rows");
  check(cudaMemcpyAsync(medusa_src_.get(), h_src.data(), h_src.size() * sizeof(h_src[0]),
                        cudaMemcpyHostToDevice, stream_),
        name_, "uploading draft-head rows");
  launch(name_, "Medusa residual blocks", [&] {
    kernels::launch_draft_residual(medusa_w_.get(), medusa_b_.get(), xg_.get(), medusa_src_.get(),
                                   nullptr, xgn_.get(), rows, hp_.n_embd, stream_);
  });
  top_of_lm_head(rows, wanted, best);  // ends with the stream's sync
  evict_draft_heads();
}

}  // namespace tokenfab::cuda_backend

#endif  // TOKENFAB_HAVE_CUDA
