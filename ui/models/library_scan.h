#pragma once
// LibraryScan: what the Models page lists, read on a thread of its own (it touches the disk and,
// to enumerate GPUs, the CUDA runtime): this machine's memories, the model library
// (core/model/model_library.h) and the files the user opened from elsewhere.

#include <filesystem>
#include <string>
#include <vector>

#include "core/model/model_library.h"

namespace tokenfab::ui {

struct LibraryScan {
  ModelLibrary library;
  std::vector<MemoryPlace> places;             // machine_memory(): the host first, then GPUs
  std::vector<std::filesystem::path> folders;  // the user's model folders
  std::string error;                           // the folder list could not be read; else empty

  // The library at each model's default context, and each of `opened` the library does not list
  // (described, or skipped with the reason). Never throws.
  static LibraryScan run(const std::vector<std::filesystem::path>& opened);
};

// A file the user opened, as the library would have found it: one part, absolute path.
FoundModel opened_model(const std::filesystem::path& path);
// Both name the same file (false when either is missing).
bool same_file(const std::filesystem::path& a, const std::filesystem::path& b);

}  // namespace tokenfab::ui
