#include "core/storage/runs.h"

#include <chrono>

#include <nlohmann/json.hpp>

namespace tokenfab {

namespace {

constexpr const char* kColumns =
    "SELECT id, kind, title, model, config_json, summary_json, created_ms FROM runs";

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void check_json_object(const std::string& text, const std::string& what) {
  nlohmann::json parsed;
  try {
    parsed = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error("run " + what + " is not valid JSON: " + e.what());
  }
  if (!parsed.is_object())
    throw Error("run " + what + " must be a JSON object, not " + parsed.type_name());
}

RunRecord read_run(const sqlite::Statement& row) {
  return RunRecord{row.column_int64(0), row.column_text(1), row.column_text(2), row.column_text(3),
                   row.column_text(4),  row.column_text(5), row.column_int64(6)};
}

}  // namespace

int64_t RunStore::add(const RunRecord& run) {
  if (run.kind.empty()) throw Error("a run needs a kind (e.g. \"serve-bench\")");
  check_json_object(run.config_json, "config");
  check_json_object(run.summary_json, "summary");
  const int64_t created = run.created_at_ms != 0 ? run.created_at_ms : now_ms();
  sqlite::Statement insert(db_.connection(),
                           "INSERT INTO runs (kind, title, model, config_json, summary_json, "
                           "created_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)");
  insert.bind(1, run.kind).bind(2, run.title).bind(3, run.model);
  insert.bind(4, run.config_json).bind(5, run.summary_json).bind(6, created);
  insert.run();
  return db_.connection().last_insert_rowid();
}

std::vector<RunRecord> RunStore::list(const std::string& kind, int limit) const {
  sqlite::Statement select(db_.connection(),
                           std::string(kColumns) +
                               " WHERE ?1 = '' OR kind = ?1 ORDER BY created_ms DESC, id DESC "
                               "LIMIT ?2");
  select.bind(1, kind).bind(2, limit);
  std::vector<RunRecord> out;
  while (select.step()) out.push_back(read_run(select));
  return out;
}

std::optional<RunRecord> RunStore::get(int64_t id) const {
  sqlite::Statement select(db_.connection(), std::string(kColumns) + " WHERE id = ?1");
  select.bind(1, id);
  if (!select.step()) return std::nullopt;
  return read_run(select);
}

void RunStore::remove(int64_t id) {
  sqlite::Statement erase(db_.connection(), "DELETE FROM runs WHERE id = ?1");
  erase.bind(1, id);
  erase.run();
  if (db_.connection().changes() == 0) throw Error("no run with id " + std::to_string(id));
}

}  // namespace tokenfab
