#include "core/storage/database.h"

#include <cstdlib>
#include <string>
#include <system_error>

#include <sqlite3.h>

#include "core/common/log.h"
#include "core/storage/recovery.h"
#include "core/storage/schema.h"

namespace tokenfab {

namespace fs = std::filesystem;

namespace {

constexpr int kBusyTimeoutMs = 5000;

const char* nonempty_env(const char* name) {
  const char* value = std::getenv(name);
  return value && *value ? value : nullptr;
}

int64_t query_int(sqlite::Connection& connection, const char* sql) {
  sqlite::Statement statement(connection, sql);
  return statement.step() ? statement.column_int64(0) : 0;
}

}  // namespace

fs::path user_data_dir() {
  fs::path dir;
  const char* xdg = nonempty_env("XDG_DATA_HOME");
  if (const char* home = nonempty_env("TOKENFAB_HOME")) {
    dir = home;
  } else if (xdg && fs::path(xdg).is_absolute()) {  // the XDG spec ignores relative paths
    dir = fs::path(xdg) / "tokenfab";
  } else if (const char* user_home = nonempty_env("HOME")) {
    dir = fs::path(user_home) / ".local" / "share" / "tokenfab";
  } else {
    throw Error(
        "cannot place the user data directory: none of TOKENFAB_HOME, XDG_DATA_HOME or HOME is "
        "set");
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw Error("cannot create the user data directory " + dir.string() + ": " + ec.message());
  return dir;
}

std::unique_ptr<Database> Database::open(const fs::path& file) {
  if (file.has_parent_path()) {
    std::error_code ec;
    fs::create_directories(file.parent_path(), ec);
    if (ec) {
      throw Error("database " + file.string() + ": cannot create its directory: " + ec.message());
    }
  }
  std::unique_ptr<Database> db(new Database());
  db->connection_.open(file);
  db->connection_.set_busy_timeout(kBusyTimeoutMs);
  // Nothing is written before the file is known to be ours and not from a newer build.
  db->check_is_tokenfab_database();
  db->enable_wal_and_foreign_keys();
  db->migrate();
  db->recover();
  return db;
}

std::unique_ptr<Database> Database::open_default() {
  return open(user_data_dir() / "tokenfab.db");
}

int Database::schema_version() const {
  return static_cast<int>(query_int(connection_, "PRAGMA user_version"));
}

int Database::latest_schema_version() {
  return schema::migrations().back().version;
}

void Database::check_is_tokenfab_database() {
  const std::string name = "database " + path().string();
  int64_t version = 0, application_id = 0, objects = 0;
  try {
    version = query_int(connection_, "PRAGMA user_version");
    application_id = query_int(connection_, "PRAGMA application_id");
    objects = query_int(connection_, "SELECT count(*) FROM sqlite_schema");
  } catch (const sqlite::SqliteError& e) {
    const int code = e.primary_code();
    if (code != SQLITE_NOTADB && code != SQLITE_CORRUPT) throw;
    throw Error(name + " is not a Tokenfab database (or is corrupt): " + sqlite3_errstr(code));
  }
  if (version == 0 && objects > 0) {
    throw Error(name +
                " is not a Tokenfab database: it is a SQLite database that already holds tables "
                "but has no Tokenfab schema version");
  }
  if (version > 0 && application_id != schema::kApplicationId) {
    throw Error(name + " is not a Tokenfab database: its application id is " +
                std::to_string(application_id) + ", expected " +
                std::to_string(schema::kApplicationId));
  }
  if (version > latest_schema_version()) {
    throw Error(name + " has schema version " + std::to_string(version) +
                ", newer than this build of Tokenfab knows (" +
                std::to_string(latest_schema_version()) +
                "); use a newer Tokenfab or another data directory (TOKENFAB_HOME)");
  }
}

void Database::enable_wal_and_foreign_keys() {
  sqlite::Statement wal(connection_, "PRAGMA journal_mode = WAL");
  const std::string mode = wal.step() ? wal.column_text(0) : std::string();
  if (mode != "wal") {
    throw Error("database " + path().string() +
                ": cannot switch to write-ahead logging (journal mode stays '" + mode +
                "'); is it on a file system without shared memory support?");
  }
  connection_.exec("PRAGMA foreign_keys = ON");
}

void Database::migrate() {
  for (const schema::Migration& migration : schema::migrations()) {
    if (schema_version() >= migration.version) continue;
    sqlite::Transaction transaction(connection_);
    // Another process may have migrated between the check and taking the write lock.
    const int version = schema_version();
    if (version > latest_schema_version()) check_is_tokenfab_database();  // throws
    if (version >= migration.version) continue;  // the destructor ends the empty transaction
    connection_.exec(migration.sql);
    connection_.exec("PRAGMA user_version = " + std::to_string(migration.version));
    transaction.commit();
    logger("storage")->info("database {}: migrated to schema version {}", path().string(),
                            migration.version);
  }
}

void Database::recover() {
  try {
    const Recovered r = mark_interrupted_work(*this);
    if (r.replies > 0 || r.training_runs > 0)
      logger("storage")->info(
          "database {}: marked what a crash or kill left unfinished: {} replies interrupted, {} "
          "training runs cancelled",
          path().string(), r.replies, r.training_runs);
  } catch (const sqlite::SqliteError& e) {
    // Busy past the timeout, say: the rows stay as they are until the next open.
    logger("storage")->warn("database {}: cannot mark unfinished work yet: {}", path().string(),
                            e.what());
  }
}

}  // namespace tokenfab
