#include "core/storage/sqlite.h"

#include <atomic>

#include <sqlite3.h>

namespace tokenfab::sqlite {

namespace {

// The first line of a statement, enough to recognise it in an error message.
std::string first_line(std::string_view sql) {
  const size_t start = sql.find_first_not_of(" \n\t");
  if (start == std::string_view::npos) return {};
  sql.remove_prefix(start);
  return std::string(sql.substr(0, sql.find('\n')));
}

}  // namespace

void Connection::open(const std::filesystem::path& file) {
  close();
  file_ = file;
  const int rc =
      sqlite3_open_v2(file.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
  if (rc != SQLITE_OK) {
    // sqlite3_open_v2 allocates a handle even on failure; it carries the message.
    const std::string reason = db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
    close();
    throw SqliteError("database " + file_.string() + ": cannot open: " + reason, rc);
  }
  sqlite3_extended_result_codes(db_, 1);
}

void Connection::close() noexcept {
  if (db_ == nullptr) return;
  sqlite3_close_v2(db_);
  db_ = nullptr;
}

void Connection::exec(std::string_view sql) {
  const std::string text(sql);
  const int rc = sqlite3_exec(db_, text.c_str(), nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) fail(rc, first_line(sql));
}

void Connection::set_busy_timeout(int milliseconds) {
  const int rc = sqlite3_busy_timeout(db_, milliseconds);
  if (rc != SQLITE_OK) fail(rc, "setting the busy timeout");
}

int64_t Connection::last_insert_rowid() const {
  return sqlite3_last_insert_rowid(db_);
}

int64_t Connection::changes() const {
  return sqlite3_changes64(db_);
}

bool Connection::autocommit() const {
  return sqlite3_get_autocommit(db_) != 0;
}

void Connection::fail(int rc, std::string_view what) const {
  // The handle's message matches rc only when rc came from the last call on it.
  const char* reason =
      db_ && sqlite3_extended_errcode(db_) == rc ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
  throw SqliteError("database " + file_.string() + ": " + std::string(what) + ": " + reason, rc);
}

Statement::Statement(Connection& connection, std::string_view sql)
    : connection_(connection), sql_(sql) {
  const int rc = sqlite3_prepare_v2(connection_.handle(), sql_.data(),
                                    static_cast<int>(sql_.size()), &stmt_, nullptr);
  if (rc != SQLITE_OK) {
    sqlite3_finalize(stmt_);
    stmt_ = nullptr;
    connection_.fail(rc, first_line(sql_));
  }
}

Statement::~Statement() {
  sqlite3_finalize(stmt_);
}

Statement& Statement::bind(int index, int64_t value) {
  const int rc = sqlite3_bind_int64(stmt_, index, value);
  if (rc != SQLITE_OK) connection_.fail(rc, "binding ?" + std::to_string(index));
  return *this;
}

Statement& Statement::bind(int index, double value) {
  const int rc = sqlite3_bind_double(stmt_, index, value);
  if (rc != SQLITE_OK) connection_.fail(rc, "binding ?" + std::to_string(index));
  return *this;
}

Statement& Statement::bind(int index, std::string_view value) {
  const int rc =
      sqlite3_bind_text64(stmt_, index, value.data(), value.size(), SQLITE_TRANSIENT, SQLITE_UTF8);
  if (rc != SQLITE_OK) connection_.fail(rc, "binding ?" + std::to_string(index));
  return *this;
}

Statement& Statement::bind_null(int index) {
  const int rc = sqlite3_bind_null(stmt_, index);
  if (rc != SQLITE_OK) connection_.fail(rc, "binding ?" + std::to_string(index));
  return *this;
}

bool Statement::step() {
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  // Leave the statement reusable; the error stays on the handle for fail() to report.
  const int code = sqlite3_extended_errcode(connection_.handle());
  const std::string reason = sqlite3_errmsg(connection_.handle());
  sqlite3_reset(stmt_);
  throw SqliteError(
      "database " + connection_.file().string() + ": " + first_line(sql_) + ": " + reason, code);
}

void Statement::run() {
  while (step()) {
  }
}

void Statement::reset() {
  sqlite3_reset(stmt_);
}

int64_t Statement::column_int64(int index) const {
  return sqlite3_column_int64(stmt_, index);
}

double Statement::column_double(int index) const {
  return sqlite3_column_double(stmt_, index);
}

std::string Statement::column_text(int index) const {
  const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, index));
  const int size = sqlite3_column_bytes(stmt_, index);
  return text ? std::string(text, static_cast<size_t>(size)) : std::string();
}

bool Statement::column_is_null(int index) const {
  return sqlite3_column_type(stmt_, index) == SQLITE_NULL;
}

Transaction::Transaction(Connection& connection) : connection_(connection) {
  if (connection_.autocommit()) {
    connection_.exec("BEGIN IMMEDIATE");
    return;
  }
  static std::atomic<uint64_t> next_savepoint{0};
  savepoint_ = "tokenfab_sp" + std::to_string(next_savepoint.fetch_add(1));
  connection_.exec("SAVEPOINT " + savepoint_);
}

Transaction::~Transaction() {
  if (!open_) return;
  try {
    rollback();
  } catch (...) {
    // A failed rollback (the connection already rolled back on an I/O error) leaves nothing to
    // undo; destructors must not throw.
  }
}

void Transaction::commit() {
  if (!open_) return;
  connection_.exec(savepoint_.empty() ? "COMMIT" : "RELEASE " + savepoint_);
  open_ = false;
}

void Transaction::rollback() {
  if (!open_) return;
  open_ = false;
  if (savepoint_.empty()) {
    // SQLite may already have rolled back by itself (SQLITE_FULL, SQLITE_IOERR, ...).
    if (!connection_.autocommit()) connection_.exec("ROLLBACK");
  } else {
    connection_.exec("ROLLBACK TO " + savepoint_ + "; RELEASE " + savepoint_);
  }
}

}  // namespace tokenfab::sqlite
