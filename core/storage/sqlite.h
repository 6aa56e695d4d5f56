#pragma once
// A thin RAII layer over the sqlite3 C API: a Connection owns one sqlite3 handle, a Statement one
// prepared statement, a Transaction one BEGIN IMMEDIATE … COMMIT (or a SAVEPOINT when nested).
// Every failure throws SqliteError, whose message names the database file and SQLite's reason.

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "core/common/error.h"

struct sqlite3;
struct sqlite3_stmt;

namespace tokenfab::sqlite {

class SqliteError : public Error {
 public:
  SqliteError(const std::string& message, int code) : Error(message), code_(code) {}
  // SQLite's extended result code (SQLITE_CONSTRAINT_UNIQUE, SQLITE_NOTADB, ...).
  int code() const { return code_; }
  // The primary result code (the low byte): SQLITE_CONSTRAINT, SQLITE_BUSY, ...
  int primary_code() const { return code_ & 0xff; }

 private:
  int code_;
};

class Connection {
 public:
  Connection() = default;
  ~Connection() { close(); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Opens `file` read-write, creating it if missing; extended result codes are on. Reads nothing
  // yet, so a file that is not SQLite is only detected by the first statement.
  void open(const std::filesystem::path& file);
  // Closes the handle; safe to call twice. Statements prepared on it must be gone by then.
  void close() noexcept;
  bool is_open() const { return db_ != nullptr; }

  // Runs one or more statements that return no rows the caller needs.
  void exec(std::string_view sql);
  void set_busy_timeout(int milliseconds);

  int64_t last_insert_rowid() const;
  // Rows changed by the last INSERT/UPDATE/DELETE.
  int64_t changes() const;
  // True outside any transaction.
  bool autocommit() const;

  const std::filesystem::path& file() const { return file_; }
  sqlite3* handle() const { return db_; }

  // Throws SqliteError "database <file>: <what>: <sqlite message>" for result code `rc`.
  [[noreturn]] void fail(int rc, std::string_view what) const;

 private:
  sqlite3* db_ = nullptr;
  std::filesystem::path file_;
};

class Statement {
 public:
  Statement(Connection& connection, std::string_view sql);
  ~Statement();
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  // Parameters are 1-based, as in SQL's ?1, ?2 ...; text is copied.
  Statement& bind(int index, int64_t value);
  Statement& bind(int index, int value) { return bind(index, static_cast<int64_t>(value)); }
  Statement& bind(int index, double value);
  Statement& bind(int index, std::string_view value);
  Statement& bind(int index, const char* value) { return bind(index, std::string_view(value)); }
  Statement& bind_null(int index);

  // Advances: true when a row is ready to be read, false when the statement is done.
  bool step();
  // Steps a statement that must not return rows (INSERT, UPDATE, DELETE).
  void run();
  // Rewinds to run again, keeping the bindings.
  void reset();

  // Columns are 0-based.
  int64_t column_int64(int index) const;
  double column_double(int index) const;
  std::string column_text(int index) const;
  bool column_is_null(int index) const;

 private:
  Connection& connection_;
  sqlite3_stmt* stmt_ = nullptr;
  std::string sql_;
};

// BEGIN IMMEDIATE (takes the write lock now, waiting up to the busy timeout) … commit(); the
// destructor rolls back what was not committed. Inside an open transaction it becomes a
// SAVEPOINT, so repository calls compose into a caller's larger transaction.
class Transaction {
 public:
  explicit Transaction(Connection& connection);
  ~Transaction();
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;

  void commit();
  void rollback();

 private:
  Connection& connection_;
  std::string savepoint_;  // empty for a top-level transaction
  bool open_ = true;
};

}  // namespace tokenfab::sqlite
