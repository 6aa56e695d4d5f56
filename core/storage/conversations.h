#pragma once
// Chat conversations and their messages (the desktop app's Chat page), on a Database's
// connection. Each write is one transaction (or a savepoint inside the caller's
// sqlite::Transaction). Timestamps are unix seconds; JSON columns hold "{}" when empty.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/storage/database.h"

namespace tokenfab {

struct ConversationRecord {
  int64_t id = 0;
  std::string title;
  int64_t created_unix = 0;
  int64_t updated_unix = 0;  // the last message's time (created_unix before any)
  std::string settings_json = "{}";
};

struct MessageRecord {
  int64_t id = 0;
  int64_t conversation_id = 0;
  std::string role;  // "system", "user" or "assistant"
  std::string content;
  int64_t created_unix = 0;  // 0 on add_message: now
  std::string stats_json = "{}";
};

class Conversations {
 public:
  // An assistant message's stats_json "state" while the reply streams: such a row is saved with
  // this process as its writer, and when the process ends before a final state is written (a
  // crash, a kill) the next Database::open sets the state to kInterrupted, keeping the text so
  // far (core/storage/recovery.h). Any other state ("finished", "cancelled", ...) is final.
  static constexpr const char* kGenerating = "generating";
  static constexpr const char* kInterrupted = "interrupted";

  explicit Conversations(Database& db) : db_(db) {}

  // Returns the new id. Throws Error for settings that are not JSON.
  int64_t create(std::string_view title, std::string_view settings_json = "{}");
  // False when there is no such conversation.
  bool rename(int64_t id, std::string_view title);
  bool set_settings(int64_t id, std::string_view settings_json);
  // Also removes its messages; false when there was no such conversation.
  bool remove(int64_t id);
  std::optional<ConversationRecord> find(int64_t id);
  // Most recently updated first (ties: newest id first).
  std::vector<ConversationRecord> list();
  // Conversations whose title or any message contains `text` (ASCII case-insensitive), in list()
  // order; an empty text matches all.
  std::vector<ConversationRecord> search(std::string_view text);

  // Throws Error for an unknown conversation, a bad role or stats that are not JSON. Returns the
  // new id.
  int64_t add_message(const MessageRecord& message);
  // Replaces a message's content and stats (a reply saved as it streams), and marks its
  // conversation updated now. False when there is no such message; throws Error for stats that
  // are not JSON.
  bool update_message(int64_t id, std::string_view content, std::string_view stats_json);
  // Oldest first.
  std::vector<MessageRecord> messages(int64_t conversation_id);

 private:
  Database& db_;
};

}  // namespace tokenfab
