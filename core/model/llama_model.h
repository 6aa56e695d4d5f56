#pragma once
// A decoder-only transformer loaded from GGUF — the Llama layers and the families that differ from
// them in the ways Architecture describes (Llama 3, Mistral, Qwen 2/3, Gemma 2/3, Phi-3): its
// hyperparameters and its weights, used in place from the memory-mapped file (quantized blocks
// are never expanded).

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/gguf/gguf_reader.h"
#include "core/model/architecture.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quant_types.h"

namespace tokenfab {

struct HParams {
  std::string architecture;
  int64_t n_vocab = 0;
  int64_t n_ctx_train = 0;
  int64_t n_embd = 0;
  int64_t n_ff = 0;
  int64_t n_layer = 0;
  int n_head = 0;
  int n_kv_head = 0;
  int head_dim = 0;  // attention.key_length, else n_embd / n_head
  int rot_dim = 0;   // rotated dimensions per head (rope.dimension_count)
  float rope_base = 10000.0f;
  float rms_eps = 1e-5f;
  Architecture arch;  // what the family does differently from the Llama layers

  int64_t q_dim() const { return static_cast<int64_t>(n_head) * head_dim; }
  int64_t kv_dim() const { return static_cast<int64_t>(n_kv_head) * head_dim; }
  float attention_scale() const;              // arch's, or 1/√head_dim
  int64_t window(int64_t layer) const;        // the layer's sliding window, 0: none
  const RopeSpec& rope(int64_t layer) const;  // the layer's RoPE
  // Reads `<arch>.*` keys; throws Error naming the file and the key that is missing or invalid.
  static HParams from_gguf(const gguf::GgufFile& file);
};

// A 2-D weight: `rows` rows of `cols` elements, row-major, rows `row_bytes` apart.
struct WeightMatrix {
  std::string name;
  kernels::WeightType type = kernels::WeightType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  uint64_t row_bytes = 0;
  const uint8_t* data = nullptr;  // GGUF layout, inside the file mapping
  // The same rows packed for the CPU's kernels at load (x8 or x16, repack.h), or null.
  const uint8_t* packed = nullptr;
  int group_rows = 0;  // rows per group of `packed` (8 or 16), 0 when there is none

  const uint8_t* row(int64_t r) const { return data + static_cast<uint64_t>(r) * row_bytes; }
  uint64_t bytes() const { return row_bytes * static_cast<uint64_t>(rows); }
};

// The vectors a family lacks are empty (Architecture says which it has).
struct LayerWeights {
  std::vector<float> attn_norm;  // (n_embd)
  std::vector<float> bq, bk, bv;         // (q_dim), (kv_dim), (kv_dim): qkv_bias
  std::vector<float> q_norm, k_norm;     // (head_dim) each: qk_norm
  std::vector<float> post_attn_norm;     // (n_embd): post_norms
  std::vector<float> post_ffn_norm;      // (n_embd): post_norms
  WeightMatrix wq;               // (q_dim, n_embd)
  WeightMatrix wk;               // (kv_dim, n_embd)
  WeightMatrix wv;               // (kv_dim, n_embd)
  WeightMatrix wo;               // (n_embd, q_dim)
  std::vector<float> ffn_norm;   // (n_embd)
  WeightMatrix w_gate;           // (n_ff, n_embd)
  WeightMatrix w_up;             // (n_ff, n_embd)
  WeightMatrix w_down;           // (n_embd, n_ff)
};

class LlamaModel {
 public:
  // Opens and validates the file. Throws Error for an unsupported architecture, a missing tensor,
  // a tensor of the wrong shape or of a type the kernels cannot compute on, or a block scale that
  // is not finite. `repack` false keeps the matrices as the file's rows only, for tools that read
  // the weights without computing on them (`tokenfab-cli quantize`).
  static std::unique_ptr<LlamaModel> load(const std::filesystem::path& path, bool repack = true);

