#pragma once
// What the target model computed over some token sequences: at each position its final-norm
// hidden state (the LM head's input), its argmax next token and its top-k next-token distribution.
// Draft heads are trained on these (self-distillation: the labels are the target's own
// predictions, not the text's tokens).
//
// The text the target read need not be its own greedy continuation: a corpus is the user's text,
// and a sampled continuation draws its tokens. So next[i], the token that actually followed
// position i, is kept beside pred[i]; where they differ, pred[i + 1] is the target's prediction
// after next[i], not after pred[i].
//
// Labels: the label of Medusa head k (1-based) at position i is pred[i + k] — the target's
// prediction at i + k, i.e. the token at i + k + 1 — when i + k is inside i's sequence and the
// text from i + 1 through i + k is the target's greedy path (next[j] == pred[j] for i ≤ j < i + k:
// a Medusa head never sees the tokens in between, so it can only learn the greedy ones); there is
// none otherwise (a label never crosses a sequence end). An mtp head reads the token itself: its
// step from position j takes next[j] and predicts pred[j + 1] and hidden[j + 1].
//
// Layer taps (optional): the target's residual stream after its draft_tap_layers at each
// position, RMS-normalised (what an mtp head with taps reads; draft_head.h).
//
// File format (little-endian): magic "TFTRACE\0", u32 version (3), i32 n_embd, i32 top_k,
// u32 n_taps, i64 n_pos, i64 n_seq, i64 seq_begin[n_seq + 1], f32 hidden[n_pos·n_embd],
// i32 pred[n_pos], i32 next[n_pos], i32 topk_ids[n_pos·top_k], f32 topk_probs[n_pos·top_k],
// f32 taps[n_pos·n_taps·n_embd], then the XXH64 (seed 0) of every byte before it. Version 1
// files (no next: greedy continuations, or corpus traces recorded before next existed) load with
// next = pred; versions 1 and 2 have no taps (their n_taps field is 0).

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/kvcache/block_pool.h"  // TokenId

namespace tokenfab {

struct TraceSet {
  int32_t n_embd = 0, top_k = 0, n_taps = 0;
  std::vector<float> hidden;       // (n_pos, n_embd) final-norm hidden state at each position
  std::vector<TokenId> pred;       // (n_pos) the target's argmax at each position (its next token)
  std::vector<TokenId> next;       // (n_pos) the token that followed each position in the text read
                                   // (at a sequence's last position: the following one, or pred)
  std::vector<TokenId> topk_ids;   // (n_pos, top_k) its top-k next tokens, most probable first …
  std::vector<float> topk_probs;   // (n_pos, top_k) … and their probabilities (softmax, T = 1)
  std::vector<float> taps;         // (n_pos, n_taps · n_embd) the layer taps at each position
  std::vector<int64_t> seq_begin;  // (n_seq + 1): sequence s spans [seq_begin[s], seq_begin[s+1]);
                                   // seq_begin[0] = 0, seq_begin[n_seq] = n_pos; {} or {0} if empty

  int64_t n_pos() const { return static_cast<int64_t>(pred.size()); }
  int64_t n_sequences() const {
    return seq_begin.empty() ? 0 : static_cast<int64_t>(seq_begin.size()) - 1;
  }
  // (n_pos): the end (exclusive) of the sequence holding each position.
  std::vector<int64_t> sequence_ends() const;
  // Whether the text after position i is the target's greedy choice (next[i] == pred[i]).
  bool greedy_at(int64_t i) const {
    return next[static_cast<size_t>(i)] == pred[static_cast<size_t>(i)];
  }
  // Whether the text at positions [from, to) continues greedily, so that pred[to] is what the
  // target predicts on its greedy path from `from` (a Medusa label, a simulated chain).
  bool greedy_path(int64_t from, int64_t to) const {
    for (int64_t j = from; j < to; ++j)
      if (!greedy_at(j)) return false;
    return true;
  }
  // The draft features of position i into out: its hidden state, then with `with_taps` its
  // layer taps (n_embd · (1 + n_taps) floats; DraftHead::mtp_root reads them).
  void copy_features(int64_t i, bool with_taps, float* out) const;
  // Appends `other`'s sequences after ours. n_embd and top_k must agree (or ours be empty).
  void append(const TraceSet& other);
  // Throws Error (prefixed by `where`) unless the sizes and the sequence bounds are consistent.
  void validate(const std::string& where) const;

  // Temporary file + rename; throws Error naming the file.
  void save(const std::filesystem::path& path) const;
  // Throws Error naming the file when it is not a trace file, is truncated or corrupt (checksum),
  // or holds inconsistent sizes.
  static TraceSet load(const std::filesystem::path& path);
};

}  // namespace tokenfab
