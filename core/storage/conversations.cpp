#include "core/storage/conversations.h"

#include <chrono>

#include <nlohmann/json.hpp>

#include "core/storage/live_writer.h"

namespace tokenfab {

namespace {

constexpr const char* kConversationColumns =
    "c.id, c.title, c.created_unix, c.updated_unix, c.settings_json";

int64_t now_unix() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string json_or_empty_object(std::string_view text, const std::string& what) {
  if (text.empty()) return "{}";
  if (!nlohmann::json::accept(text)) throw Error(what + " is not valid JSON");
  return std::string(text);
}

// This process as the writer of a reply still streaming (stats state "generating"); NULL (the
// empty optional) for a final one.
std::optional<std::string> writer_for(std::string_view stats_json) {
  const nlohmann::json stats = nlohmann::json::parse(stats_json, nullptr, false);
  const auto state = stats.is_object() ? stats.find("state") : stats.end();
  if (stats.is_object() && state != stats.end() && *state == Conversations::kGenerating)
    return this_writer();
  return std::nullopt;
}

void bind_writer(sqlite::Statement& statement, int index, std::string_view stats_json) {
  if (const auto writer = writer_for(stats_json))
    statement.bind(index, *writer);
  else
    statement.bind_null(index);
}

ConversationRecord read_conversation(const sqlite::Statement& row) {
  return ConversationRecord{row.column_int64(0), row.column_text(1), row.column_int64(2),
                            row.column_int64(3), row.column_text(4)};
}

std::vector<ConversationRecord> read_all(sqlite::Statement& select) {
  std::vector<ConversationRecord> out;
  while (select.step()) out.push_back(read_conversation(select));
  return out;
}

}  // namespace

int64_t Conversations::create(std::string_view title, std::string_view settings_json) {
  const std::string settings = json_or_empty_object(settings_json, "conversation settings");
  const int64_t now = now_unix();
  sqlite::Statement insert(db_.connection(),
                           "INSERT INTO conversations (title, created_unix, updated_unix, "
                           "settings_json) VALUES (?1, ?2, ?2, ?3)");
  insert.bind(1, title).bind(2, now).bind(3, settings);
  insert.run();
  return db_.connection().last_insert_rowid();
}

bool Conversations::rename(int64_t id, std::string_view title) {
  sqlite::Statement update(db_.connection(), "UPDATE conversations SET title = ?2 WHERE id = ?1");
  update.bind(1, id).bind(2, title);
  update.run();
  return db_.connection().changes() > 0;
}

bool Conversations::set_settings(int64_t id, std::string_view settings_json) {
  const std::string settings = json_or_empty_object(settings_json, "conversation settings");
  sqlite::Statement update(db_.connection(),
                           "UPDATE conversations SET settings_json = ?2 WHERE id = ?1");
  update.bind(1, id).bind(2, settings);
  update.run();
  return db_.connection().changes() > 0;
}

bool Conversations::remove(int64_t id) {
  sqlite::Statement erase(db_.connection(), "DELETE FROM conversations WHERE id = ?1");
  erase.bind(1, id);
  erase.run();
  return db_.connection().changes() > 0;
}

std::optional<ConversationRecord> Conversations::find(int64_t id) {
  sqlite::Statement select(db_.connection(), std::string("SELECT ") + kConversationColumns +
                                                 " FROM conversations c WHERE c.id = ?1");
  select.bind(1, id);
  if (!select.step()) return std::nullopt;
  return read_conversation(select);
}

std::vector<ConversationRecord> Conversations::list() {
  sqlite::Statement select(db_.connection(),
                           std::string("SELECT ") + kConversationColumns +
                               " FROM conversations c ORDER BY c.updated_unix DESC, c.id DESC");
  return read_all(select);
}

std::vector<ConversationRecord> Conversations::search(std::string_view text) {
  if (text.empty()) return list();
  // instr() rather than LIKE: no wildcard characters to escape in the user's text.
  sqlite::Statement select(
      db_.connection(),
      std::string("SELECT ") + kConversationColumns +
          " FROM conversations c WHERE instr(lower(c.title), lower(?1)) > 0 OR EXISTS ("
          "SELECT 1 FROM messages m WHERE m.conversation_id = c.id AND "
          "instr(lower(m.content), lower(?1)) > 0) ORDER BY c.updated_unix DESC, c.id DESC");
  select.bind(1, text);
  return read_all(select);
}

int64_t Conversations::add_message(const MessageRecord& message) {
  if (message.role != "system" && message.role != "user" && message.role != "assistant")
    throw Error("message role '" + message.role + "' is not one of system, user, assistant");
  const std::string stats = json_or_empty_object(message.stats_json, "message stats");
  const int64_t created = message.created_unix != 0 ? message.created_unix : now_unix();
  sqlite::Transaction transaction(db_.connection());
  sqlite::Statement touch(db_.connection(),
                          "UPDATE conversations SET updated_unix = max(updated_unix, ?2) "
                          "WHERE id = ?1");
  touch.bind(1, message.conversation_id).bind(2, created);
  touch.run();
  if (db_.connection().changes() == 0)
    throw Error("no conversation with id " + std::to_string(message.conversation_id));
  sqlite::Statement insert(db_.connection(),
                           "INSERT INTO messages (conversation_id, role, content, created_unix, "
                           "stats_json, writer) VALUES (?1, ?2, ?3, ?4, ?5, ?6)");
  insert.bind(1, message.conversation_id).bind(2, message.role).bind(3, message.content);
  insert.bind(4, created).bind(5, stats);
  bind_writer(insert, 6, stats);
  insert.run();
  const int64_t id = db_.connection().last_insert_rowid();
  transaction.commit();
  return id;
}

bool Conversations::update_message(int64_t id, std::string_view content,
                                   std::string_view stats_json) {
  const std::string stats = json_or_empty_object(stats_json, "message stats");
  sqlite::Transaction transaction(db_.connection());
  sqlite::Statement update(db_.connection(),
                           "UPDATE messages SET content = ?2, stats_json = ?3, writer = ?4 "
                           "WHERE id = ?1");
  update.bind(1, id).bind(2, content).bind(3, stats);
  bind_writer(update, 4, stats);
  update.run();
  if (db_.connection().changes() == 0) return false;
  sqlite::Statement touch(db_.connection(),
                          "UPDATE conversations SET updated_unix = max(updated_unix, ?2) "
                          "WHERE id = (SELECT conversation_id FROM messages WHERE id = ?1)");
  touch.bind(1, id).bind(2, now_unix());
  touch.run();
  transaction.commit();
  return true;
}

std::vector<MessageRecord> Conversations::messages(int64_t conversation_id) {
  sqlite::Statement select(db_.connection(),
                           "SELECT id, conversation_id, role, content, created_unix, stats_json "
                           "FROM messages WHERE conversation_id = ?1 ORDER BY id");
  select.bind(1, conversation_id);
  std::vector<MessageRecord> out;
  while (select.step()) {
    out.push_back(MessageRecord{select.column_int64(0), select.column_int64(1),
                                select.column_text(2), select.column_text(3),
                                select.column_int64(4), select.column_text(5)});
  }
  return out;
}

}  // namespace tokenfab
