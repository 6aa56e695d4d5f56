#include "core/model/llama_forward.h"

#include <cmath>

#include "core/common/error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/ops.h"

namespace tokenfab {

using kernels::MatmulJob;
using kernels::ThreadPool;

LlamaForward::LlamaForward(const LlamaModel& model, ThreadPool& pool, int64_t max_chunk)
    : model_(model), hp_(model.hparams()), pool_(pool), max_chunk_(std::max<int64_t>(1, max_chunk)) {
  const auto c = static_cast<size_t>(max_chunk_);
  x_.resize(c * hp_.n_embd);
  xb_.resize(c * hp_.n_embd);
  q_.resize(c * hp_.q_dim());
  k_.resize(c * hp_.kv_dim());
  v_.resize(c * hp_.kv_dim());
  att_.resize(c * hp_.q_dim());
  gate_.resize(c * hp_.n_ff);
  up_.resize(c * hp_.n_ff);
  rope_cos_.resize(c * (hp_.rot_dim / 2));
  rope_sin_.resize(c * (hp_.rot_dim / 2));
  attention_scratch_.resize(static_cast<size_t>(pool.size()));
}

KvCache LlamaForward::make_cache() const {
  return KvCache(hp_.n_layer, hp_.n_kv_head, hp_.head_dim);
}

void LlamaForward::forward(std::span<const int32_t> tokens, KvCache& cache, LogitsFor which,
                           std::vector<float>& logits) {
  if (tokens.empty()) throw Error("forward: no tokens to process");
  for (int32_t t : tokens)
    if (t < 0 || t >= hp_.n_vocab)
      throw Error("token id " + std::to_string(t) + " is outside the vocabulary (0.." +
                  std::to_string(hp_.n_vocab - 1) + ")");
  const auto n = static_cast<int64_t>(tokens.size());
  logits.resize(static_cast<size_t>((which == LogitsFor::AllTokens ? n : 1) * hp_.n_vocab));
  cache.reserve(cache.size() + n);
  for (int64_t start = 0; start < n; start += max_chunk_) {
    const int64_t len = std::min(max_chunk_, n - start);
    const bool last_chunk = start + len == n;
    float* out = which == LogitsFor::AllTokens ? logits.data() + start * hp_.n_vocab
                 : last_chunk                  ? logits.data()
                                               : nullptr;
    run_chunk(tokens.subspan(static_cast<size_t>(start), static_cast<size_t>(len)), cache, which,
              out);
  }
}

void LlamaForward::norm_rows(const float* in, const std::vector<float>& w, float* out, int64_t n) {
  for (int64_t r = 0; r < n; ++r)
    kernels::rms_norm(in + r * hp_.n_embd, w.data(), out + r * hp_.n_embd, hp_.n_embd, hp_.rms_eps);
}

void LlamaForward::run_chunk(std::span<const int32_t> tokens, KvCache& cache, LogitsFor which,
                             float* logits) {
  const auto n = static_cast<int64_t>(tokens.size());
  const int64_t pos0 = cache.size();
  const int half = hp_.rot_dim / 2;
  for (int64_t i = 0; i < n; ++i) {
    model_.embed(tokens[static_cast<size_t>(i)], x_.data() + i * hp_.n_embd);
    kernels::rope_table(pos0 + i, hp_.rot_dim, hp_.rope_base, rope_cos_.data() + i * half,
                        rope_sin_.data() + i * half);
  }
  for (int64_t layer = 0; layer < hp_.n_layer; ++layer) {
    attention_block(layer, n, cache);
    ffn_block(layer, n);
  }
  cache.set_size(pos0 + n);
  if (logits == nullptr) return;

  // Final norm and the LM head, only for the rows whose logits are wanted.
  const int64_t first = which == LogitsFor::AllTokens ? 0 : n - 1;
  const int64_t rows = n - first;
  norm_rows(x_.data() + first * hp_.n_embd, model_.output_norm(), xb_.data(), rows);
  const WeightMatrix& out = model_.output();
  const MatmulJob job = matmul_job(out, logits, hp_.n_vocab);
  kernels::matmul(pool_, {&job, 1}, xb_.data(), hp_.n_embd, hp_.n_embd, rows, scratch_);
}

void LlamaForward::attention_block(int64_t layer, int64_t n, KvCache& cache) {
  const LayerWeights& w = model_.layers()[static_cast<size_t>(layer)];
  const int64_t pos0 = cache.size();
  const int64_t kv_dim = hp_.kv_dim(), q_dim = hp_.q_dim();
  norm_rows(x_.data(), w.attn_norm, xb_.data(), n);
  const MatmulJob qkv[] = {matmul_job(w.wq, q_.data(), q_dim), matmul_job(w.wk, k_.data(), kv_dim),
                           matmul_job(w.wv, v_.data(), kv_dim)};
  kernels::matmul(pool_, qkv, xb_.data(), hp_.n_embd, hp_.n_embd, n, scratch_);

  const int half = hp_.rot_dim / 2;
  for (int64_t i = 0; i < n; ++i) {
    const float* c = rope_cos_.data() + i * half;
    const float* s = rope_sin_.data() + i * half;
    kernels::rope(q_.data() + i * q_dim, hp_.n_head, hp_.head_dim, hp_.rot_dim, c, s);
    kernels::rope(k_.data() + i * kv_dim, hp_.n_kv_head, hp_.head_dim, hp_.rot_dim, c, s);
  }
  // (n, n_kv_head, head_dim) rows → the cache's (n_kv_head, positions, head_dim) fp16 rows.
  const int64_t head_stride = cache.head_stride();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t g = 0; g < hp_.n_kv_head; ++g) {
      const int64_t src = i * kv_dim + g * hp_.head_dim;
      const int64_t dst = g * head_stride + (pos0 + i) * hp_.head_dim;
      kernels::fp32_to_fp16_row(k_.data() + src, cache.k(layer) + dst, hp_.head_dim);
      kernels::fp32_to_fp16_row(v_.data() + src, cache.v(layer) + dst, hp_.head_dim);
    }
  }

  const kernels::AttentionArgs args{q_.data(), q_dim, cache.k(layer), cache.v(layer), hp_.head_dim,
                                    head_stride, att_.data(), q_dim, n, pos0, hp_.n_head,
                                    hp_.n_kv_head, hp_.head_dim,
                                    1.0f / std::sqrt(static_cast<float>(hp_.head_dim))};
  if (n == 1) {
    decode_attention(args);
  } else {
    prefill_attention(args);
  }

  const MatmulJob o = matmul_job(w.wo, xb_.data(), hp_.n_embd);
  kernels::matmul(pool_, {&o, 1}, att_.data(), q_dim, q_dim, n, scratch_);
  kernels::add_inplace(x_.data(), xb_.data(), n * hp_.n_embd);
}

