// models: the model library (core/model/model_library.h) — every GGUF file Tokenfab knows on this
// machine (its cache, the folders the user added, LM Studio's, GPT4All's and Ollama's models), each
// described from its header: name, family, parameters, type, context length, size, whether
// Tokenfab runs it, and the memory it needs at a context against this machine's memory and GPUs.
// --add-folder / --remove-folder edit the user's folder list. A listed name works as --model.

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli_common.h"
#include "core/common/error.h"
#include "core/device/machine_memory.h"
#include "core/model/model_library.h"

namespace tokenfab::cli {

namespace {

struct ModelsOptions {
  bool json = false;
  int64_t context = 0;  // 0: each model's default_context
  std::optional<std::string> add_folder, remove_folder;
};

nlohmann::json paths_json(const std::vector<std::filesystem::path>& paths) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& p : paths) j.push_back(p.string());
  return j;
}

nlohmann::json model_json(const ModelInfo& m) {
  nlohmann::json mix = nlohmann::json::object();
  for (const auto& [type, share] : m.type_mix.by_type)
    mix[type] = {{"tensors", share.tensors},
                 {"elements", share.elements},
                 {"bytes", share.bytes},
                 {"bytes_fraction", m.type_mix.bytes_fraction(type)}};
  nlohmann::json j = {
      {"name", m.name},
      {"general_name", m.general_name},
      {"path", m.found.path.string()},
      {"parts", paths_json(m.found.parts)},
      {"source", source_name(m.found.source)},
      {"family", m.family},
      {"parameters", m.type_mix.elements},
      {"file_type", m.file_type ? nlohmann::json(*m.file_type) : nlohmann::json()},
      {"type_mix", mix},
      {"bits_per_weight", m.type_mix.bits_per_weight()},
      {"context_length", m.context_length},
      {"file_size", m.file_size},
      {"runnable", m.runnable},
      {"memory",
       {{"context", m.memory.context},
        {"weight_bytes", m.memory.weight_bytes},
        {"kv_bytes_per_token", m.memory.kv_bytes_per_token},
        {"kv_bytes", m.memory.kv_bytes()},
        {"total_bytes", m.memory.total_bytes()}}},
      {"verdict", verdict_text(m.fit.verdict)},
      {"fits_on", m.fit.fits_on},
      {"fit", m.fit.explanation},
  };
  if (!m.found.ollama_name.empty()) j["ollama_name"] = m.found.ollama_name;
  if (!m.runnable) j["not_runnable_because"] = m.not_runnable_because;
  if (!m.kv_note.empty()) j["memory"]["kv_note"] = m.kv_note;
  return j;
}

nlohmann::json library_json(const LibraryRoots& roots, const ModelLibrary& library,
                            const std::vector<MemoryPlace>& places, int64_t context) {
  nlohmann::json models = nlohmann::json::array(), skipped = nlohmann::json::array(),
                 memory = nlohmann::json::array();
  for (const ModelInfo& m : library.models) models.push_back(model_json(m));
  for (const SkippedFile& s : library.skipped)
    skipped.push_back({{"path", s.path.string()}, {"reason", s.reason}});
  for (const MemoryPlace& p : places)
    memory.push_back(
        {{"name", p.name}, {"total_bytes", p.total_bytes}, {"available_bytes", p.available_bytes}});
  return {{"context", context > 0 ? nlohmann::json(context) : nlohmann::json()},
          {"roots",
           {{"tokenfab", roots.tokenfab.string()},
            {"folders", paths_json(roots.user_folders)},
            {"lmstudio", paths_json(roots.lm_studio)},
            {"gpt4all", paths_json(roots.gpt4all)},
            {"ollama", paths_json(roots.ollama)}}},
          {"memory", memory},
          {"models", models},
          {"skipped", skipped}};
}

