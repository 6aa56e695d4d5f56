#pragma once
// Medusa draft heads (Cai et al., 2024): K residual blocks on the target's final-norm hidden state
// h at position t, all sharing the target's frozen LM head:
//   z_k = h + SiLU(W_k h + b_k),   logits_k = LMHead(z_k),   k = 1..K.
// The target's own LM head predicts the token at t+1; head k predicts the token at t+k+1.
// In this API heads are indexed from 0: index i is Medusa head k = i + 1 (tensor medusa.<k>).
//
// File format: GGUF with general.architecture = "tokenfab-draft" and the keys
//   tokenfab.draft.{type, name, domain, base_model_sha256, n_heads, n_embd, n_vocab,
//                   training_config, summary}
// (training_config and summary are JSON objects stored as strings), and per head k = 1..K the F32
// tensors medusa.<k>.weight (GGUF dims {n_embd, n_embd}: row-major out × in) and medusa.<k>.bias
// (n_embd).

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace tokenfab {

struct DraftHeadInfo {
  std::string type = "medusa";  // "medusa"; "mtp" is planned, not supported yet
  std::string name, domain;
  std::string
      base_model_sha256;  // sha256 (lowercase hex) of the target GGUF file it was trained on
  int32_t n_heads = 4, n_embd = 0, n_vocab = 0;
  std::string training_config_json = "{}", summary_json = "{}";
};

struct MedusaHead {
  DraftHeadInfo info;
  std::vector<std::vector<float>> w;  // per head: (n_embd, n_embd) row-major, out × in
  std::vector<std::vector<float>> b;  // per head: (n_embd)

  int32_t n_heads() const { return static_cast<int32_t>(w.size()); }
  // z (n, n_embd) = h + SiLU(W h + b) of head index `head` (0-based) for the rows h (n, n_embd).
  // Single-threaded; z must not alias h.
  void residual(int head, const float* h, int64_t n, float* z) const;
};

// A head whose W and b are zero, so every z_k = h: each head starts out as the base LM head.
// Throws Error when n_heads, n_embd or n_vocab are not positive or the type is not "medusa".
MedusaHead make_medusa_head(DraftHeadInfo info);

// Writes `head` (temporary file + rename). Throws Error naming the file on failure.
void save_draft_head(const MedusaHead& head, const std::filesystem::path& path);
// Reads and validates a draft-head file: every key and tensor, their types and shapes, finite
// weights, JSON fields. Throws Error naming the file and the field; a type other than "medusa"
// (e.g. "mtp") gives "…: draft head type 'mtp' is not supported yet".
MedusaHead load_draft_head(const std::filesystem::path& path);

// Refuses a head trained for another model (a different sha256, or another n_embd / n_vocab):
// Error "head 'NAME' was trained for model 0123456789ab…, not for MODEL (ba9876543210…)".
void check_head_matches(const DraftHeadInfo& info, std::string_view model_sha256, int64_t n_embd,
                        int64_t n_vocab, std::string_view model_name);

}  // namespace tokenfab
