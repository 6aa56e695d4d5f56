#include "core/storage/registry.h"

#include <algorithm>
#include <chrono>
#include <string>

#include <nlohmann/json.hpp>

namespace tokenfab {

namespace fs = std::filesystem;

namespace {

constexpr const char* kHeadColumns =
    "h.id, h.name, h.domain, h.type, h.base_model_sha256, h.file, h.created_unix, "
    "h.training_config_json, h.summary_json";
constexpr const char* kEvaluationColumns =
    "e.id, e.head_id, e.domain, e.spec, e.accept_per_step, e.per_position_json, e.decode_tok_s, "
    "e.baseline_decode_tok_s, e.target_quant, e.prompts, e.tokens, e.created_unix, "
    "e.native_decode_tok_s, e.devices";
constexpr int kHeadColumnCount = 9;

int64_t now_unix() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string in_quotes(std::string_view s) {
  return "'" + std::string(s) + "'";
}

// Reads the head columns (kHeadColumns) starting at column `first`.
HeadRecord read_head(const sqlite::Statement& row, int first = 0) {
  HeadRecord head;
  head.id = row.column_int64(first + 0);
  head.name = row.column_text(first + 1);
  head.domain = row.column_text(first + 2);
  head.type = row.column_text(first + 3);
  head.base_model_sha256 = row.column_text(first + 4);
  head.file = row.column_text(first + 5);
  head.created_unix = row.column_int64(first + 6);
  head.training_config_json = row.column_text(first + 7);
  head.summary_json = row.column_text(first + 8);
  return head;
}

EvaluationRecord read_evaluation(const sqlite::Statement& row, const fs::path& db_file,
                                 int first = 0) {
  EvaluationRecord e;
  e.id = row.column_int64(first + 0);
  e.head_id = row.column_int64(first + 1);
  e.domain = row.column_text(first + 2);
  e.spec = row.column_text(first + 3);
  e.accept_per_step = row.column_double(first + 4);
  const std::string per_position = row.column_text(first + 5);
  e.decode_tok_s = row.column_double(first + 6);
  e.baseline_decode_tok_s = row.column_double(first + 7);
  e.target_quant = row.column_text(first + 8);
  e.prompts = row.column_int64(first + 9);
  e.tokens = row.column_int64(first + 10);
  e.created_unix = row.column_int64(first + 11);
  e.native_decode_tok_s = row.column_double(first + 12);
  e.devices = row.column_text(first + 13);
  try {
    e.per_position = nlohmann::json::parse(per_position).get<std::vector<double>>();
  } catch (const nlohmann::json::exception& ex) {
    throw Error("database " + db_file.string() + ": evaluation " + std::to_string(e.id) +
                ": per_position_json is not an array of numbers: " + ex.what());
  }
  return e;
}

// Empty means {}; anything else must parse.
std::string json_or_empty_object(const std::string& text, const std::string& what) {
  if (text.empty()) return "{}";
  if (!nlohmann::json::accept(text)) throw Error(what + " is not valid JSON");
  return text;
}

void validate_head(const HeadRecord& head) {
  const std::string what = "head " + in_quotes(head.name);
  if (head.name.empty()) throw Error("a head needs a name");
  if (all_digits(head.name)) {
    throw Error(what + ": a name of digits only would read as an id; add a letter");
  }
  if (head.type != "medusa" && head.type != "mtp") {
    throw Error(what + ": type " + in_quotes(head.type) + " is not one of medusa, mtp");
  }
  if (head.domain.empty()) throw Error(what + ": the domain is empty");
  if (head.base_model_sha256.empty()) throw Error(what + ": the base model sha256 is empty");
  if (head.file.empty()) throw Error(what + ": the file is empty");
}

}  // namespace

int64_t Registry::add_model(const ModelRecord& model) {
  if (model.sha256.empty()) throw Error("model " + in_quotes(model.name) + ": the sha256 is empty");
  sqlite::Statement upsert(db_.connection(),
                           "INSERT INTO models (sha256, name, path, added_unix) "
                           "VALUES (?1, ?2, ?3, ?4) ON CONFLICT (sha256) DO UPDATE SET "
                           "name = excluded.name, path = excluded.path RETURNING id");
  upsert.bind(1, model.sha256).bind(2, model.name).bind(3, model.path);
  upsert.bind(4, model.added_unix != 0 ? model.added_unix : now_unix());
  upsert.step();
  const int64_t id = upsert.column_int64(0);
  upsert.run();  // the implicit transaction ends when the statement is done
  return id;
}

std::optional<ModelRecord> Registry::find_model(std::string_view sha256) {
  sqlite::Statement select(db_.connection(),
                           "SELECT id, sha256, name, path, added_unix FROM models "
                           "WHERE sha256 = ?1");
  select.bind(1, sha256);
  if (!select.step()) return std::nullopt;
  return ModelRecord{select.column_int64(0), select.column_text(1), select.column_text(2),
                     select.column_text(3), select.column_int64(4)};
}

int64_t Registry::add_domain(const DomainRecord& domain) {
  if (domain.name.empty()) throw Error("a domain needs a name");
  if (domain.source != "builtin" && domain.source != "user") {
    throw Error("domain " + in_quotes(domain.name) + ": source " + in_quotes(domain.source) +
                " is not one of builtin, user");
  }
  sqlite::Statement upsert(db_.connection(),
                           "INSERT INTO domains (name, description, source) VALUES (?1, ?2, ?3) "
                           "ON CONFLICT (name) DO UPDATE SET description = excluded.description, "
                           "source = excluded.source RETURNING id");
  upsert.bind(1, domain.name).bind(2, domain.description).bind(3, domain.source);
  upsert.step();
  const int64_t id = upsert.column_int64(0);
  upsert.run();
  return id;
}

std::vector<DomainRecord> Registry::domains() {
  sqlite::Statement select(db_.connection(),
                           "SELECT id, name, description, source FROM domains ORDER BY name");
  std::vector<DomainRecord> out;
  while (select.step()) {
    out.push_back({select.column_int64(0), select.column_text(1), select.column_text(2),
                   select.column_text(3)});
  }
  return out;
}

int64_t Registry::add_head(HeadRecord head) {
  validate_head(head);
  const std::string what = "head " + in_quotes(head.name);
  head.training_config_json =
      json_or_empty_object(head.training_config_json, what + ": the training config");
  head.summary_json = json_or_empty_object(head.summary_json, what + ": the summary");
  if (head.created_unix == 0) head.created_unix = now_unix();

  sqlite::Transaction transaction(db_.connection());
  sqlite::Statement taken(db_.connection(), "SELECT id FROM heads WHERE name = ?1");
  taken.bind(1, head.name);
  if (taken.step()) {
    throw Error("a head named " + in_quotes(head.name) + " already exists (id " +
                std::to_string(taken.column_int64(0)) + ")");
  }
  sqlite::Statement insert(db_.connection(),
                           "INSERT INTO heads (name, domain, type, base_model_sha256, file, "
                           "created_unix, training_config_json, summary_json) "
                           "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)");
  insert.bind(1, head.name).bind(2, head.domain).bind(3, head.type);
  insert.bind(4, head.base_model_sha256).bind(5, head.file).bind(6, head.created_unix);
  insert.bind(7, head.training_config_json).bind(8, head.summary_json);
  insert.run();
  const int64_t id = db_.connection().last_insert_rowid();
  transaction.commit();
  return id;
}

std::optional<HeadRecord> Registry::find_head(std::string_view id_or_name) {
  const bool by_id = all_digits(id_or_name);
  sqlite::Statement select(db_.connection(), std::string("SELECT ") + kHeadColumns +
                                                 " FROM heads h WHERE " +
                                                 (by_id ? "h.id = ?1" : "h.name = ?1"));
  if (by_id) {
    // More digits than an int64 holds cannot be an id that exists.
    if (id_or_name.size() > 18) return std::nullopt;
    select.bind(1, static_cast<int64_t>(std::stoll(std::string(id_or_name))));
  } else {
    select.bind(1, id_or_name);
  }
  if (!select.step()) return std::nullopt;
  return read_head(select);
}

std::vector<HeadRecord> Registry::heads() {
  sqlite::Statement select(db_.connection(), std::string("SELECT ") + kHeadColumns +
                                                 " FROM heads h ORDER BY h.created_unix DESC, "
                                                 "h.id DESC");
  std::vector<HeadRecord> out;
  while (select.step()) out.push_back(read_head(select));
  return out;
}

bool Registry::remove_head(int64_t id) {
  // One statement: the evaluations go with it through ON DELETE CASCADE, atomically.
  sqlite::Statement remove(db_.connection(), "DELETE FROM heads WHERE id = ?1");
  remove.bind(1, id);
  remove.run();
  return db_.connection().changes() > 0;
}

fs::path Registry::head_file(const HeadRecord& head) const {
  fs::path file = head.file;
  if (file.is_relative()) file = db_.path().parent_path() / file;
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) {
    const std::string problem = fs::exists(file, ec) ? " is not a regular file" : " is missing";
    throw Error("head " + in_quotes(head.name) + " (id " + std::to_string(head.id) +
                "): its file " + file.string() + problem + "; delete the head or restore the file");
  }
  return file;
}

