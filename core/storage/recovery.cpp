#include "core/storage/recovery.h"

#include <string>
#include <vector>

#include "core/storage/database.h"
#include "core/storage/live_writer.h"

namespace tokenfab {

namespace {

// The writers named by rows in progress (each table's partial index keeps this cheap).
std::vector<std::string> writers_in_progress(sqlite::Connection& connection) {
  sqlite::Statement select(connection,
                           "SELECT writer FROM messages WHERE writer IS NOT NULL UNION "
                           "SELECT writer FROM training_runs WHERE writer IS NOT NULL");
  std::vector<std::string> out;
  while (select.step()) out.push_back(select.column_text(0));
  return out;
}

}  // namespace

Recovered mark_interrupted_work(Database& db) {
  sqlite::Connection& connection = db.connection();
  Recovered recovered;
  for (const std::string& writer : writers_in_progress(connection)) {
    if (writer_is_alive(writer)) continue;
    sqlite::Transaction transaction(connection);
    // A stats text that is not JSON (edited by hand) is replaced rather than failing the open.
    sqlite::Statement replies(
        connection,
        "UPDATE messages SET writer = NULL, stats_json = CASE WHEN json_valid(stats_json) THEN "
        "json_set(stats_json, '$.state', 'interrupted') ELSE '{\"state\":\"interrupted\"}' END "
        "WHERE writer = ?1");
    replies.bind(1, writer);
    replies.run();
    recovered.replies += connection.changes();
    sqlite::Statement runs(
        connection,
        "UPDATE training_runs SET writer = NULL, state = 'cancelled', note = 'interrupted at step "
        "' "
        "|| step || ': the process training it ended (a crash or a kill) before a head was "
        "registered' WHERE writer = ?1 AND state = 'running'");
    runs.bind(1, writer);
    runs.run();
    recovered.training_runs += connection.changes();
    // A finished row never keeps a writer; this only clears what an odd state left.
    sqlite::Statement clear(connection, "UPDATE training_runs SET writer = NULL WHERE writer = ?1");
    clear.bind(1, writer);
    clear.run();
    transaction.commit();
  }
  return recovered;
}

}  // namespace tokenfab
