#pragma once
// Draft heads: small modules on the target's final-norm hidden state h_t (the LM head's input at
// position t, whose own prediction is the token t+1) that propose the tokens after it. Two types:
//
// medusa (Cai et al., 2024): K independent residual blocks sharing the target's frozen LM head,
//   z_k = h + SiLU(W_k h + b_k),   logits_k = LMHead(z_k),   k = 1..K;
//   head k predicts the token at t+k+1. In this API heads are indexed from 0: index i is Medusa
//   head k = i + 1 (tensors medusa.<k>.*).
//
// mtp (EAGLE / multi-token-prediction style): ONE residual block applied K times in sequence. From
//   the hidden state h of a position and the embedding e(x) of the token x chosen after it, it
//   predicts the next position's hidden state and, through the LM head rows of its draft
//   vocabulary V (the ids it was trained to predict), the token after x:
//     ĥ = h + SiLU(W [h; e(x)] + b),   logits = LM_V(ĥ),   x' = argmax logits,
//   then (ĥ, x') feed the next step, K steps in all. Step 1 starts from h_t and the target's own
//   token t+1. Being sequential, each draft knows the drafts before it, which a Medusa head does
//   not; the draft vocabulary keeps each of the K LM-head evaluations small.
//
// File format: GGUF with general.architecture = "tokenfab-draft" and the keys
//   tokenfab.draft.{type, name, domain, base_model_sha256, n_heads, n_embd, n_vocab,
//                   training_config, summary}
// (training_config and summary are JSON objects stored as strings; n_heads is K), and the F32
// tensors (GGUF dims list the fastest-varying dimension first):
//   medusa: per head k = 1..K medusa.<k>.weight {n_embd, n_embd} (row-major out × in) and
//           medusa.<k>.bias {n_embd};
//   mtp:    mtp.weight {2·n_embd, n_embd} (out × [h; e]), mtp.bias {n_embd}, and the I32 tensor
//           mtp.vocab {|V|} (sorted, unique token ids < n_vocab); a head with taps (below) also
//           has the I32 tensor mtp.taps {T} (the layers, ascending) and mtp.fuse.weight
//           {T·n_embd, n_embd} (out × taps), mtp.fuse.bias {n_embd}.
//
// Taps (mtp, optional; EAGLE-3 style): besides h_t the chain's first step reads the target's
// residual stream after some inner layers at t (draft_tap_layers: the target's own features of
// the context, which the final hidden state has narrowed to its next token), RMS-normalised, and
// starts from g = h_t + W_f [t_1; …; t_T] + b_f instead of h_t; the steps after it are as
// without taps. Such a head's hidden rows are draft features: n_embd · (1 + T) floats, h_t first
// (ModelRunner::run with draft taps on).

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/kvcache/block_pool.h"  // TokenId
#include "core/model/llama_model.h"

namespace tokenfab {

struct DraftHeadInfo {
  std::string type = "medusa";  // "medusa" or "mtp"
  std::string name, domain;
  std::string
      base_model_sha256;  // sha256 (lowercase hex) of the target GGUF file it was trained on
  int32_t n_heads = 4, n_embd = 0, n_vocab = 0;
  std::vector<int32_t> taps;  // mtp: the target layers its first step reads (empty: none)
  std::string training_config_json = "{}", summary_json = "{}";
};

// Runs fn(part) for every part in [0, parts) at once on the caller's threads (a device's
// parallel_for): how one draft step spreads its matrix products when a single request drafts
// and the device's other threads would wait. Null: the caller's thread does everything.
using DraftSplit = std::function<void(int64_t parts, const std::function<void(int64_t)>& fn)>;

// The proposer's verdict on a chain's newest draft (DraftHead::mtp_propose's `stop`): drop it
// and stop, keep it and stop, or keep it and draft the next.
enum class DraftVerdict { kDrop, kKeepLast, kKeep };
// Called with each drafted token's path probability: the product, from the first draft to this
// one, of the head's softmax probability for its top token over the draft vocabulary.
using ChainStop = std::function<DraftVerdict(double path_probability)>;

struct DraftHead {
  DraftHeadInfo info;
  // medusa: per head (n_embd, n_embd) row-major out × in, and (n_embd).
  // mtp: one block, w[0] (n_embd, 2·n_embd) out × [h; e] and b[0] (n_embd).
  std::vector<std::vector<float>> w;
  std::vector<std::vector<float>> b;
  std::vector<TokenId> vocab;  // mtp: the draft vocabulary, sorted and unique; empty for medusa
  std::vector<float> fuse_w;   // mtp with taps: (n_embd, T·n_embd) row-major out × taps
  std::vector<float> fuse_b;   // mtp with taps: (n_embd)

  bool is_mtp() const { return info.type == "mtp"; }
  // Floats of the hidden row a proposal starts from: n_embd, or n_embd · (1 + T) with taps.
  int64_t feature_width() const {
    return static_cast<int64_t>(info.n_embd) * (1 + static_cast<int64_t>(info.taps.size()));
  }
  // mtp: the chain's first state g (n, n_embd) from the feature rows f (n, feature_width()):
  // g = h + W_f [t_1; …; t_T] + b_f, or h itself without taps. Single-threaded, or split as
  // mtp_step is (the same values either way).
  void mtp_root(const float* f, int64_t n, float* g, const DraftSplit* split = nullptr,
                int64_t parts = 1) const;
  int32_t n_heads() const { return info.n_heads; }  // K: the longest chain it drafts