int64_t Registry::add_evaluation(const EvaluationRecord& evaluation) {
  const std::string what = "evaluation of head id " + std::to_string(evaluation.head_id);
  if (evaluation.spec != "chain" && evaluation.spec != "tree") {
    throw Error(what + ": spec " + in_quotes(evaluation.spec) + " is not one of chain, tree");
  }
  if (evaluation.domain.empty()) throw Error(what + ": the domain is empty");
  if (evaluation.target_quant.empty()) throw Error(what + ": the target quant is empty");

  sqlite::Transaction transaction(db_.connection());
  sqlite::Statement head(db_.connection(), "SELECT 1 FROM heads WHERE id = ?1");
  head.bind(1, evaluation.head_id);
  if (!head.step()) throw Error(what + ": there is no head with that id");
  sqlite::Statement insert(db_.connection(),
                           "INSERT INTO evaluations (head_id, domain, spec, accept_per_step, "
                           "per_position_json, decode_tok_s, baseline_decode_tok_s, target_quant, "
                           "prompts, tokens, created_unix, native_decode_tok_s, devices) "
                           "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)");
  insert.bind(1, evaluation.head_id).bind(2, evaluation.domain).bind(3, evaluation.spec);
  insert.bind(4, evaluation.accept_per_step);
  insert.bind(5, nlohmann::json(evaluation.per_position).dump());
  insert.bind(6, evaluation.decode_tok_s).bind(7, evaluation.baseline_decode_tok_s);
  insert.bind(8, evaluation.target_quant).bind(9, evaluation.prompts).bind(10, evaluation.tokens);
  insert.bind(11, evaluation.created_unix != 0 ? evaluation.created_unix : now_unix());
  insert.bind(12, evaluation.native_decode_tok_s).bind(13, evaluation.devices);
  insert.run();
  const int64_t id = db_.connection().last_insert_rowid();
  transaction.commit();
  return id;
}