// 134.5M, 7.24B.
std::string count_text(uint64_t n) {
  char text[32];
  if (n >= 1'000'000'000)
    std::snprintf(text, sizeof text, "%.2fB", static_cast<double>(n) / 1e9);
  else
    std::snprintf(text, sizeof text, "%.1fM", static_cast<double>(n) / 1e6);
  return text;
}

void print_table(const ModelLibrary& library, const std::vector<MemoryPlace>& places) {
  std::vector<std::vector<std::string>> rows = {{"NAME", "SOURCE", "FAMILY", "PARAMS", "TYPE",
                                                 "BPW", "CONTEXT", "SIZE", "RUNS", "NEEDS",
                                                 "VERDICT", "PATH"}};
  for (const ModelInfo& m : library.models) {
    char bpw[16];
    std::snprintf(bpw, sizeof bpw, "%.2f", m.type_mix.bits_per_weight());
    const std::string needs = bytes_text(m.memory.total_bytes()) + " @" +
                              std::to_string(m.memory.context) +
                              (m.kv_note.empty() ? "" : " (no KV)");
    rows.push_back({m.name, source_name(m.found.source), m.family.empty() ? "?" : m.family,
                    count_text(m.type_mix.elements), m.file_type.value_or("?"), bpw,
                    m.context_length > 0 ? std::to_string(m.context_length) : "?",
                    bytes_text(m.file_size), m.runnable ? "yes" : "no", needs,
                    verdict_text(m.fit.verdict), m.found.path.string()});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows)
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c)
      line += c + 1 < row.size() ? row[c] + std::string(width[c] - row[c].size() + 2, ' ') : row[c];
    std::cout << line << "\n";
  }
  if (library.models.empty()) std::cout << "(no GGUF files found)\n";
  std::cout << "memory:";
  for (const MemoryPlace& p : places)
    std::cout << " " << p.name << " " << bytes_text(p.available_bytes) << " available of "
              << bytes_text(p.total_bytes) << ";";
  std::cout << " NEEDS is the weights + the KV cache (fp16) at @context tokens\n";
  for (const ModelInfo& m : library.models)
    if (!m.runnable) std::cout << "cannot run " << m.name << ": " << m.not_runnable_because << "\n";
  for (const SkippedFile& s : library.skipped)
    std::cout << "skipped " << s.path.string() << ": " << s.reason << "\n";
}

void run_models(const ModelsOptions& o) {
  if (o.context < 0) throw Error("--context must be positive, got " + std::to_string(o.context));
  if (o.add_folder) {
    const bool added = add_model_folder(*o.add_folder);
    std::cout << (added ? "added " : "already listed: ") << *o.add_folder << " ("
              << model_folders_file().string() << ")" << std::endl;
    return;
  }
  if (o.remove_folder) {
    if (!remove_model_folder(*o.remove_folder))
      throw Error("not in the model folders: " + *o.remove_folder + " (" +
                  model_folders_file().string() + ")");
    std::cout << "removed " << *o.remove_folder << std::endl;
    return;
  }
  const LibraryRoots roots = LibraryRoots::from_environment();
  const std::vector<MemoryPlace> places = machine_memory();
  const ModelLibrary library = scan_library(roots, o.context, places);
  if (o.json) {
    print_json(library_json(roots, library, places, o.context));
  } else {
    print_table(library, places);
  }
}

}  // namespace

void register_models(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "models",
      "list every GGUF model on this machine (Tokenfab's cache, your folders, LM Studio, GPT4All, "
      "Ollama): family, parameters, type, context, size, whether Tokenfab runs it, and whether it "
      "fits in memory; a listed name works as --model");
  auto o = std::make_shared<ModelsOptions>();
  cmd->add_flag("--json", o->json, "one JSON object on stdout");
  cmd->add_option("--context", o->context,
                  "size the KV cache for this many tokens (default: each model's context length, "
                  "at most 4096)");
  auto* add = cmd->add_option("--add-folder", o->add_folder, "add a folder to search for models");
  auto* remove = cmd->add_option("--remove-folder", o->remove_folder,
                                 "remove a folder added with --add-folder");
  add->excludes(remove);
  cmd->callback([o] { run_models(*o); });
}

}  // namespace tokenfab::cli
