// Conversations (core/storage/conversations.h): the Chat page's store; and what the next open
// marks of the work of a writer that has gone (core/storage/recovery.h): a streaming reply, a
// training run. Every test works on a fresh database file in a QTemporaryDir.

#include <QtTest>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "core/common/error.h"
#include "core/storage/conversations.h"
#include "core/storage/database.h"
#include "core/storage/live_writer.h"
#include "core/storage/training_runs.h"

using namespace tokenfab;
namespace fs = std::filesystem;

class ConversationsTest : public QObject {
  Q_OBJECT

 private slots:
  void init();
  void cleanup();
  void create_find_and_rename();
  void list_is_newest_first();
  void messages_keep_their_order_and_stats();
  void delete_removes_messages();
  void update_replaces_a_message_in_place();
  void search_by_title_and_content();
  void rejects_bad_input();
  void survives_reopening();
  void reply_of_a_gone_writer_reads_interrupted();
  void training_run_of_a_gone_writer_reads_cancelled();

 private:
  std::unique_ptr<QTemporaryDir> dir_;
  fs::path file_;
  std::unique_ptr<Database> db_;
};

void ConversationsTest::init() {
  dir_ = std::make_unique<QTemporaryDir>();
  QVERIFY(dir_->isValid());
  file_ = fs::path(dir_->path().toStdString()) / "tokenfab.db";
  db_ = Database::open(file_);
}

void ConversationsTest::cleanup() {
  db_.reset();
  dir_.reset();
}

void ConversationsTest::create_find_and_rename() {
  Conversations c(*db_);
  const int64_t id = c.create("First", R"({"max_tokens":64})");
  const auto found = c.find(id);
  QVERIFY(found);
  QCOMPARE(found->title, std::string("First"));
  QCOMPARE(found->settings_json, std::string(R"({"max_tokens":64})"));
  QVERIFY(found->created_unix > 0);
  QVERIFY(c.rename(id, "Renamed"));
  QCOMPARE(c.find(id)->title, std::string("Renamed"));
  QVERIFY(!c.rename(id + 100, "nobody"));
  QVERIFY(c.set_settings(id, R"({"temperature":0.7})"));
  QCOMPARE(c.find(id)->settings_json, std::string(R"({"temperature":0.7})"));
  QVERIFY(!c.find(id + 100));
}

void ConversationsTest::list_is_newest_first() {
  Conversations c(*db_);
  const int64_t a = c.create("a");
  const int64_t b = c.create("b");
  const int64_t d = c.create("d");
  auto all = c.list();
  QCOMPARE(all.size(), size_t(3));
  // Same second: the newest id first.
  QCOMPARE(all[0].id, d);
  QCOMPARE(all[1].id, b);
  QCOMPARE(all[2].id, a);
  // A message added later moves its conversation to the top.
  MessageRecord m{.conversation_id = a, .role = "user", .content = "hi"};
  m.created_unix = all[0].updated_unix + 10;
  c.add_message(m);
  all = c.list();
  QCOMPARE(all[0].id, a);
  QCOMPARE(all[0].updated_unix, m.created_unix);
}

void ConversationsTest::messages_keep_their_order_and_stats() {
  Conversations c(*db_);
  const int64_t id = c.create("chat");
  c.add_message({.conversation_id = id, .role = "user", .content = "Hello ```code```"});
  c.add_message({.conversation_id = id,
                 .role = "assistant",
                 .content = "Hi. \xc3\xa9",
                 .stats_json = R"({"tokens":3,"ttft_ms":12.5})"});
  const auto messages = c.messages(id);
  QCOMPARE(messages.size(), size_t(2));
  QCOMPARE(messages[0].role, std::string("user"));
  QCOMPARE(messages[0].content, std::string("Hello ```code```"));
  QCOMPARE(messages[0].stats_json, std::string("{}"));
  QCOMPARE(messages[1].role, std::string("assistant"));
  QCOMPARE(messages[1].content, std::string("Hi. \xc3\xa9"));
  QCOMPARE(messages[1].stats_json, std::string(R"({"tokens":3,"ttft_ms":12.5})"));
  QVERIFY(messages[0].id < messages[1].id);
  QVERIFY(messages[1].created_unix > 0);
}

