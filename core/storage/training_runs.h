#pragma once
// Draft-head training runs (core/training/head_training_job.h), one row from a run's start, on a
// Database's connection: "running" while it trains, then how it ended. A running row names this
// process as its writer; when the process ends mid-run (a crash, a kill) the next Database::open
// marks it "cancelled" with a note (core/storage/recovery.h), so no run stays "running" forever.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/storage/database.h"

namespace tokenfab {

struct TrainingRunRecord {
  int64_t id = 0;
  std::string head_name;  // the name the head is saved under
  std::string domain;
  std::string type;  // "medusa" | "mtp"
  std::string base_model_sha256;
  std::string config_json = "{}";  // the request: a JSON object
  std::string state;               // "running" | "finished" | "failed" | "cancelled"
  std::string note;                // why it ended when not finished (the error, ...), else ""
  int64_t step = 0;                // the last training step recorded
  int64_t steps = 0;               // asked for
  int64_t head_id = 0;             // the saved head (finished runs), else 0
  int64_t started_ms = 0, updated_ms = 0;  // unix milliseconds
};

class TrainingRuns {
 public:
  explicit TrainingRuns(Database& db) : db_(db) {}

  // Adds a "running" row written by this process; returns its id. Throws Error for a config that
  // is not a JSON object.
  int64_t begin(const TrainingRunRecord& run);
  // Records the step reached (call it every few seconds, not every step).
  void set_step(int64_t id, int64_t step);
  // Ends a running run: "finished" (with the head's id), "failed" or "cancelled" (with a note).
  // Throws Error for another state or an unknown id.
  void end(int64_t id, std::string_view state, std::string_view note, int64_t head_id = 0);
  std::optional<TrainingRunRecord> get(int64_t id) const;
  // Newest first.
  std::vector<TrainingRunRecord> list(int limit = 500) const;

 private:
  Database& db_;
};

}  // namespace tokenfab
