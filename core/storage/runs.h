#pragma once
// Past runs (serve-bench, demo, ...) and their measured figures, on a Database's connection: what
// the desktop app's History page lists and compares. Draft-head evaluations are not runs; they stay
// in the registry's evaluations table (core/storage/registry.h).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/storage/database.h"

namespace tokenfab {

struct RunRecord {
  int64_t id = 0;
  std::string kind;           // "serve-bench", "demo", "screenshot-workload", ...
  std::string title;          // a short human label, e.g. "serve-bench colocated 36 req"
  std::string model;          // the model file's name
  std::string config_json;    // the run's settings: a JSON object
  std::string summary_json;   // the run's measured figures: a JSON object (nested objects allowed)
  int64_t created_at_ms = 0;  // unix milliseconds; 0 on add(): now
};

class RunStore {
 public:
  explicit RunStore(Database& db) : db_(db) {}

  // Returns the new id. Throws Error (and stores nothing) for an empty kind, or a config or
  // summary that is not a JSON object.
  int64_t add(const RunRecord& run);
  // Newest first (ties: newest id first); only runs of `kind` when it is not empty.
  std::vector<RunRecord> list(const std::string& kind = {}, int limit = 500) const;
  std::optional<RunRecord> get(int64_t id) const;
  // Throws Error for an unknown id.
  void remove(int64_t id);

 private:
  Database& db_;
};

}  // namespace tokenfab
