#include "core/model/llama_forward.h"

#include <cmath>

#include "core/common/error.h"
#include "kernels/cpu/ops.h"

namespace tokenfab {

using kernels::ThreadPool;

LlamaForward::LlamaForward(const LlamaModel& model, ThreadPool& pool, int64_t max_chunk)
    : hp_(model.hparams()),
      max_chunk_(std::max<int64_t>(1, max_chunk)),
      pass_(model, pool),
      kv_(model.hparams(), pool) {}

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
  kv_.bind(cache);
  for (int64_t start = 0; start < n; start += max_chunk_) {
    const int64_t len = std::min(max_chunk_, n - start);
    const int64_t pos0 = cache.size();
    positions_.resize(static_cast<size_t>(len));
    for (int64_t i = 0; i < len; ++i) positions_[static_cast<size_t>(i)] = pos0 + i;
    logit_rows_.clear();
    if (which == LogitsFor::AllTokens) {
      for (int64_t i = 0; i < len; ++i) logit_rows_.push_back(i);
    } else if (start + len == n) {
      logit_rows_.push_back(len - 1);
    }
    float* out = which == LogitsFor::AllTokens ? logits.data() + start * hp_.n_vocab : logits.data();
    pass_.run(tokens.subspan(static_cast<size_t>(start), static_cast<size_t>(len)), positions_, kv_,
              logit_rows_, out);
    cache.set_size(pos0 + len);
  }
}

LlamaForward::ContiguousKv::ContiguousKv(const HParams& hp, ThreadPool& pool)
    : hp_(hp), pool_(pool), scratch_(static_cast<size_t>(pool.size())) {}

// The rows continue the cache: (n, n_kv_head, head_dim) → the cache's (n_kv_head, positions,
// head_dim) fp16 rows at positions size() .. size()+n-1.
void LlamaForward::ContiguousKv::store(int64_t layer, const float* k, const float* v, int64_t n) {
  const int64_t pos0 = cache_->size(), kv_dim = hp_.kv_dim();
  const int64_t head_stride = cache_->head_stride();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t g = 0; g < hp_.n_kv_head; ++g) {
      const int64_t src = i * kv_dim + g * hp_.head_dim;
      const int64_t dst = g * head_stride + (pos0 + i) * hp_.head_dim;
      kernels::fp32_to_fp16_row(k + src, cache_->k(layer) + dst, hp_.head_dim);
      kernels::fp32_to_fp16_row(v + src, cache_->v(layer) + dst, hp_.head_dim);
    }
  }
}

void LlamaForward::ContiguousKv::attend(int64_t layer, const float* q, float* out, int64_t n) {
  const int64_t q_dim = hp_.q_dim();
  const kernels::AttentionArgs args{q,          q_dim,        cache_->k(layer),
                                    cache_->v(layer), hp_.head_dim, cache_->head_stride(),
                                    out,        q_dim,        n,
                                    cache_->size(), hp_.n_head, hp_.n_kv_head,
                                    hp_.head_dim, hp_.attention_scale(), hp_.window(layer),
                                    hp_.arch.attention_softcap};
  if (n == 1) {
    decode_attention(args);
  } else {
    prefill_attention(args);
  }
}

// One query token: every kv head's positions are split in as many ranges as there are threads,
// so the n_kv_head × threads items divide evenly whatever the number of kv heads.
void LlamaForward::ContiguousKv::decode_attention(const kernels::AttentionArgs& args) {
  const int splits = pool_.size();
  const int64_t items = static_cast<int64_t>(hp_.n_kv_head) * splits;
  const auto partial_floats = static_cast<size_t>(kernels::attention_decode_partial_floats(args, splits));
  if (partials_.size() < partial_floats) partials_.resize(partial_floats);
  const int64_t scratch_floats = kernels::attention_decode_scratch_floats(args, splits);
  pool_.run([&](int t, int nt) {
    std::vector<float>& scratch = scratch_[static_cast<size_t>(t)];
    if (scratch.size() < static_cast<size_t>(scratch_floats)) scratch.resize(static_cast<size_t>(scratch_floats));
    int64_t b, e;
    ThreadPool::split(items, 1, t, nt, b, e);
    for (int64_t item = b; item < e; ++item)
      kernels::attention_decode_partial(args, splits, item, partials_.data(), scratch.data());
  });
  kernels::attention_decode_merge(args, splits, partials_.data());
}

// A chunk of query tokens: items are (head, token) pairs; token t costs pos0 + t + 1 positions, so
// the threads get equal shares of the total cost rather than of the item count.
void LlamaForward::ContiguousKv::prefill_attention(const kernels::AttentionArgs& args) {
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
    std::vector<float>& scratch = scratch_[static_cast<size_t>(t)];
    if (scratch.size() < static_cast<size_t>(scratch_floats)) scratch.resize(static_cast<size_t>(scratch_floats));
    const int64_t b = boundary(t, nt);
    const int64_t e = t + 1 == nt ? items : boundary(t + 1, nt);
    if (b < e) kernels::attention(args, b, e, scratch.data());
  });
}

}  // namespace tokenfab