  const HParams& hparams() const { return hparams_; }
  const gguf::GgufFile& file() const { return file_; }
  const WeightMatrix& token_embedding() const { return token_embd_; }  // (n_vocab, n_embd)
  const WeightMatrix& output() const { return output_; }  // (n_vocab, n_embd); tied when absent
  bool output_is_tied() const { return output_tied_; }
  const std::vector<float>& output_norm() const { return output_norm_; }
  const std::vector<LayerWeights>& layers() const { return layers_; }
  uint64_t weight_bytes() const;  // bytes of all matrices read by one decode step

  // The quantization study: re-quantizes every matrix of the layers and the LM head in memory —
  // dequantize, quantize, repack; rows spread over `threads` (0: all hardware threads) — so a
  // cheaper or richer target can be compared with the file's own. The token embedding lookup keeps
  // the file's rows.
  // requantize: every matrix to `type` (F16 or a block type); a super-block type takes
  // llama-quantize's fallback (quant_mix.h) in a matrix whose rows its 256-element blocks do not
  // divide. Throws Error for F32 or BF16.
  void requantize(kernels::WeightType type, int threads = 0);
  // requantize_mix: each matrix to the type llama-quantize's mixture `file_type` gives its tensor
  // (quant_mix.h; a tied LM head takes token_embd.weight's). Throws Error for a file type outside
  // quant_mix_names().
  void requantize_mix(uint32_t file_type, int threads = 0);

  // Copies the embedding row of `token` into `out` (n_embd floats), dequantized.
  void embed(int32_t token, float* out) const;
  uint64_t repacked_bytes() const { return repacked_bytes_; }

 private:
  explicit LlamaModel(gguf::GgufFile file) : file_(std::move(file)) {}
  // Repacks the block-quantized matrices into the layout the CPU's kernels read fastest (x16 with
  // AVX-512 VNNI, x8 with AVX2; repack.h); `release_source` drops the file pages
  // they came from (never for matrices in owned memory, whose contents MADV_DONTNEED would lose).
  void repack_for_cpu(bool release_source = true);
  std::vector<WeightMatrix*> matrices();
  // Re-quantizes matrices()[i] to types[i] (requantize, requantize_mix); `what` names the target
  // in the log.
  void requantize_matrices(const std::vector<kernels::WeightType>& types, int threads,
                           const std::string& what);

  gguf::GgufFile file_;
  HParams hparams_;
  WeightMatrix token_embd_;
  WeightMatrix output_;
  bool output_tied_ = false;
  std::vector<float> output_norm_;
  std::vector<LayerWeights> layers_;
  // Repacked (x8 or x16) copies of the quantized matrices, when the CPU has AVX2; 2 MiB aligned so
  // the kernel can back it with huge pages.
  std::unique_ptr<uint8_t, void (*)(void*)> repacked_{nullptr, &std::free};
  uint64_t repacked_bytes_ = 0;
  std::vector<uint8_t> requantized_;  // matrices re-quantized by requantize(), GGUF row layout
};

// A matmul job reading `m` (its packed copy when there is one) and writing y (cols, ldy).
kernels::MatmulJob matmul_job(const WeightMatrix& m, float* y, int64_t ldy);

// The kernel type of a GGUF tensor type, or nullopt for a type the kernels do not compute on.
std::optional<kernels::WeightType> kernel_type_of(gguf::TensorType type);
// The GGUF tensor type of a kernel weight type.
gguf::TensorType tensor_type_of(kernels::WeightType type);
// "F32, F16, BF16, Q8_0, …, IQ4_XS": the types Tokenfab computes on, for messages.
std::string supported_types_text();

// The kernel type for a GGUF tensor type, or throws Error naming the tensor and the types the
// kernels support.
kernels::WeightType weight_type_for(const gguf::TensorInfo& tensor, const std::string& file);

}  // namespace tokenfab
