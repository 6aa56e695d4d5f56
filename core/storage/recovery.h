#pragma once
// What a crash or a kill left unfinished, marked when a database is opened: a reply that was
// streaming becomes "interrupted" (its text so far kept), a training run that was running becomes
// "cancelled" with a note. Only rows whose writer process has gone are touched
// (core/storage/live_writer.h); another process's work in progress is left alone.

#include <cstdint>

namespace tokenfab {

class Database;

struct Recovered {
  int64_t replies = 0;        // marked interrupted
  int64_t training_runs = 0;  // marked cancelled
};

// Marks the rows of gone writers, one transaction per writer. Throws sqlite::SqliteError (a
// database busy past its timeout, say); Database::open logs that and opens anyway, leaving the
// rows to the next open.
Recovered mark_interrupted_work(Database& db);

}  // namespace tokenfab