void ConversationsTest::delete_removes_messages() {
  Conversations c(*db_);
  const int64_t keep = c.create("keep");
  const int64_t gone = c.create("gone");
  c.add_message({.conversation_id = keep, .role = "user", .content = "k"});
  c.add_message({.conversation_id = gone, .role = "user", .content = "g"});
  QVERIFY(c.remove(gone));
  QVERIFY(!c.remove(gone));
  QVERIFY(c.messages(gone).empty());
  QCOMPARE(c.messages(keep).size(), size_t(1));
  sqlite::Statement count(db_->connection(), "SELECT count(*) FROM messages");
  QVERIFY(count.step());
  QCOMPARE(count.column_int64(0), int64_t(1));
}

// A reply saved as it streams: the same row takes the longer text and new stats, the message
// order stays, and the conversation counts as updated now.
void ConversationsTest::update_replaces_a_message_in_place() {
  Conversations c(*db_);
  const int64_t id = c.create("chat");
  c.add_message({.conversation_id = id, .role = "user", .content = "Tell me"});
  const int64_t reply = c.add_message({.conversation_id = id,
                                       .role = "assistant",
                                       .content = "Once",
                                       .created_unix = 1000,
                                       .stats_json = R"({"state":"generating"})"});
  const int64_t before = c.find(id)->updated_unix;
  QVERIFY(c.update_message(reply, "Once upon a time", R"({"state":"finished","tokens":4})"));
  const auto messages = c.messages(id);
  QCOMPARE(messages.size(), size_t(2));
  QCOMPARE(messages[1].id, reply);
  QCOMPARE(messages[1].content, std::string("Once upon a time"));
  QCOMPARE(messages[1].stats_json, std::string(R"({"state":"finished","tokens":4})"));
  QCOMPARE(messages[1].created_unix, int64_t{1000});  // when the reply began
  QVERIFY(c.find(id)->updated_unix >= before);
  QVERIFY(!c.update_message(reply + 100, "nobody", "{}"));
  QVERIFY_THROWS_EXCEPTION(Error, c.update_message(reply, "x", "not json"));
  QCOMPARE(c.messages(id)[1].content, std::string("Once upon a time"));  // unchanged by the throw
}

void ConversationsTest::search_by_title_and_content() {
  Conversations c(*db_);
  const int64_t rivers = c.create("Rivers and lakes");
  const int64_t code = c.create("Code review");
  c.add_message({.conversation_id = code, .role = "user", .content = "Explain 100% of this_func"});
  QCOMPARE(c.search("").size(), size_t(2));
  auto hits = c.search("RIVER");
  QCOMPARE(hits.size(), size_t(1));
  QCOMPARE(hits[0].id, rivers);
  hits = c.search("this_func");
  QCOMPARE(hits.size(), size_t(1));
  QCOMPARE(hits[0].id, code);
  // Wildcard characters are plain text.
  QCOMPARE(c.search("100%").size(), size_t(1));
  QCOMPARE(c.search("_").size(), size_t(1));
  QVERIFY(c.search("nothing like this").empty());
}

void ConversationsTest::rejects_bad_input() {
  Conversations c(*db_);
  QVERIFY_THROWS_EXCEPTION(Error, c.create("x", "{not json"));
  const int64_t id = c.create("x");
  QVERIFY_THROWS_EXCEPTION(Error,
                           c.add_message({.conversation_id = id, .role = "robot", .content = "x"}));
  QVERIFY_THROWS_EXCEPTION(
      Error,
      c.add_message({.conversation_id = id, .role = "user", .content = "x", .stats_json = "[1,"}));
  QVERIFY_THROWS_EXCEPTION(
      Error, c.add_message({.conversation_id = id + 7, .role = "user", .content = "x"}));
  QVERIFY(c.messages(id).empty());
}