std::vector<EvaluationRecord> Registry::evaluations(int64_t head_id) {
  sqlite::Statement select(db_.connection(), std::string("SELECT ") + kEvaluationColumns +
                                                 " FROM evaluations e WHERE e.head_id = ?1 "
                                                 "ORDER BY e.created_unix DESC, e.id DESC");
  select.bind(1, head_id);
  std::vector<EvaluationRecord> out;
  while (select.step()) out.push_back(read_evaluation(select, db_.path()));
  return out;
}

std::optional<std::pair<HeadRecord, EvaluationRecord>> Registry::best_head_for(
    std::string_view domain, std::string_view base_model_sha256, std::string_view spec) {
  auto ranked = heads_for(domain, base_model_sha256, spec);
  if (ranked.empty()) return std::nullopt;
  return std::move(ranked.front());
}

std::vector<std::pair<HeadRecord, EvaluationRecord>> Registry::heads_for(
    std::string_view domain, std::string_view base_model_sha256, std::string_view spec) {
  // Every matching evaluation, best first (ties go to the newer one); each head keeps its first.
  sqlite::Statement select(db_.connection(),
                           std::string("SELECT ") + kHeadColumns + ", " + kEvaluationColumns +
                               " FROM evaluations e JOIN heads h ON h.id = e.head_id "
                               "WHERE e.domain = ?1 AND h.base_model_sha256 = ?2 AND e.spec = ?3 "
                               "AND e.target_quant = 'native' "
                               "ORDER BY e.accept_per_step DESC, e.created_unix DESC, e.id DESC");
  select.bind(1, domain).bind(2, base_model_sha256).bind(3, spec);
  std::vector<std::pair<HeadRecord, EvaluationRecord>> out;
  while (select.step()) {
    HeadRecord head = read_head(select);
    if (std::any_of(out.begin(), out.end(), [&](const auto& e) { return e.first.id == head.id; }))
      continue;
    out.emplace_back(std::move(head), read_evaluation(select, db_.path(), kHeadColumnCount));
  }
  return out;
}

}  // namespace tokenfab
