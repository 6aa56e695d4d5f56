// The CUDA Device's layered kernels (cuda_model_impl.h): linear (a product through the few-row
// GEMV or cuBLASLt), a step's layers one launch after another (enqueue_layers): the GEMV layers
// of few-row steps, the GEMM layers of many-row steps (enqueue_gemm_layer), the layers of the
// families that differ from plain Llama (enqueue_family_layer and its RoPE tables), and the
// paged attention both kinds of layer share (enqueue_attention).

#if TOKENFAB_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "core/device/cuda_model_impl.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/add_inplace.cuh"
#include "kernels/cuda/f32_to_bf16.cuh"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/glu_rows.cuh"
#include "kernels/cuda/kv_store.cuh"
#include "kernels/cuda/prepare_qk.cuh"
#include "kernels/cuda/rms_norm.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/silu_mul.cuh"

namespace tokenfab::cuda_backend {

void CudaDevice::linear(const float* a, const uint16_t* w, float* c, int64_t m, int64_t n,
                        int64_t k, const CudaBlocks* blocks) {
  launch(name_, "linear", [&] {
    if (kernels::gemv_supports(a, k, static_cast<int>(std::min<int64_t>(m, INT32_MAX)), w, k)) {
      // A few rows: the weights streamed once, no bf16 copy of a.
      kernels::GemvArgs g = kernels::gemv_product(a, k, static_cast<int>(m), w, n, k,
                                                  kernels::GemvEpilogue::kStore, c, n);
      g.overlap = overlap_;
      g.split_k = split_k_;
      if (blocks != nullptr) blocks->use_in(g);
      kernels::launch_gemv(g, stream_);
      return;
    }
    kernels::launch_f32_to_bf16(a, act16_.get(), m * k, stream_, overlap_);
    gemm_->bf16_nt(act16_.get(), w, c, m, n, k, stream_);
  });
}

void CudaDevice::enqueue_layers(int64_t n, int64_t n_logit, int64_t n_att_rows, bool has_paths,
                                int32_t max_keys, int64_t n_chunks, int32_t max_chunk_tokens,
                                bool gathered, bool taps) {
  const int32_t bs = kv_->block_size();
  const int64_t n_embd = hp_.n_embd, q_dim = hp_.q_dim(), kv_dim = hp_.kv_dim(), n_ff = hp_.n_ff;
  const int64_t qkv_dim = q_dim + 2 * kv_dim;
  const StepAttention att{n_att_rows, has_paths, max_keys, n_chunks, max_chunk_tokens};
  // A few rows (decode steps, short chunks) take our GEMVs: a layer is then the QKV product
  // with its norm, RoPE and KV store, attention, and three more products with their norm,
  // SwiGLU and residual adds built in — five launches (six with a prefill chunk) where the
  // cuBLAS path takes ten (fourteen without fused_epilogues_).
  const bool few_rows =
      n <= kernels::kGemvMaxRows &&
      kernels::gemv_supports(x_.get(), n_embd, static_cast<int>(n), w_->layers[0].wqkv.get(),
                             n_embd) &&
      kernels::gemv_supports(gate_up_.get(), n_ff, static_cast<int>(n), w_->layers[0].w_down.get(),
                             n_ff) &&
      kernels::gemv_supports(att_.get(), q_dim, static_cast<int>(n), w_->layers[0].wo.get(), q_dim);
  for (int64_t layer = 0; layer < hp_.n_layer; ++layer) {
    const CudaLayer& w = w_->layers[static_cast<size_t>(layer)];
    if (family_) {
      enqueue_family_layer(layer, n, att);
      if (taps) enqueue_taps(layer, n_logit, gathered);
      continue;
    }
    if (!few_rows) {
      enqueue_gemm_layer(layer, n, att);
      if (taps) enqueue_taps(layer, n_logit, gathered);
      continue;
    }
    const int m = static_cast<int>(n);
    // q, k, v = wqkv · norm(x), RoPE on q and k, k and v into the pool.
    kernels::GemvArgs g =
        kernels::gemv_product(x_.get(), n_embd, m, w.wqkv.get(), qkv_dim, n_embd,
                              kernels::GemvEpilogue::kRopeKv, qkv_.get(), qkv_dim);
    g.norm = w.attn_norm.get();
    g.eps = hp_.rms_eps;
    g.overlap = overlap_;
    g.split_k = split_k_;
    w.qkv_blocks.use_in(g);
    g.rope = rope_.get();
    g.kv_slots = slots_.get();
    g.q_dim = static_cast<int>(q_dim);
    g.kv_dim = static_cast<int>(kv_dim);
    g.head_dim = static_cast<int>(hp_.head_dim);
    g.rot_dim = static_cast<int>(hp_.rot_dim);
    g.n_kv_head = static_cast<int>(hp_.n_kv_head);
    g.block_size = bs;
    g.k_pool = kv_->k(layer);
    g.v_pool = kv_->v(layer);
    kernels::launch_gemv(g, stream_);
    enqueue_attention(layer, att, att_.get(), nullptr);
    // x += wo · att
    kernels::GemvArgs o = kernels::gemv_product(att_.get(), q_dim, m, w.wo.get(), n_embd, q_dim,
                                                kernels::GemvEpilogue::kAdd, x_.get(), n_embd);
    o.overlap = overlap_;
    o.split_k = split_k_;
    w.wo_blocks.use_in(o);
    kernels::launch_gemv(o, stream_);
    // h = silu(gate · norm(x)) · (up · norm(x)), into gate_up_
    kernels::GemvArgs f =
        kernels::gemv_product(x_.get(), n_embd, m, w.w_gate_up.get(), 2 * n_ff, n_embd,
                              kernels::GemvEpilogue::kSwiGlu, gate_up_.get(), n_ff);
    f.norm = w.ffn_norm.get();
    f.eps = hp_.rms_eps;
    f.overlap = overlap_;
    f.split_k = split_k_;
    w.gate_up_blocks.use_in(f);
    kernels::launch_gemv(f, stream_);
    // x += w_down · h
    kernels::GemvArgs down =
        kernels::gemv_product(gate_up_.get(), n_ff, m, w.w_down.get(), n_embd, n_ff,
                              kernels::GemvEpilogue::kAdd, x_.get(), n_embd);
    down.overlap = overlap_;
    down.split_k = split_k_;
    w.down_blocks.use_in(down);
    kernels::launch_gemv(down, stream_);
    if (taps) enqueue_taps(layer, n_logit, gathered);
  }
}

void CudaDevice::enqueue_attention(int64_t layer, const StepAttention& a, float* out,
                                   uint16_t* out16) {
  const int64_t q_dim = hp_.q_dim(), qkv_dim = q_dim + 2 * hp_.kv_dim();
  // 1/√head_dim unless the family has its own (the same float for plain Llama as before).
  const float scale = hp_.attention_scale();
  kernels::CudaPagedKv pool{kv_->k(layer), kv_->v(layer), kv_->block_size(), hp_.n_kv_head,
                            hp_.head_dim};
  // The layer's window and soft-cap (0 for plain Llama: the kernels of the last GPU run).
  pool.window = static_cast<int32_t>(
      std::min<int64_t>(hp_.window(layer), std::numeric_limits<int32_t>::max()));
  pool.softcap = hp_.arch.attention_softcap;
  kernels::launch_paged_decode_attention(pool, att_rows_.get(), a.n_att_rows,
                                         a.has_paths ? paths_.get() : nullptr, a.max_keys,
                                         qkv_.get(), qkv_dim, out, q_dim, hp_.n_head, scale,
                                         attention_workspace(), stream_, overlap_, out16);
  kernels::launch_paged_prefill_attention(pool, chunks_.get(), a.n_chunks, a.max_chunk_tokens,
                                          qkv_.get(), qkv_dim, out, q_dim, hp_.n_head, scale,
                                          stream_, overlap_, out16, prompt_kernel_);
}

void CudaDevice::enqueue_gemm_layer(int64_t layer, int64_t n, const StepAttention& att) {
  const CudaLayer& w = w_->layers[static_cast<size_t>(layer)];
  const int32_t bs = kv_->block_size();
  const int64_t n_embd = hp_.n_embd, q_dim = hp_.q_dim(), kv_dim = hp_.kv_dim(), n_ff = hp_.n_ff;
  const int64_t qkv_dim = q_dim + 2 * kv_dim;
  // Attention block: norm (to bf16), QKV in one GEMM, RoPE on q and k together (adjacent in the
  // row), K/V into the pool, attention, output projection, residual add. The kernels between the
  // GEMMs may overlap the kernel before them (overlap_), as the GEMVs do.
  kernels::launch_rms_norm_bf16(x_.get(), w.attn_norm.get(), act16_.get(), n, n_embd, hp_.rms_eps,
                                stream_, overlap_);
  gemm_->bf16_nt(act16_.get(), w.wqkv.get(), qkv_.get(), n, qkv_dim, n_embd, stream_);
  if (fused_epilogues_) {
    // RoPE and the KV store in one launch; the attention writes its rows in bf16, the o GEMM's
    // input; x += wo · att in the GEMM's epilogue.
    kernels::RopeKvStore store;
    store.k_offset = q_dim;
    store.v_offset = q_dim + kv_dim;
    store.kv_slots = slots_.get();
    store.n_kv_head = static_cast<int>(hp_.n_kv_head);
    store.block_size = bs;
    store.k_pool = kv_->k(layer);
    store.v_pool = kv_->v(layer);
    kernels::launch_rope(qkv_.get(), positions_.get(), n, qkv_dim, hp_.n_head + hp_.n_kv_head,
                         hp_.head_dim, hp_.rot_dim, hp_.rope_base, stream_, overlap_, &store);
    enqueue_attention(layer, att, nullptr, act16_.get());
    gemm_->bf16_nt(act16_.get(), w.wo.get(), x_.get(), n, n_embd, q_dim, stream_, true);
  } else {
    // As on the last GPU run: RoPE, then the KV store, the attention in f32, its conversion to
    // bf16 and the o GEMM into proj_ (linear), then the residual add.
    kernels::launch_rope(qkv_.get(), positions_.get(), n, qkv_dim, hp_.n_head + hp_.n_kv_head,
                         hp_.head_dim, hp_.rot_dim, hp_.rope_base, stream_, overlap_);
    kernels::launch_kv_store_rows(qkv_.get() + q_dim, qkv_.get() + q_dim + kv_dim, qkv_dim,
                                  slots_.get(), n, static_cast<int>(hp_.n_kv_head),
                                  static_cast<int>(hp_.head_dim), bs, kv_->k(layer), kv_->v(layer),
                                  stream_, overlap_);
    enqueue_attention(layer, att, att_.get(), nullptr);
    linear(att_.get(), w.wo.get(), proj_.get(), n, n_embd, q_dim);
    kernels::launch_add_inplace(x_.get(), proj_.get(), n * n_embd, stream_, overlap_);
  }
  // FFN block: norm (to bf16), gate and up in one GEMM, SwiGLU (to bf16), down, residual add.
  kernels::launch_rms_norm_bf16(x_.get(), w.ffn_norm.get(), act16_.get(), n, n_embd, hp_.rms_eps,
                                stream_, overlap_);
  gemm_->bf16_nt(act16_.get(), w.w_gate_up.get(), gate_up_.get(), n, 2 * n_ff, n_embd, stream_);
  kernels::launch_silu_mul_rows_bf16(gate_up_.get(), n, n_ff, act16_.get(), stream_, overlap_);
  if (fused_epilogues_) {
    gemm_->bf16_nt(act16_.get(), w.w_down.get(), x_.get(), n, n_embd, n_ff, stream_, true);
  } else {
    gemm_->bf16_nt(act16_.get(), w.w_down.get(), proj_.get(), n, n_embd, n_ff, stream_);
    kernels::launch_add_inplace(x_.get(), proj_.get(), n * n_embd, stream_, overlap_);
  }
}

void CudaDevice::enqueue_family_layer(int64_t layer, int64_t n, const StepAttention& att) {
  const CudaLayer& w = w_->layers[static_cast<size_t>(layer)];
  const int64_t n_embd = hp_.n_embd, q_dim = hp_.q_dim(), kv_dim = hp_.kv_dim(), n_ff = hp_.n_ff;
  const int64_t qkv_dim = q_dim + 2 * kv_dim;
  // Attention block: norm (into proj_), QKV product, the family's Q/K preparation and the KV
  // store, attention, o product (into proj_), post-norm, residual add.
  kernels::launch_rms_norm(x_.get(), w.attn_norm.get(), proj_.get(), n, n_embd, hp_.rms_eps,
                           stream_, overlap_);
  linear(proj_.get(), w.wqkv.get(), qkv_.get(), n, qkv_dim, n_embd, &w.qkv_blocks);
  kernels::PrepareQkArgs p;
  p.qkv = qkv_.get();
  p.rows = n;
  p.row_stride = qkv_dim;
  p.n_head = hp_.n_head;
  p.n_kv_head = hp_.n_kv_head;
  p.head_dim = hp_.head_dim;
  p.rot_dim = hp_.rot_dim;
  p.halves = hp_.arch.rope_style == RopeStyle::kHalves;
  p.bias = w.qkv_bias.get();  // null when the family has none
  p.q_norm = w.q_norm.get();
  p.k_norm = w.k_norm.get();
  p.eps = hp_.rms_eps;
  const int rope = hp_.arch.layers.empty() ? 0 : hp_.arch.layers[static_cast<size_t>(layer)].rope;
  if (hp_.rot_dim > 0) p.rope = rope_.get() + rope * n * hp_.rot_dim;  // family_rope_tables
  p.kv_slots = slots_.get();
  p.block_size = kv_->block_size();
  p.k_pool = kv_->k(layer);
  p.v_pool = kv_->v(layer);
  kernels::launch_prepare_qk(p, stream_, overlap_);
  enqueue_attention(layer, att, att_.get(), nullptr);
  linear(att_.get(), w.wo.get(), proj_.get(), n, n_embd, q_dim, &w.wo_blocks);
  add_sublayer(w.post_attn_norm, n);
  // FFN block: norm (into proj_), gate and up in one product, the gated activation (into ffn_),
  // down (into proj_), post-norm, residual add.
  kernels::launch_rms_norm(x_.get(), w.ffn_norm.get(), proj_.get(), n, n_embd, hp_.rms_eps, stream_,
                           overlap_);
  linear(proj_.get(), w.w_gate_up.get(), gate_up_.get(), n, 2 * n_ff, n_embd, &w.gate_up_blocks);
  kernels::launch_glu_rows(gate_up_.get(), n, n_ff,
                           hp_.arch.activation == FfnActivation::kGeluTanh
                               ? kernels::GluActivation::kGeluTanh
                               : kernels::GluActivation::kSilu,
                           ffn_.get(), stream_, overlap_);
  linear(ffn_.get(), w.w_down.get(), proj_.get(), n, n_embd, n_ff, &w.down_blocks);
  add_sublayer(w.post_ffn_norm, n);
}

void CudaDevice::add_sublayer(const DeviceArray<float>& post_norm, int64_t n) {
  const int64_t n_embd = hp_.n_embd;
  if (post_norm.get() != nullptr)
    kernels::launch_rms_norm(proj_.get(), post_norm.get(), proj_.get(), n, n_embd, hp_.rms_eps,
                             stream_, overlap_);
  kernels::launch_add_inplace(x_.get(), proj_.get(), n * n_embd, stream_, overlap_);
}

void CudaDevice::family_rope_tables(int64_t n) {
  if (hp_.rot_dim <= 0) return;
  const auto half = static_cast<size_t>(hp_.rot_dim / 2);
  const size_t per_table = static_cast<size_t>(n) * 2 * half;
  h_rope_.resize(hp_.arch.ropes.size() * per_table);
  for (size_t t = 0; t < hp_.arch.ropes.size(); ++t) {
    const RopeSpec& rope = hp_.arch.ropes[t];
    for (int64_t i = 0; i < n; ++i) {
      float* row = h_rope_.data() + t * per_table + static_cast<size_t>(i) * 2 * half;
      kernels::rope_table_scaled(
          rows_.positions[static_cast<size_t>(i)], hp_.rot_dim, rope.base, rope.pos_scale,
          rope.factors.empty() ? nullptr : rope.factors.data(), rope.attn_factor, row, row + half);
    }
  }
}

}  // namespace tokenfab::cuda_backend

#endif  // TOKENFAB_HAVE_CUDA
