#include "core/model/transformer_pass.h"

#include <algorithm>

#include "core/common/error.h"
#include "kernels/cpu/ops.h"

namespace tokenfab {

using kernels::MatmulJob;
using kernels::ThreadPool;

TransformerPass::TransformerPass(const LlamaModel& model, ThreadPool& pool)
    : model_(model), hp_(model.hparams()), pool_(pool) {}

void TransformerPass::reserve_rows(int64_t n) {
  if (n <= rows_) return;
  const auto c = static_cast<size_t>(n);
  x_.resize(c * hp_.n_embd);
  xb_.resize(c * hp_.n_embd);
  q_.resize(c * hp_.q_dim());
  k_.resize(c * hp_.kv_dim());
  v_.resize(c * hp_.kv_dim());
  att_.resize(c * hp_.q_dim());
  gate_.resize(c * hp_.n_ff);
  up_.resize(c * hp_.n_ff);
  rope_cos_.resize(hp_.arch.ropes.size() * c * (hp_.rot_dim / 2));
  rope_sin_.resize(hp_.arch.ropes.size() * c * (hp_.rot_dim / 2));
  rows_ = n;
}

template <typename Fn>
void TransformerPass::for_rows(int64_t n, Fn&& fn) {
  if (n < kParallelRows) {
    fn(int64_t{0}, n);
    return;
  }
  pool_.run([&](int t, int nt) {
    int64_t b, e;
    ThreadPool::split(n, 1, t, nt, b, e);
    if (b < e) fn(b, e);
  });
}

void TransformerPass::norm_rows(const float* in, const std::vector<float>& w, float* out,
                                int64_t n) {
  for_rows(n, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      kernels::rms_norm(in + r * hp_.n_embd, w.data(), out + r * hp_.n_embd, hp_.n_embd,
                        hp_.rms_eps);
  });
}

void TransformerPass::add_rows(float* x, const float* y, int64_t n) {
  for_rows(n, [&](int64_t b, int64_t e) {
    kernels::add_inplace(x + b * hp_.n_embd, y + b * hp_.n_embd, (e - b) * hp_.n_embd);
  });
}

void TransformerPass::run(std::span<const int32_t> tokens, std::span<const int64_t> positions,
                          KvBackend& kv, std::span<const int64_t> logit_rows, float* logits,
                          bool keep_taps) {
  const auto n = static_cast<int64_t>(tokens.size());
  reserve_rows(n);
  const int half = hp_.rot_dim / 2;
  for (int64_t i = 0; i < n; ++i) {
    model_.embed(tokens[static_cast<size_t>(i)], x_.data() + i * hp_.n_embd);
    for (size_t r = 0; r < hp_.arch.ropes.size(); ++r) {
      const RopeSpec& rope = hp_.arch.ropes[r];
      const int64_t at = (static_cast<int64_t>(r) * n + i) * half;
      kernels::rope_table_scaled(positions[static_cast<size_t>(i)], hp_.rot_dim, rope.base,
                                 rope.pos_scale, rope.factors.empty() ? nullptr : rope.factors.data(),
                                 rope.attn_factor, rope_cos_.data() + at, rope_sin_.data() + at);
    }
  }
  const auto rows = static_cast<int64_t>(logit_rows.size());
  const auto n_taps = keep_taps ? static_cast<int64_t>(taps_.size()) : 0;
  tap_rows_.resize(static_cast<size_t>(rows * n_taps * hp_.n_embd));
  size_t tap = 0;
  for (int64_t layer = 0; layer < hp_.n_layer; ++layer) {
    attention_block(layer, n, kv);
    ffn_block(layer, n);
    if (tap < static_cast<size_t>(n_taps) && taps_[tap] == layer) {
      for (int64_t j = 0; j < rows; ++j)
        kernels::rms_norm(x_.data() + logit_rows[static_cast<size_t>(j)] * hp_.n_embd, ones_.data(),
                          tap_rows_.data() + (j * n_taps + static_cast<int64_t>(tap)) * hp_.n_embd,
                          hp_.n_embd, hp_.rms_eps);
      ++tap;
    }
  }
  if (logit_rows.empty()) return;

  // Final norm and the LM head, only for the rows whose logits are wanted (gathered in order).
  for (int64_t j = 0; j < rows; ++j)
    kernels::rms_norm(x_.data() + logit_rows[static_cast<size_t>(j)] * hp_.n_embd,
                      model_.output_norm().data(), xb_.data() + j * hp_.n_embd, hp_.n_embd,
                      hp_.rms_eps);
  const MatmulJob job = matmul_job(model_.output(), logits, hp_.n_vocab);
  kernels::matmul(pool_, {&job, 1}, xb_.data(), hp_.n_embd, hp_.n_embd, rows, scratch_);
  apply_final_softcap(logits, rows);
}

void TransformerPass::apply_final_softcap(float* logits, int64_t n) {
  const float cap = hp_.arch.final_softcap;
  if (cap <= 0) return;
  for_rows(n, [&](int64_t b, int64_t e) {
    kernels::softcap(logits + b * hp_.n_vocab, (e - b) * hp_.n_vocab, cap);
  });
}

std::vector<int32_t> draft_tap_layers(int64_t n_layer) {
  std::vector<int32_t> layers;
  for (const int64_t tenths : {5, 9}) {
    const auto layer = static_cast<int32_t>(
        std::clamp<int64_t>((n_layer * tenths + 5) / 10 - 1, 0, std::max<int64_t>(n_layer - 1, 0)));
    if (layers.empty() || layers.back() != layer) layers.push_back(layer);
  }
  return layers;
}

