#pragma once
// The Tokenfab database: one SQLite file in the user data directory, in WAL mode, with foreign keys
// enforced, migrated to the latest schema version when opened. Used from one thread at a time;
// each thread opens its own Database (WAL lets readers run while one writer writes).

#include <filesystem>
#include <memory>

#include "core/storage/sqlite.h"

namespace tokenfab {

// $TOKENFAB_HOME when set, else $XDG_DATA_HOME/tokenfab, else ~/.local/share/tokenfab; created if
// missing.
std::filesystem::path user_data_dir();

class Database {
 public:
  // Opens `file`, creating it (and its directory) if missing, migrates it to the latest schema
  // version, one transaction per migration, and marks what a crash or a kill of another process
  // left unfinished (core/storage/recovery.h: interrupted replies, cancelled training runs). A file
  // that is not SQLite, a SQLite file that is not Tokenfab's, or one whose schema is newer than
  // this build knows throws Error and is left untouched.
  static std::unique_ptr<Database> open(const std::filesystem::path& file);
  // user_data_dir() / "tokenfab.db".
  static std::unique_ptr<Database> open_default();

  // PRAGMA user_version as stored in the file now.
  int schema_version() const;
  static int latest_schema_version();
  const std::filesystem::path& path() const { return connection_.file(); }

  // The connection the repositories (Registry) operate on; also for a caller's own Transaction
  // spanning several repository calls.
  sqlite::Connection& connection() { return connection_; }

 private:
  Database() = default;
  void check_is_tokenfab_database();
  void enable_wal_and_foreign_keys();
  void migrate();
  void recover();

  mutable sqlite::Connection connection_;
};

}  // namespace tokenfab
