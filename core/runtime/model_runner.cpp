#include "core/runtime/model_runner.h"

#include <algorithm>
#include <cmath>

#include "core/common/error.h"
#include "kernels/cpu/ops.h"

namespace tokenfab {

ModelRunner::ModelRunner(const LlamaModel& model, kernels::ThreadPool& pool, KvStorage& storage)
    : hp_(model.hparams()),
      storage_(storage),
      pass_(model, pool),
      kv_(model.hparams(), pool, storage) {}

void validate_batch(std::span<const BatchSequence> batch, const HParams& hp, int32_t n_blocks,
                    int32_t block_size) {
  for (size_t i = 0; i < batch.size(); ++i) {
    const BatchSequence& s = batch[i];
    const std::string where = "batch sequence " + std::to_string(i);
    if (s.tokens.empty()) throw Error(where + ": no tokens to compute");
    for (int32_t t : s.tokens)
      if (t < 0 || t >= hp.n_vocab)
        throw Error(where + ": token id " + std::to_string(t) + " is outside the vocabulary");
    const int64_t end = s.pos0 + static_cast<int64_t>(s.tokens.size());
    const int64_t covered = static_cast<int64_t>(s.blocks.size()) * block_size;
    if (s.pos0 < 0 || end > covered)
      throw Error(where + ": its " + std::to_string(s.blocks.size()) + " blocks cover " +
                  std::to_string(covered) + " positions, " + std::to_string(end) + " needed");
    for (int32_t b : s.blocks)
      if (b < 0 || b >= n_blocks)
        throw Error(where + ": block id " + std::to_string(b) + " is outside the pool");
    if (!s.tree_parent.empty()) {
      if (s.tree_parent.size() != s.tokens.size())
        throw Error(where + ": a tree parent is needed for every token");
      for (size_t t = 0; t < s.tree_parent.size(); ++t)
        if (s.tree_parent[t] < -1 || s.tree_parent[t] >= static_cast<int32_t>(t))
          throw Error(where + ": token " + std::to_string(t) + " has tree parent " +
                      std::to_string(s.tree_parent[t]) + " (−1 or an earlier token expected)");
    }
  }
}

void BatchRows::assign(std::span<const BatchSequence> batch) {
  tokens.clear();
  positions.clear();
  logit_rows.clear();
  seqs.clear();
  for (const BatchSequence& s : batch) {
    const auto first = static_cast<int64_t>(tokens.size());
    seqs.push_back({s.blocks.data(), static_cast<int64_t>(s.tokens.size()), s.pos0, first,
                    s.tree_parent.empty() ? nullptr : s.tree_parent.data()});
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      tokens.push_back(s.tokens[i]);
      int64_t depth = static_cast<int64_t>(i);
      if (!s.tree_parent.empty()) {
        depth = 0;
        for (int32_t r = s.tree_parent[i]; r >= 0; r = s.tree_parent[static_cast<size_t>(r)])
          ++depth;
      }
      positions.push_back(s.pos0 + depth);
    }
    const auto end = static_cast<int64_t>(tokens.size());
    if (s.all_logits) {
      for (int64_t r = first; r < end; ++r) logit_rows.push_back(r);
    } else if (s.want_logits) {
      logit_rows.push_back(end - 1);
    }
  }
}

void ModelRunner::run(std::span<const BatchSequence> batch, std::vector<float>& logits,
                      std::vector<float>* hidden) {
  validate_batch(batch, hp_, storage_.n_blocks(), storage_.block_size());
  rows_.assign(batch);
  logits.resize(rows_.logit_rows.size() * static_cast<size_t>(hp_.n_vocab));
  const int64_t width = hidden_width(), d = hp_.n_embd;
  if (hidden) hidden->resize(rows_.logit_rows.size() * static_cast<size_t>(width));
  if (rows_.tokens.empty()) return;
  kv_.bind(batch, rows_.seqs);
  pass_.run(rows_.tokens, rows_.positions, kv_, rows_.logit_rows, logits.data(), hidden != nullptr);
  if (!hidden) return;
  const auto rows = static_cast<int64_t>(rows_.logit_rows.size());
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(pass_.final_hidden() + r * d, d, hidden->data() + r * width);
    std::copy_n(pass_.tap_rows() + r * (width - d), width - d, hidden->data() + r * width + d);
  }
}

void ModelRunner::set_draft_taps(bool on) {
  pass_.set_taps(on ? draft_tap_layers(hp_.n_layer) : std::vector<int32_t>{});
}

void ModelRunner::lm_head(const float* z, int64_t n, std::vector<float>& logits) {
  logits.resize(static_cast<size_t>(n) * static_cast<size_t>(hp_.n_vocab));
  pass_.lm_head(z, n, logits.data());
}

void ModelRunner::PagedBackend::bind(std::span<const BatchSequence> batch,
                                     std::span<const kernels::PagedSequence> seqs) {
  batch_ = batch;
  seqs_ = seqs;
}

// Row r of sequence s sits at position pos0 + i: block blocks[pos / block_size], row pos %
// block_size.
void ModelRunner::PagedBackend::store(int64_t layer, const float* k, const float* v, int64_t) {
  const int64_t kv_dim = hp_.kv_dim(), bs = storage_.block_size();
  uint16_t* kd = storage_.k(layer);
  uint16_t* vd = storage_.v(layer);
  for (size_t si = 0; si < batch_.size(); ++si) {
    const BatchSequence& s = batch_[si];
    for (int64_t i = 0; i < static_cast<int64_t>(s.tokens.size()); ++i) {
      const int64_t row = seqs_[si].q_row + i, pos = s.pos0 + i;
      const int32_t block = s.blocks[static_cast<size_t>(pos / bs)];
      for (int64_t g = 0; g < hp_.n_kv_head; ++g) {
        const int64_t dst = storage_.offset(block, g, pos % bs);
        kernels::fp32_to_fp16_row(k + row * kv_dim + g * hp_.head_dim, kd + dst, hp_.head_dim);
        kernels::fp32_to_fp16_row(v + row * kv_dim + g * hp_.head_dim, vd + dst, hp_.head_dim);
      }
    }
  }
  if (progress_) progress_->store(static_cast<int32_t>(layer) + 1, std::memory_order_release);
}

void ModelRunner::PagedBackend::attend(int64_t layer, const float* q, float* out, int64_t) {
  kernels::PagedKv kv = storage_.layer_view(layer);
  kv.window = hp_.window(layer);
  kv.softcap = hp_.arch.attention_softcap;
  kernels::paged_attention(kv, seqs_, q, hp_.q_dim(), out, hp_.q_dim(), hp_.n_head,
                           hp_.attention_scale(), pool_, scratch_);
}

}  // namespace tokenfab