void TransformerPass::set_taps(std::vector<int32_t> layers) {
  for (size_t i = 0; i < layers.size(); ++i)
    if (layers[i] < 0 || layers[i] >= hp_.n_layer || (i > 0 && layers[i] <= layers[i - 1]))
      throw Error("transformer pass: tap layers must be ascending layers of the model");
  taps_ = std::move(layers);
  ones_.assign(static_cast<size_t>(hp_.n_embd), 1.0f);
}

void TransformerPass::lm_head(const float* z, int64_t n, float* logits) {
  if (n <= 0) return;
  const MatmulJob job = matmul_job(model_.output(), logits, hp_.n_vocab);
  kernels::matmul(pool_, {&job, 1}, z, hp_.n_embd, hp_.n_embd, n, scratch_);
  apply_final_softcap(logits, n);
}

void TransformerPass::rope_rows(float* x, int n_heads, int64_t stride, int rope, int64_t n) {
  const int half = hp_.rot_dim / 2;
  const bool halves = hp_.arch.rope_style == RopeStyle::kHalves;
  for_rows(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t at = (static_cast<int64_t>(rope) * n + i) * half;
      const float* c = rope_cos_.data() + at;
      const float* s = rope_sin_.data() + at;
      if (halves) {
        kernels::rope_halves(x + i * stride, n_heads, hp_.head_dim, hp_.rot_dim, c, s);
      } else {
        kernels::rope(x + i * stride, n_heads, hp_.head_dim, hp_.rot_dim, c, s);
      }
    }
  });
}

void TransformerPass::prepare_qk(const LayerWeights& w, int64_t layer, int64_t n) {
  const int64_t kv_dim = hp_.kv_dim(), q_dim = hp_.q_dim();
  if (!w.bq.empty()) {
    for_rows(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        kernels::add_inplace(q_.data() + i * q_dim, w.bq.data(), q_dim);
        kernels::add_inplace(k_.data() + i * kv_dim, w.bk.data(), kv_dim);
        kernels::add_inplace(v_.data() + i * kv_dim, w.bv.data(), kv_dim);
      }
    });
  }
  if (!w.q_norm.empty()) {  // each head of each row, in place
    for_rows(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        for (int h = 0; h < hp_.n_head; ++h) {
          float* x = q_.data() + i * q_dim + int64_t{h} * hp_.head_dim;
          kernels::rms_norm(x, w.q_norm.data(), x, hp_.head_dim, hp_.rms_eps);
        }
        for (int h = 0; h < hp_.n_kv_head; ++h) {
          float* x = k_.data() + i * kv_dim + int64_t{h} * hp_.head_dim;
          kernels::rms_norm(x, w.k_norm.data(), x, hp_.head_dim, hp_.rms_eps);
        }
      }
    });
  }
  const int rope = hp_.arch.layers.empty() ? 0 : hp_.arch.layers[static_cast<size_t>(layer)].rope;
  rope_rows(q_.data(), hp_.n_head, q_dim, rope, n);
  rope_rows(k_.data(), hp_.n_kv_head, kv_dim, rope, n);
}

void TransformerPass::attention_block(int64_t layer, int64_t n, KvBackend& kv) {
  const LayerWeights& w = model_.layers()[static_cast<size_t>(layer)];
  const int64_t kv_dim = hp_.kv_dim(), q_dim = hp_.q_dim();
  norm_rows(x_.data(), w.attn_norm, xb_.data(), n);
  const MatmulJob qkv[] = {matmul_job(w.wq, q_.data(), q_dim), matmul_job(w.wk, k_.data(), kv_dim),
                           matmul_job(w.wv, v_.data(), kv_dim)};
  kernels::matmul(pool_, qkv, xb_.data(), hp_.n_embd, hp_.n_embd, n, scratch_);
  prepare_qk(w, layer, n);
  kv.store(layer, k_.data(), v_.data(), n);
  kv.attend(layer, q_.data(), att_.data(), n);

  const MatmulJob o = matmul_job(w.wo, xb_.data(), hp_.n_embd);
  kernels::matmul(pool_, {&o, 1}, att_.data(), q_dim, q_dim, n, scratch_);
  if (!w.post_attn_norm.empty()) norm_rows(xb_.data(), w.post_attn_norm, xb_.data(), n);
  add_rows(x_.data(), xb_.data(), n);
}

void TransformerPass::ffn_block(int64_t layer, int64_t n) {
  const LayerWeights& w = model_.layers()[static_cast<size_t>(layer)];
  norm_rows(x_.data(), w.ffn_norm, xb_.data(), n);
  const MatmulJob gate_up[] = {matmul_job(w.w_gate, gate_.data(), hp_.n_ff),
                               matmul_job(w.w_up, up_.data(), hp_.n_ff)};
  kernels::matmul(pool_, gate_up, xb_.data(), hp_.n_embd, hp_.n_embd, n, scratch_);
  const bool gelu = hp_.arch.activation == FfnActivation::kGeluTanh;
  for_rows(n, [&](int64_t b, int64_t e) {
    float* g = gate_.data() + b * hp_.n_ff;
    const float* u = up_.data() + b * hp_.n_ff;
    if (gelu) {
      kernels::gelu_tanh_mul(g, u, (e - b) * hp_.n_ff);
    } else {
      kernels::silu_mul(g, u, (e - b) * hp_.n_ff);
    }
  });
  const MatmulJob down = matmul_job(w.w_down, xb_.data(), hp_.n_embd);
  kernels::matmul(pool_, {&down, 1}, gate_.data(), hp_.n_ff, hp_.n_ff, n, scratch_);
  if (!w.post_ffn_norm.empty()) norm_rows(xb_.data(), w.post_ffn_norm, xb_.data(), n);
  add_rows(x_.data(), xb_.data(), n);
}

}  // namespace tokenfab
