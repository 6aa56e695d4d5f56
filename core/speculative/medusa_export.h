#pragma once
// Export of a medusa draft head as the checkpoint vLLM's Medusa drafter loads (model_type
// "medusa": vllm/transformers_utils/configs/medusa.py for the config, and
// vllm/model_executor/models/medusa.py for the module and its load_weights), so that a head
// trained here drafts for the same target on a cluster:
//
//   DIR/config.json        model_type "medusa", architectures ["MedusaModel"], hidden_size,
//                          vocab_size, truncated_vocab_size (= vocab_size: no token_map),
//                          num_heads (K), num_hidden_layers (1), medusa_fc_bias, original_lm_head,
//                          max_paths, topk, torch_dtype
//   DIR/model.safetensors  per head k = 0..K-1 (our medusa.<k+1>.*):
//                            blocks.<k>.layers.0.weight  F32 (hidden, hidden), out × in (nn.Linear)
//                            blocks.<k>.layers.0.bias    F32 (hidden)
//                          and lm_heads.0.weight (vocab, hidden): the target's LM head
//                          (output.weight, or the tied token embedding) dequantized, which vLLM's
//                          load_weights renames to lm_head.weight since original_lm_head is set.
//
// vLLM computes block k as x + SiLU(W x + b) over the target's final-norm hidden state and takes
// logits from the one shared LM head: the same function as DraftHead::residual + the LM head.
//
// Dtypes: vLLM builds the draft in the TARGET's dtype and casts every tensor it loads into it, so
// the file's dtypes only decide size and precision. The blocks stay F32 (what we trained: small).
// The LM head, the bulk of the bytes, is F16 — exact for an F16 source, and 3 more mantissa bits
// than BF16 for the dequantized blocks of a quantized one — or BF16 where the source is BF16 or a
// value lies beyond F16's range. torch_dtype names the LM head's dtype.
//
// An mtp head has no counterpart: vLLM's EAGLE drafters need a decoder layer with attention, and
// its MTP drafters a model family's own module; export_medusa_hf refuses it.

#include <cstdint>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/model/llama_model.h"
#include "core/speculative/draft_head.h"
#include "core/speculative/safetensors_writer.h"

namespace tokenfab {

// Throws Error unless the head is a medusa head (the one message for an mtp head).
void check_medusa_exportable(const DraftHeadInfo& info);

// The dtype the LM head is written in (see above): reads the whole LM head when its stored type
// is neither F16 nor BF16.
SafetensorsDtype medusa_lm_head_dtype(const LlamaModel& model);

// config.json's object for `head` with its LM head stored as `lm_head_dtype`.
nlohmann::ordered_json medusa_hf_config(const DraftHeadInfo& info, SafetensorsDtype lm_head_dtype);

struct MedusaExport {
  std::filesystem::path config_file, weights_file;
  nlohmann::ordered_json config;
  SafetensorsDtype lm_head_dtype = SafetensorsDtype::kF16;
  uint64_t weights_bytes = 0;  // model.safetensors' size
};

// Writes DIR/model.safetensors and then DIR/config.json, each through a temporary file and a
// rename. DIR is created when missing (and removed again when the export fails). Throws Error:
// for an mtp head; for a head whose n_embd / n_vocab differ from the model's LM head; for DIR that
// is a file, or that holds files other than config.json and model.safetensors (vLLM would read
// every *.safetensors there); for DIR holding a previous export unless `replace`.
MedusaExport export_medusa_hf(const DraftHead& head, const LlamaModel& model,
                              const std::filesystem::path& dir, bool replace);

}  // namespace tokenfab
