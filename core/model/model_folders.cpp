#include "core/model/model_folders.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/common/atomic_file.h"
#include "core/common/error.h"

namespace tokenfab {

namespace fs = std::filesystem;

namespace {

const char* nonempty_env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

// The user data home by the rules of user_data_dir() (core/storage/database.h), which this
// module does not link: $TOKENFAB_HOME, else $XDG_DATA_HOME/tokenfab (absolute only), else
// ~/.local/share/tokenfab. Not created here.
fs::path data_home() {
  if (const char* home = nonempty_env("TOKENFAB_HOME")) return home;
  const char* xdg = nonempty_env("XDG_DATA_HOME");
  if (xdg != nullptr && fs::path(xdg).is_absolute()) return fs::path(xdg) / "tokenfab";
  if (const char* home = nonempty_env("HOME"))
    return fs::path(home) / ".local" / "share" / "tokenfab";
  throw Error(
      "cannot place the user data directory: none of TOKENFAB_HOME, XDG_DATA_HOME or HOME is set");
}

}  // namespace

fs::path model_folders_file() {
  return data_home() / "model_folders.json";
}

std::vector<fs::path> user_model_folders() {
  const fs::path file = model_folders_file();
  std::error_code ec;
  if (!fs::exists(file, ec)) return {};
  std::ifstream in(file);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  std::vector<fs::path> folders;
  if (j.is_object() && j.contains("folders") && j["folders"].is_array()) {
    for (const nlohmann::json& f : j["folders"]) {
      if (!f.is_string()) break;
      folders.emplace_back(f.get<std::string>());
    }
    if (folders.size() == j["folders"].size()) return folders;
  }
  throw Error(file.string() + ": expected {\"folders\": [\"/a/folder\", ...]}; fix or delete it");
}

namespace {

void write_model_folders(const std::vector<fs::path>& folders) {
  nlohmann::json list = nlohmann::json::array();
  for (const fs::path& f : folders) list.push_back(f.string());
  const fs::path file = model_folders_file();
  create_folders_for(file);
  write_file_atomically(file, nlohmann::json{{"folders", list}}.dump(2) + "\n");
}

// "/a/b/../c/" as "/a/c": how a folder is stored and compared.
fs::path normal_absolute(const fs::path& folder) {
  std::error_code ec;
  const fs::path absolute = fs::absolute(folder, ec);
  fs::path normal = (ec ? folder : absolute).lexically_normal();
  if (normal.filename().empty() && normal.has_relative_path()) normal = normal.parent_path();
  return normal;
}

}  // namespace

bool add_model_folder(const fs::path& folder) {
  const fs::path dir = normal_absolute(folder);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw Error("not a folder: " + folder.string());
  std::vector<fs::path> folders = user_model_folders();
  if (std::find(folders.begin(), folders.end(), dir) != folders.end()) return false;
  folders.push_back(dir);
  write_model_folders(folders);
  return true;
}

bool remove_model_folder(const fs::path& folder) {
  const fs::path dir = normal_absolute(folder);
  std::vector<fs::path> folders = user_model_folders();
  const auto it = std::remove_if(folders.begin(), folders.end(), [&](const fs::path& f) {
    return normal_absolute(f) == dir || f == folder;
  });
  if (it == folders.end()) return false;
  folders.erase(it, folders.end());
  write_model_folders(folders);
  return true;
}

}  // namespace tokenfab
