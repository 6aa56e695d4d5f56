#include "core/storage/schema.h"

namespace tokenfab::schema {

namespace {

// Version 1: models, domains, draft heads and their evaluations. A head names its base model by
// sha256 rather than by a foreign key, so that a head outlives the model's registration (a model
// file moved or re-added keeps its heads). Timestamps are unix seconds.
constexpr const char* kVersion1 = R"sql(
PRAGMA application_id = 1416316514;

CREATE TABLE models (
  id INTEGER PRIMARY KEY,
  sha256 TEXT NOT NULL UNIQUE,
  name TEXT NOT NULL,
  path TEXT NOT NULL,
  added_unix INTEGER NOT NULL
);

CREATE TABLE domains (
  id INTEGER PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  description TEXT NOT NULL,
  source TEXT NOT NULL CHECK (source IN ('builtin', 'user'))
);

CREATE TABLE heads (
  id INTEGER PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  domain TEXT NOT NULL,
  type TEXT NOT NULL CHECK (type IN ('medusa', 'mtp')),
  base_model_sha256 TEXT NOT NULL,
  file TEXT NOT NULL,
  created_unix INTEGER NOT NULL,
  training_config_json TEXT NOT NULL,
  summary_json TEXT NOT NULL
);
CREATE INDEX heads_by_base_model ON heads (base_model_sha256);

-- per_position_json: a JSON array, the acceptance rate at each draft position.
CREATE TABLE evaluations (
  id INTEGER PRIMARY KEY,
  head_id INTEGER NOT NULL REFERENCES heads (id) ON DELETE CASCADE,
  domain TEXT NOT NULL,
  spec TEXT NOT NULL CHECK (spec IN ('chain', 'tree')),
  accept_per_step REAL NOT NULL,
  per_position_json TEXT NOT NULL,
  decode_tok_s REAL NOT NULL,
  baseline_decode_tok_s REAL NOT NULL,
  target_quant TEXT NOT NULL,
  prompts INTEGER NOT NULL,
  tokens INTEGER NOT NULL,
  created_unix INTEGER NOT NULL
);
CREATE INDEX evaluations_by_head ON evaluations (head_id);
)sql";

// Version 2: chat conversations and their messages (the desktop app's Chat page). settings_json
// holds a conversation's sampling settings (max tokens, temperature, ...); stats_json an assistant
// message's measured figures (TTFT, tok/s, tokens, ACCEPT/STEP), "{}" when there are none.
constexpr const char* kVersion2 = R"sql(
CREATE TABLE conversations (
  id INTEGER PRIMARY KEY,
  title TEXT NOT NULL,
  created_unix INTEGER NOT NULL,
  updated_unix INTEGER NOT NULL,
  settings_json TEXT NOT NULL
);
CREATE INDEX conversations_by_updated ON conversations (updated_unix);

CREATE TABLE messages (
  id INTEGER PRIMARY KEY,
  conversation_id INTEGER NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
  role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
  content TEXT NOT NULL,
  created_unix INTEGER NOT NULL,
  stats_json TEXT NOT NULL
);
CREATE INDEX messages_by_conversation ON messages (conversation_id, id);
)sql";

// Version 3: past runs for the desktop app's History page (serve-bench, demo, ...). config_json is
// the run's settings and summary_json its measured figures, both JSON objects; created_ms is unix
// milliseconds (runs started within one second still order by time).
constexpr const char* kVersion3 = R"sql(
CREATE TABLE runs (
  id INTEGER PRIMARY KEY,
  kind TEXT NOT NULL CHECK (kind <> ''),
  title TEXT NOT NULL,
  model TEXT NOT NULL,
  config_json TEXT NOT NULL,
  summary_json TEXT NOT NULL,
  created_ms INTEGER NOT NULL
);
CREATE INDEX runs_by_kind_created ON runs (kind, created_ms);
CREATE INDEX runs_by_created ON runs (created_ms);
)sql";

// Version 4: an evaluation keeps the model file's own decode speed without speculation, measured
// in the same run (the quantization study compares a re-quantized target against it); rows from
// before read 0, "not measured".
constexpr const char* kVersion4 = R"sql(
ALTER TABLE evaluations ADD COLUMN native_decode_tok_s REAL NOT NULL DEFAULT 0;
)sql";

// Version 5: an evaluation names the devices it generated on (its decode speeds are theirs);
// rows from before read "", "not recorded".
constexpr const char* kVersion5 = R"sql(
ALTER TABLE evaluations ADD COLUMN devices TEXT NOT NULL DEFAULT '';
)sql";

// Version 6: work that a crash can interrupt names the live process doing it (writer: an identity
// from core/storage/live_writer.h; NULL once the row is final), so that the next open can mark
// what a crash or a kill left unfinished (core/storage/recovery.h). A reply saved as it streams
// (stats_json's "state" "generating") has a writer; a training run has a row from its start.
// Replies left "generating" by builds before this one are marked "interrupted" here.
constexpr const char* kVersion6 = R"sql(
ALTER TABLE messages ADD COLUMN writer TEXT;
CREATE INDEX messages_by_writer ON messages (writer) WHERE writer IS NOT NULL;
UPDATE messages SET stats_json = json_set(stats_json, '$.state', 'interrupted')
  WHERE json_valid(stats_json) AND json_extract(stats_json, '$.state') = 'generating';

-- A draft-head training run from its start: state 'running' while it trains, then 'finished'
-- (head_id names the head it saved), 'failed' or 'cancelled' (note says why: the error, the
-- user's cancel, or the process ending mid-run). step: the last training step recorded.
CREATE TABLE training_runs (
  id INTEGER PRIMARY KEY,
  head_name TEXT NOT NULL,
  domain TEXT NOT NULL,
  type TEXT NOT NULL,
  base_model_sha256 TEXT NOT NULL,
  config_json TEXT NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('running', 'finished', 'failed', 'cancelled')),
  note TEXT NOT NULL,
  step INTEGER NOT NULL,
  steps INTEGER NOT NULL,
  head_id INTEGER REFERENCES heads (id) ON DELETE SET NULL,
  started_ms INTEGER NOT NULL,
  updated_ms INTEGER NOT NULL,
  writer TEXT
);
CREATE INDEX training_runs_by_started ON training_runs (started_ms);
CREATE INDEX training_runs_by_writer ON training_runs (writer) WHERE writer IS NOT NULL;
)sql";

constexpr Migration kMigrations[] = {
    {1, kVersion1}, {2, kVersion2}, {3, kVersion3}, {4, kVersion4}, {5, kVersion5}, {6, kVersion6},
};

static_assert(kApplicationId == 1416316514, "migration 1 writes kApplicationId in decimal");

}  // namespace

std::span<const Migration> migrations() {
  return kMigrations;
}

}  // namespace tokenfab::schema
