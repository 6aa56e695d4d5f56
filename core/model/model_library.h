#pragma once
// The model library: every GGUF file Tokenfab knows on this machine, described from its header.
//
// Where it looks (a folder that is absent is passed over):
//   tokenfab  its own cache, models_dir() (the files `tokenfab-cli fetch` stores);
//   folder    the folders the user added (model_folders_file(), `tokenfab-cli models
//             --add-folder DIR`), searched a few levels deep;
//   lmstudio  ~/.lmstudio/models and the older ~/.cache/lm-studio/models, laid out as
//             publisher/repo/*.gguf;
//   gpt4all   ~/.local/share/nomic.ai/GPT4All/*.gguf ($XDG_DATA_HOME/nomic.ai/GPT4All when set);
//   ollama    $OLLAMA_MODELS, else ~/.ollama/models, and the Linux service's
//             /usr/share/ollama/.ollama/models: manifests/<registry>/<namespace>/<model>/<tag> are
//             JSON whose layer of mediaType application/vnd.ollama.image.model names the GGUF blob
//             blobs/sha256-<hex>; listed as model:tag (namespace/model:tag outside `library`).
//
// What it reads: the GGUF header and metadata only, never the weights, so any valid GGUF is
// described — architectures Tokenfab cannot run included. A file it cannot read, or that is not
// GGUF, is skipped with a note; a split model (NAME-00001-of-0000N.gguf) is listed once, under its
// first part, with the tensors of all its parts.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/gguf/type_mix.h"
#include "core/model/model_folders.h"
#include "core/model/model_memory.h"

namespace tokenfab {

enum class ModelSource : uint8_t { kTokenfab, kUserFolder, kLmStudio, kGpt4All, kOllama };
// "tokenfab", "folder", "lmstudio", "gpt4all", "ollama".
const char* source_name(ModelSource source);

// Where the library looks.
struct LibraryRoots {
  std::filesystem::path tokenfab;  // models_dir()
  std::vector<std::filesystem::path> user_folders;
  std::vector<std::filesystem::path> lm_studio;
  std::vector<std::filesystem::path> gpt4all;
  std::vector<std::filesystem::path> ollama;

  // From the environment (HOME, TOKENFAB_HOME, XDG_CACHE_HOME, XDG_DATA_HOME, OLLAMA_MODELS) and
  // the user's folder list. Throws Error for a folder list that cannot be read.
  static LibraryRoots from_environment();
};

// A GGUF file found on disk, before its header is read.
struct FoundModel {
  std::filesystem::path path;  // the file; a split model's first part
  ModelSource source = ModelSource::kTokenfab;
  std::string ollama_name;                   // "model:tag" for Ollama; empty otherwise
  std::vector<std::filesystem::path> parts;  // every file of the model, in order (path first)
};

struct SkippedFile {
  std::filesystem::path path;
  std::string reason;
};

// Every GGUF file under `roots`, in the order of the roots above (each root's files sorted by
// path); a file reached twice (a user folder inside another root) is listed once. Reads directory
// entries and Ollama manifests only; what it cannot use is added to `skipped` with the reason.
std::vector<FoundModel> find_models(const LibraryRoots& roots, std::vector<SkippedFile>& skipped);

// What the library shows of one model.
struct ModelInfo {
  FoundModel found;
  std::string name;                      // Ollama: model:tag; else general.name, else the file stem
  std::string general_name;              // general.name; empty when not stated
  std::string family;                    // general.architecture; empty when not stated
  std::optional<std::string> file_type;  // general.file_type's name ("Q4_K_M")
  gguf::TypeMix type_mix;                // all parts; type_mix.elements is the parameter count
  int64_t context_length = 0;            // <arch>.context_length; 0 when not stated
  uint64_t file_size = 0;                // all parts
  bool runnable = false;
  std::string not_runnable_because;
  // weights + KV at the context; kv_bytes_per_token 0 (and kv_note why) when the file states no
  // attention shape.
  ModelMemory memory;
  std::string kv_note;
  Fit fit;
};

// Reads the header of every part of `found` and describes it; the KV cache sized for `context`
// positions (0: default_context(context_length)); the fit judged against `places`. Throws Error
// for a file that is not a readable GGUF.
ModelInfo describe_model(const FoundModel& found, int64_t context,
                         const std::vector<MemoryPlace>& places);

struct ModelLibrary {
  std::vector<ModelInfo> models;
  std::vector<SkippedFile> skipped;
};

// find_models then describe_model for each; a file that cannot be described is skipped with the
// reason. Never throws for a file.
ModelLibrary scan_library(const LibraryRoots& roots, int64_t context,
                          const std::vector<MemoryPlace>& places);

// The model whose name is `name`: an Ollama model:tag (model alone means model:latest), a file
// stem or file name, else a general.name. Throws Error "model file not found: NAME, …" listing
// the nearest names the library holds when none matches, or naming the files when several do.
std::filesystem::path find_model_by_name(const std::string& name);

// The model to use: `requested` when given — a path, or when no such path exists a name the model
// library knows (find_model_by_name: an Ollama model:tag, a file stem, a general.name) — else the
// embedded default (must have been fetched). Throws Error with a message saying how to fetch it or
// pass --model PATH, or listing the nearest names.
std::filesystem::path resolve_model_path(const std::optional<std::string>& requested);

// Refuses a model that does not fit before anything is allocated: throws Error naming the file,
// what it needs (the weights + the KV cache for `context` positions — all of a device's KV pools
// together, blocks × block size) and what each place has, unless it fits in the available memory
// of every place in `places` (the memories it is about to be loaded into: the host once for all
// CPU virtual devices, each GPU it uses). Reads the header only. Throws Error for an unreadable
// file as well.
void check_fits(const std::filesystem::path& file, int64_t context,
                const std::vector<MemoryPlace>& places = {host_memory()});

}  // namespace tokenfab