// One query token: every kv head's positions are split in as many ranges as there are threads,
// so the n_kv_head × threads items divide evenly whatever the number of kv heads.
void LlamaForward::decode_attention(const kernels::AttentionArgs& args) {
  const int splits = pool_.size();
  const int64_t items = static_cast<int64_t>(hp_.n_kv_head) * splits;
  const auto partial_floats = static_cast<size_t>(kernels::attention_decode_partial_floats(args, splits));
  if (decode_partials_.size() < partial_floats) decode_partials_.resize(partial_floats);
  const int64_t scratch_floats = kernels::attention_decode_scratch_floats(args, splits);
  pool_.run([&](int t, int nt) {
    std::vector<float>& scratch = attention_scratch_[static_cast<size_t>(t)];
    if (scratch.size() < static_cast<size_t>(scratch_floats)) scratch.resize(static_cast<size_t>(scratch_floats));
    int64_t b, e;
    ThreadPool::split(items, 1, t, nt, b, e);
    for (int64_t item = b; item < e; ++item)
      kernels::attention_decode_partial(args, splits, item, decode_partials_.data(), scratch.data());
  });
  kernels::attention_decode_merge(args, splits, decode_partials_.data());
}

// A chunk of query tokens: items are (head, token) pairs; token t costs pos0 + t + 1 positions, so
// the threads get equal shares of the total cost rather than of the item count.
void LlamaForward::prefill_attention(const kernels::AttentionArgs& args) {
  const int64_t n = args.n_tokens, pos0 = args.pos0;
  const int64_t items = n * hp_.n_head;
  const int64_t scratch_floats = kernels::attention_scratch_floats(args);
  const auto cost_before = [&](int64_t item) {  // cost of items [0, item)
    const int64_t h = item / n, t = item % n;
    const int64_t per_head = n * pos0 + n * (n + 1) / 2;
    return h * per_head + t * pos0 + t * (t + 1) / 2;
  };
  const int64_t total = cost_before(items);
  // First item whose preceding cost reaches a share boundary (cost_before is monotone).
  const auto boundary = [&](int64_t share, int64_t shares) {
    const int64_t target = total * share / shares;
    int64_t lo = 0, hi = items;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (cost_before(mid) < target) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    return lo;
  };
  pool_.run([&](int t, int nt) {
    std::vector<float>& scratch = attention_scratch_[static_cast<size_t>(t)];
    if (scratch.size() < static_cast<size_t>(scratch_floats)) scratch.resize(static_cast<size_t>(scratch_floats));
    const int64_t b = boundary(t, nt);
    const int64_t e = t + 1 == nt ? items : boundary(t + 1, nt);
    if (b < e) kernels::attention(args, b, e, scratch.data());
  });
}

void LlamaForward::ffn_block(int64_t layer, int64_t n) {
  const LayerWeights& w = model_.layers()[static_cast<size_t>(layer)];
  norm_rows(x_.data(), w.ffn_norm, xb_.data(), n);
  const MatmulJob gate_up[] = {matmul_job(w.w_gate, gate_.data(), hp_.n_ff),
                               matmul_job(w.w_up, up_.data(), hp_.n_ff)};
  kernels::matmul(pool_, gate_up, xb_.data(), hp_.n_embd, hp_.n_embd, n, scratch_);
  if (n == 1) {
    kernels::silu_mul(gate_.data(), up_.data(), hp_.n_ff);
  } else {
    pool_.run([&](int t, int nt) {
      int64_t b, e;
      ThreadPool::split(n, 1, t, nt, b, e);
      kernels::silu_mul(gate_.data() + b * hp_.n_ff, up_.data() + b * hp_.n_ff, (e - b) * hp_.n_ff);
    });
  }
  const MatmulJob down = matmul_job(w.w_down, xb_.data(), hp_.n_embd);
  kernels::matmul(pool_, {&down, 1}, gate_.data(), hp_.n_ff, hp_.n_ff, n, scratch_);
  kernels::add_inplace(x_.data(), xb_.data(), n * hp_.n_embd);
}

}  // namespace tokenfab
