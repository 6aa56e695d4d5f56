// Runs (core/storage/runs.h): the History page's store of past runs. Every test works on a fresh
// database file in a QTemporaryDir.

#include <QtTest>
#include <filesystem>
#include <memory>
#include <string>

#include "core/common/error.h"
#include "core/storage/conversations.h"
#include "core/storage/database.h"
#include "core/storage/runs.h"
#include "core/storage/schema.h"
#include "core/storage/sqlite.h"

using namespace tokenfab;
namespace fs = std::filesystem;

namespace {

RunRecord make_run(const std::string& kind, const std::string& title, int64_t created_at_ms) {
  RunRecord r;
  r.kind = kind;
  r.title = title;
  r.model = "SmolLM2-135M-Instruct-Q4_1.gguf";
  r.config_json = R"({"requests":4,"devices":"cpu:0"})";
  r.summary_json = R"({"throughput_tok_s":123.5,"itl_ms":{"p50":7.5,"p99":12.0}})";
  r.created_at_ms = created_at_ms;
  return r;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

int64_t count_runs(Database& db) {
  sqlite::Statement count(db.connection(), "SELECT count(*) FROM runs");
  return count.step() ? count.column_int64(0) : -1;
}

}  // namespace

class RunsTest : public QObject {
  Q_OBJECT

 private slots:
  void init();
  void cleanup();
  void add_get_and_remove();
  void list_is_newest_first_and_filters_by_kind();
  void add_sets_the_time_when_zero();
  void rejects_bad_json_and_stores_nothing();
  void remove_of_an_unknown_id_throws();
  void migration_from_version_2_keeps_conversations();

 private:
  std::unique_ptr<QTemporaryDir> dir_;
  fs::path file_;
  std::unique_ptr<Database> db_;
};

void RunsTest::init() {
  dir_ = std::make_unique<QTemporaryDir>();
  QVERIFY(dir_->isValid());
  file_ = fs::path(dir_->path().toStdString()) / "tokenfab.db";
  db_ = Database::open(file_);
}

void RunsTest::cleanup() {
  db_.reset();
  dir_.reset();
}

void RunsTest::add_get_and_remove() {
  RunStore store(*db_);
  const RunRecord run = make_run("serve-bench", "serve-bench colocated 4 req", 1'700'000'000'123);
  const int64_t id = store.add(run);
  QVERIFY(id > 0);
  const auto got = store.get(id);
  QVERIFY(got.has_value());
  QCOMPARE(got->id, id);
  QCOMPARE(got->kind, run.kind);
  QCOMPARE(got->title, run.title);
  QCOMPARE(got->model, run.model);
  QCOMPARE(got->config_json, run.config_json);
  QCOMPARE(got->summary_json, run.summary_json);
  QCOMPARE(got->created_at_ms, run.created_at_ms);
  QCOMPARE(store.list().size(), size_t(1));

  store.remove(id);
  QVERIFY(!store.get(id).has_value());
  QVERIFY(store.list().empty());
}

void RunsTest::list_is_newest_first_and_filters_by_kind() {
  RunStore store(*db_);
  const int64_t old_bench = store.add(make_run("serve-bench", "old", 1000));
  const int64_t demo = store.add(make_run("demo", "demo", 2000));
  const int64_t new_bench = store.add(make_run("serve-bench", "new", 3000));
  const int64_t same_time = store.add(make_run("demo", "same time, later id", 2000));

  const auto all = store.list();
  QCOMPARE(all.size(), size_t(4));
  QCOMPARE(all[0].id, new_bench);
  QCOMPARE(all[1].id, same_time);
  QCOMPARE(all[2].id, demo);
  QCOMPARE(all[3].id, old_bench);

  const auto benches = store.list("serve-bench");
  QCOMPARE(benches.size(), size_t(2));
  QCOMPARE(benches[0].id, new_bench);
  QCOMPARE(benches[1].id, old_bench);
  QVERIFY(store.list("heads-eval").empty());

  const auto newest_two = store.list({}, 2);
  QCOMPARE(newest_two.size(), size_t(2));
  QCOMPARE(newest_two[0].id, new_bench);
  QCOMPARE(newest_two[1].id, same_time);
}

void RunsTest::add_sets_the_time_when_zero() {
  RunStore store(*db_);
  const int64_t before = QDateTime::currentMSecsSinceEpoch();
  const int64_t id = store.add(make_run("demo", "now", 0));
  const int64_t after = QDateTime::currentMSecsSinceEpoch();
  const int64_t created = store.get(id)->created_at_ms;
  QVERIFY(created >= before && created <= after);
}

void RunsTest::rejects_bad_json_and_stores_nothing() {
  RunStore store(*db_);
  RunRecord bad_config = make_run("serve-bench", "x", 1);
  bad_config.config_json = "{not json";
  std::string error = error_of([&] { store.add(bad_config); });
  QVERIFY2(error.find("config is not valid JSON") != std::string::npos, error.c_str());

  RunRecord array_summary = make_run("serve-bench", "x", 1);
  array_summary.summary_json = "[1, 2]";
  error = error_of([&] { store.add(array_summary); });
  QVERIFY2(error.find("summary must be a JSON object") != std::string::npos, error.c_str());

  RunRecord empty_summary = make_run("serve-bench", "x", 1);
  empty_summary.summary_json = "";
  error = error_of([&] { store.add(empty_summary); });
  QVERIFY2(error.find("summary is not valid JSON") != std::string::npos, error.c_str());

  RunRecord no_kind = make_run("", "x", 1);
  error = error_of([&] { store.add(no_kind); });
  QVERIFY2(error.find("needs a kind") != std::string::npos, error.c_str());

  QCOMPARE(count_runs(*db_), int64_t(0));
  QVERIFY(store.list().empty());
}

void RunsTest::remove_of_an_unknown_id_throws() {
  RunStore store(*db_);
  const int64_t id = store.add(make_run("demo", "kept", 1));
  const std::string error = error_of([&] { store.remove(id + 100); });
  QVERIFY2(error.find("no run with id " + std::to_string(id + 100)) != std::string::npos,
           error.c_str());
  QCOMPARE(store.list().size(), size_t(1));
}

void RunsTest::migration_from_version_2_keeps_conversations() {
  db_.reset();
  const fs::path old_file = fs::path(dir_->path().toStdString()) / "v2.db";
  {
    // A database as a build with schema version 2 left it, with one conversation.
    sqlite::Connection connection;
    connection.open(old_file);
    for (const schema::Migration& m : schema::migrations()) {
      if (m.version > 2) break;
      connection.exec(m.sql);
    }
    connection.exec("PRAGMA user_version = 2");
    connection.exec(
        "INSERT INTO conversations (title, created_unix, updated_unix, settings_json) "
        "VALUES ('from v2', 10, 10, '{}')");
  }
  auto db = Database::open(old_file);
  QCOMPARE(db->schema_version(), Database::latest_schema_version());
  QVERIFY(db->schema_version() >= 3);
  const auto conversations = Conversations(*db).list();
  QCOMPARE(conversations.size(), size_t(1));
  QCOMPARE(conversations[0].title, std::string("from v2"));

  RunStore store(*db);
  QVERIFY(store.list().empty());
  const int64_t id = store.add(make_run("serve-bench", "after migration", 5));
  QCOMPARE(store.get(id)->title, std::string("after migration"));
}

QTEST_GUILESS_MAIN(RunsTest)
#include "test_runs.moc"
