#include "core/storage/training_runs.h"

#include <chrono>

#include <nlohmann/json.hpp>

#include "core/storage/live_writer.h"

namespace tokenfab {

namespace {

constexpr const char* kColumns =
    "SELECT id, head_name, domain, type, base_model_sha256, config_json, state, note, step, "
    "steps, coalesce(head_id, 0), started_ms, updated_ms FROM training_runs";

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

TrainingRunRecord read_run(const sqlite::Statement& row) {
  TrainingRunRecord r;
  r.id = row.column_int64(0);
  r.head_name = row.column_text(1);
  r.domain = row.column_text(2);
  r.type = row.column_text(3);
  r.base_model_sha256 = row.column_text(4);
  r.config_json = row.column_text(5);
  r.state = row.column_text(6);
  r.note = row.column_text(7);
  r.step = row.column_int64(8);
  r.steps = row.column_int64(9);
  r.head_id = row.column_int64(10);
  r.started_ms = row.column_int64(11);
  r.updated_ms = row.column_int64(12);
  return r;
}

}  // namespace

int64_t TrainingRuns::begin(const TrainingRunRecord& run) {
  const nlohmann::json config = nlohmann::json::parse(run.config_json, nullptr, false);
  if (!config.is_object()) throw Error("a training run's config must be a JSON object");
  const int64_t now = now_ms();
  sqlite::Statement insert(
      db_.connection(),
      "INSERT INTO training_runs (head_name, domain, type, base_model_sha256, config_json, state, "
      "note, step, steps, started_ms, updated_ms, writer) "
      "VALUES (?1, ?2, ?3, ?4, ?5, 'running', '', 0, ?6, ?7, ?7, ?8)");
  insert.bind(1, run.head_name).bind(2, run.domain).bind(3, run.type);
  insert.bind(4, run.base_model_sha256).bind(5, run.config_json).bind(6, run.steps);
  insert.bind(7, now).bind(8, this_writer());
  insert.run();
  return db_.connection().last_insert_rowid();
}

void TrainingRuns::set_step(int64_t id, int64_t step) {
  sqlite::Statement update(db_.connection(),
                           "UPDATE training_runs SET step = ?2, updated_ms = ?3 "
                           "WHERE id = ?1 AND state = 'running'");
  update.bind(1, id).bind(2, step).bind(3, now_ms());
  update.run();
}

void TrainingRuns::end(int64_t id, std::string_view state, std::string_view note, int64_t head_id) {
  if (state != "finished" && state != "failed" && state != "cancelled")
    throw Error("a training run ends finished, failed or cancelled, not '" + std::string(state) +
                "'");
  sqlite::Statement update(db_.connection(),
                           "UPDATE training_runs SET state = ?2, note = ?3, head_id = ?4, "
                           "updated_ms = ?5, writer = NULL WHERE id = ?1");
  update.bind(1, id).bind(2, state).bind(3, note).bind(5, now_ms());
  if (head_id > 0)
    update.bind(4, head_id);
  else
    update.bind_null(4);
  update.run();
  if (db_.connection().changes() == 0) throw Error("no training run with id " + std::to_string(id));
}

std::optional<TrainingRunRecord> TrainingRuns::get(int64_t id) const {
  sqlite::Statement select(db_.connection(), std::string(kColumns) + " WHERE id = ?1");
  select.bind(1, id);
  if (!select.step()) return std::nullopt;
  return read_run(select);
}

std::vector<TrainingRunRecord> TrainingRuns::list(int limit) const {
  sqlite::Statement select(db_.connection(),
                           std::string(kColumns) + " ORDER BY started_ms DESC, id DESC LIMIT ?1");
  select.bind(1, limit);
  std::vector<TrainingRunRecord> out;
  while (select.step()) out.push_back(read_run(select));
  return out;
}

}  // namespace tokenfab
