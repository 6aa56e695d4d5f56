#include "core/model/model_files.h"

#include <cstdlib>

#include "core/common/error.h"

namespace tokenfab {

namespace fs = std::filesystem;

static std::optional<fs::path> env_path(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return fs::path(value);
}

fs::path models_dir() {
  if (auto home = env_path("TOKENFAB_HOME")) return *home / "models";
  if (auto cache = env_path("XDG_CACHE_HOME")) return *cache / "tokenfab" / "models";
  if (auto home = env_path("HOME")) return *home / ".cache" / "tokenfab" / "models";
  return fs::current_path() / ".tokenfab" / "models";
}

fs::path default_model_path() { return models_dir() / EmbeddedModel::kFileName; }

fs::path gemma3_model_path() { return models_dir() / Gemma3Model::kFileName; }

}  // namespace tokenfab
