#include "ui/models/library_scan.h"

#include <algorithm>
#include <exception>

#include "core/device/machine_memory.h"

namespace tokenfab::ui {

namespace fs = std::filesystem;

FoundModel opened_model(const fs::path& path) {
  FoundModel found;
  found.path = fs::absolute(path);
  found.source = ModelSource::kUserFolder;  // shown as "opened" by ModelLibraryModel
  found.parts = {found.path};
  return found;
}

bool same_file(const fs::path& a, const fs::path& b) {
  std::error_code ec;
  return fs::equivalent(a, b, ec);
}

LibraryScan LibraryScan::run(const std::vector<fs::path>& opened) {
  LibraryScan scan;
  try {
    scan.places = machine_memory();
    const LibraryRoots roots = LibraryRoots::from_environment();
    scan.folders = roots.user_folders;
    scan.library = scan_library(roots, 0, scan.places);
  } catch (const std::exception& e) {
    scan.error = e.what();
  }
  for (const fs::path& path : opened) {
    const auto& models = scan.library.models;
    if (std::any_of(models.begin(), models.end(),
                    [&](const ModelInfo& m) { return same_file(m.found.path, path); }))
      continue;
    try {
      scan.library.models.push_back(describe_model(opened_model(path), 0, scan.places));
    } catch (const std::exception& e) {
      scan.library.skipped.push_back({path, e.what()});
    }
  }
  return scan;
}

}  // namespace tokenfab::ui
