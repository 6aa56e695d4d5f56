// The CUDA Device's fused decode layers (cuda_model_impl.h; CudaOptions::fused_layers): the
// cooperative kernel's layer table (prepare_fused_layers), its launch over a step's rows
// (enqueue_fused_layers), and its phase clock read back (fused_phase_times).

#if TOKENFAB_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <vector>

#include "core/device/cuda_model_impl.h"

namespace tokenfab::cuda_backend {

void CudaDevice::prepare_fused_layers(int64_t n_logit, bool taps) {
  std::vector<kernels::DecodeLayer> table(static_cast<size_t>(hp_.n_layer));
  for (int64_t layer = 0; layer < hp_.n_layer; ++layer) {
    const CudaLayer& w = w_->layers[static_cast<size_t>(layer)];
    kernels::DecodeLayer& l = table[static_cast<size_t>(layer)];
    l.attn_norm = w.attn_norm.get();
    l.ffn_norm = w.ffn_norm.get();
    l.wqkv = w.wqkv.get();
    l.wo = w.wo.get();
    l.w_gate_up = w.w_gate_up.get();
    l.w_down = w.w_down.get();
    l.k_pool = kv_->k(layer);
    l.v_pool = kv_->v(layer);
    const auto at = std::find(taps_.begin(), taps_.end(), static_cast<int32_t>(layer));
    if (taps && at != taps_.end())
      l.tap = taps_rows_.get() + (at - taps_.begin()) * n_logit * hp_.n_embd;
  }
  const auto same = [](const kernels::DecodeLayer& a, const kernels::DecodeLayer& b) {
    return a.attn_norm == b.attn_norm && a.ffn_norm == b.ffn_norm && a.wqkv == b.wqkv &&
           a.wo == b.wo && a.w_gate_up == b.w_gate_up && a.w_down == b.w_down &&
           a.k_pool == b.k_pool && a.v_pool == b.v_pool && a.tap == b.tap;
  };
  if (std::equal(table.begin(), table.end(), h_fused_layers_.begin(), h_fused_layers_.end(), same))
    return;
  // A graph holds the table's address, not its contents: a new table is uploaded in place,
  // in stream order after the steps that read the old one.
  if (fused_layers_.reserve(table.size(), name_, "the fused layers' table")) drop_graphs();
  check(cudaMemcpyAsync(fused_layers_.get(), table.data(), table.size() * sizeof(table[0]),
                        cudaMemcpyHostToDevice, stream_),
        name_, "uploading the fused layers' table");
  h_fused_layers_ = std::move(table);
}

void CudaDevice::enqueue_fused_layers(int64_t n, int64_t n_logit, bool has_paths, int32_t max_keys,
                                      bool gathered, bool taps) {
  kernels::DecodeLayersArgs a;
  a.layers = fused_layers_.get();
  a.n_layer = static_cast<int>(hp_.n_layer);
  a.m = static_cast<int>(n);
  a.tensor_cores = fused_tensor_cores_;
  a.n_embd = static_cast<int>(hp_.n_embd);
  a.n_head = static_cast<int>(hp_.n_head);
  a.n_kv_head = static_cast<int>(hp_.n_kv_head);
  a.head_dim = static_cast<int>(hp_.head_dim);
  a.rot_dim = static_cast<int>(hp_.rot_dim);
  a.n_ff = static_cast<int>(hp_.n_ff);
  a.block_size = kv_->block_size();
  a.eps = hp_.rms_eps;
  a.scale = 1.0f / std::sqrt(static_cast<float>(hp_.head_dim));
  a.x = x_.get();
  a.qkv = qkv_.get();
  a.att = att_.get();
  a.ffn = gate_up_.get();
  a.rope = rope_.get();
  a.kv_slots = slots_.get();
  a.rows = att_rows_.get();
  a.paths = has_paths ? paths_.get() : nullptr;
  a.max_keys = max_keys;
  // The taps' pointers are in the layer table (prepare_fused_layers); without taps none is set.
  a.n_logit = taps ? static_cast<int>(n_logit) : 0;
  a.logit_rows = gathered ? logit_rows_.get() : nullptr;
  a.partials = workspace_.get();
  a.partial_floats = static_cast<int64_t>(workspace_.size());
  a.counts = split_counts_.get();
  a.count_ints = static_cast<int64_t>(split_counts_.size());
  a.barrier = fused_barrier_.get();
  a.phase_ns = fused_clock_.get();
  kernels::launch_decode_layers(a, fused_grid_, stream_);
}

std::optional<FusedPhaseTimes> CudaDevice::fused_phase_times() {
  if (fused_grid_ == 0) return std::nullopt;
  cudaSetDevice(spec_.index);
  std::array<unsigned long long, kernels::kDecodeLayersClockSlots> ns{};
  check(cudaMemcpyAsync(ns.data(), fused_clock_.get(), sizeof(ns), cudaMemcpyDeviceToHost, stream_),
        name_, "reading the fused layers' clock");
  check(cudaMemsetAsync(fused_clock_.get(), 0, sizeof(ns), stream_), name_,
        "clearing the fused layers' clock");
  sync("reading the fused layers' clock");
  const auto steps = static_cast<int64_t>(ns[kernels::kDecodeLayersLaunchSlot]);
  if (steps == 0) return std::nullopt;
  const auto us = [&](int slot) {
    return static_cast<double>(ns[static_cast<size_t>(slot)]) / 1e3 / static_cast<double>(steps);
  };
  return FusedPhaseTimes{
      steps, us(0), us(1), us(2), us(3), us(4), us(kernels::kDecodeLayersTailSlot)};
}

}  // namespace tokenfab::cuda_backend

#endif  // TOKENFAB_HAVE_CUDA