void ConversationsTest::survives_reopening() {
  int64_t id = 0;
  {
    Conversations c(*db_);
    id = c.create("persisted");
    c.add_message({.conversation_id = id, .role = "user", .content = "remember me"});
  }
  db_.reset();
  db_ = Database::open(file_);
  QCOMPARE(db_->schema_version(), Database::latest_schema_version());
  Conversations c(*db_);
  QCOMPARE(c.find(id)->title, std::string("persisted"));
  QCOMPARE(c.messages(id).at(0).content, std::string("remember me"));
}

// A reply saved "generating" keeps that state while its writer (this process) runs, even across
// another open; once the writer is gone (here: its identity replaced by that of a process that
// does not exist) the next open marks it "interrupted" and keeps its text. Killed processes:
// tests/crash.
void ConversationsTest::reply_of_a_gone_writer_reads_interrupted() {
  Conversations c(*db_);
  const int64_t id = c.create("streaming");
  const int64_t live = c.add_message({.conversation_id = id,
                                      .role = "assistant",
                                      .content = "Once",
                                      .stats_json = R"({"state":"generating","tokens":1})"});
  const int64_t gone = c.add_message({.conversation_id = id,
                                      .role = "assistant",
                                      .content = "Upon",
                                      .stats_json = R"({"state":"generating","tokens":1})"});
  db_->connection().exec("UPDATE messages SET writer = '- 2147483646 1' WHERE id = " +
                         std::to_string(gone));
  QVERIFY(!writer_is_alive("- 2147483646 1"));
  QVERIFY(writer_is_alive(this_writer()));
  db_.reset();
  db_ = Database::open(file_);
  Conversations reopened(*db_);
  const std::vector<MessageRecord> m = reopened.messages(id);
  QCOMPARE(m.at(0).id, live);
  QCOMPARE(nlohmann::json::parse(m.at(0).stats_json)["state"], "generating");
  QCOMPARE(m.at(1).id, gone);
  QCOMPARE(m.at(1).content, std::string("Upon"));
  QCOMPARE(nlohmann::json::parse(m.at(1).stats_json)["state"], "interrupted");
  QCOMPARE(nlohmann::json::parse(m.at(1).stats_json)["tokens"], 1);
  // A final state clears the writer: nothing is left for a later open to mark.
  QVERIFY(reopened.update_message(live, "Once upon", R"({"state":"finished"})"));
  sqlite::Statement writers(db_->connection(),
                            "SELECT count(*) FROM messages WHERE writer IS NOT NULL");
  QVERIFY(writers.step());
  QCOMPARE(writers.column_int64(0), int64_t{0});
}

void ConversationsTest::training_run_of_a_gone_writer_reads_cancelled() {
  TrainingRuns runs(*db_);
  TrainingRunRecord r;
  r.head_name = "h";
  r.domain = "code";
  r.type = "medusa";
  r.steps = 100;
  const int64_t live = runs.begin(r);
  const int64_t gone = runs.begin(r);
  const int64_t done = runs.begin(r);
  runs.set_step(gone, 40);
  runs.end(done, "failed", "out of memory");
  db_->connection().exec("UPDATE training_runs SET writer = '- 2147483646 1' WHERE id = " +
                         std::to_string(gone));
  db_.reset();
  db_ = Database::open(file_);
  TrainingRuns reopened(*db_);
  QCOMPARE(reopened.get(live)->state, std::string("running"));
  QCOMPARE(reopened.get(gone)->state, std::string("cancelled"));
  QCOMPARE(reopened.get(gone)->step, int64_t{40});
  QVERIFY2(reopened.get(gone)->note.starts_with("interrupted at step 40"),
           reopened.get(gone)->note.c_str());
  QCOMPARE(reopened.get(done)->state, std::string("failed"));
  QCOMPARE(reopened.get(done)->note, std::string("out of memory"));
  QVERIFY_THROWS_EXCEPTION(Error, runs.end(live, "running", ""));
}

QTEST_GUILESS_MAIN(ConversationsTest)
#include "test_conversations.moc"