  // medusa: z (n, n_embd) = h + SiLU(W h + b) of head index `head` (0-based) for the rows h
  // (n, n_embd). Single-threaded; z must not alias h.
  void residual(int head, const float* h, int64_t n, float* z) const;
  // mtp: z (n, n_embd) = h + SiLU(W [h; e] + b) for the rows h and e (n, n_embd each).
  // z must not alias h or e. Single-threaded, or with `split` over `parts` slices of the output
  // columns (whole tiles of the dense kernel, so every value is computed as without it).
  void mtp_step(const float* h, const float* e, int64_t n, float* z,
                const DraftSplit* split = nullptr, int64_t parts = 1) const;
  // mtp: logits (n, vocab.size()) of the rows z (n, n_embd) over the LM-head rows of `vocab`,
  // computed as the target computes its own logits: the rows are copied from `model`'s LM head
  // in its stored type on first use (in the x8 layout where the target's is) and multiplied with
  // the same matmul kernels, so a row's logit is bit for bit the target's logit for that token
  // of z. (A draft step reads a quarter of the bytes f32 rows would take: drafting is bound by
  // memory like a decode step.) Single-threaded, or with `split` over `parts` slices of the
  // vocabulary (whole x8 row groups: the same values); safe from several threads at once.
  void vocab_logits(const LlamaModel& model, const float* z, int64_t n, float* logits,
                    const DraftSplit* split = nullptr, int64_t parts = 1) const;
  // mtp: the drafts after the token `last`, whose draft features are h (feature_width()) — the
  // row whose logits gave `last`. Level l expands every node of level l − 1 (the root: `last`
  // itself) into its widths[l] best tokens (a chain when every width is 1), ties to the lower token
  // id; at most max_nodes nodes, in level order. draft[i] follows node parent[i] (−1: `last`).
  // Single-threaded, or its steps split as mtp_step and vocab_logits split them (same drafts).
  // `stop` (chains only: every width 1) judges each drafted token before it is added, and may end
  // the chain early (draft_length.h's ChainStopRule); the kept drafts are the same tokens.
  void mtp_propose(const LlamaModel& model, const float* h, TokenId last,
                   std::span<const int32_t> widths, int32_t max_nodes, std::vector<TokenId>& draft,
                   std::vector<int32_t>& parent, const DraftSplit* split = nullptr,
                   int64_t parts = 1, const ChainStop* stop = nullptr) const;
  // mtp: a dynamic tree (EAGLE-2 style) of at most `nodes` nodes instead of the whole static one:
  // among the nodes of the tree `widths` describes (a node of depth l has its widths[l] best
  // tokens as children), the `nodes` nodes of highest path probability — the product, from
  // `last` down to the node, of the head's softmax over its draft vocabulary — grown best-first,
  // so a node enters only after its parent (a path's probability only falls with depth); ties to
  // the node found first. Returned in level order, each level's nodes grouped by parent in the
  // parents' order and, within a parent, most probable first (draft[i] follows node parent[i],
  // −1: `last`). Single-threaded, or split as mtp_propose is.
  void mtp_propose_best_first(const LlamaModel& model, const float* h, TokenId last,
                              std::span<const int32_t> widths, int32_t nodes,
                              std::vector<TokenId>& draft, std::vector<int32_t>& parent,
                              const DraftSplit* split = nullptr, int64_t parts = 1) const;

 private:
  struct VocabRows {
    std::once_flag once;
    // The vocabulary's LM-head rows in the head's stored type, padded_rows of them (x8 layout,
    // the last row repeated up to a multiple of 8, where the target's LM head is x8; else the
    // GGUF layout, vocab.size() rows).
    std::vector<uint8_t> rows;
    int64_t padded_rows = 0;
  };
  // Shared by copies: `vocab` is fixed once a head is made or loaded.
  mutable std::shared_ptr<VocabRows> vocab_rows_ = std::make_shared<VocabRows>();
};

// Embedding rows (n, n_embd) of `tokens` from the model's token embedding, dequantized to f32.
void embed_tokens(const LlamaModel& model, std::span<const TokenId> tokens, float* out);

// A head whose W and b are zero, so every z_k = h: each head starts out as the base LM head.
// Throws Error when n_heads, n_embd or n_vocab are not positive or the type is not "medusa".
DraftHead make_medusa_head(DraftHeadInfo info);
// An mtp head with W and b zero (ĥ = h: step 1 starts out predicting what the LM head at t
// predicts, restricted to `vocab`), and W_f and b_f zero where info.taps names layers. `vocab` is
// sorted and deduplicated here; throws Error when it is empty or holds an id outside [0, n_vocab),
// or when the info is invalid or not "mtp".
DraftHead make_mtp_head(DraftHeadInfo info, std::vector<TokenId> vocab);

// Writes `head` (temporary file + rename). Throws Error naming the file on failure.
void save_draft_head(const DraftHead& head, const std::filesystem::path& path);
// Reads and validates a draft-head file: every key and tensor, their types and shapes, finite
// weights, the mtp vocabulary, JSON fields. Throws Error naming the file and the field; an
// unknown type gives "…: draft head type 'X' is not supported (expected medusa or mtp)".
DraftHead load_draft_head(const std::filesystem::path& path);

// Refuses a head trained for another model (a different sha256, or another n_embd / n_vocab):
// Error "head 'NAME' was trained for model 0123456789ab…, not for MODEL (ba9876543210…)".
void check_head_matches(const DraftHeadInfo& info, std::string_view model_sha256, int64_t n_embd,
                        int64_t n_vocab, std::string_view model_name);

}  // namespace tokenfab
