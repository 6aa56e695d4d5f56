// Storage (core/storage): the registry database. Every test works on a fresh file in a
// QTemporaryDir; nothing touches the user's real data directory.

#include <QtTest>
#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include <sys/wait.h>
#include <unistd.h>

#include "core/common/error.h"
#include "core/storage/database.h"
#include "core/storage/registry.h"
#include "core/storage/schema.h"
#include "core/storage/sqlite.h"

using namespace tokenfab;
namespace fs = std::filesystem;

namespace {

const std::string kBaseA(64, 'a');
const std::string kBaseB(64, 'b');

fs::path temp_path(const QTemporaryDir& dir, const char* name) {
  return fs::path(dir.path().toStdString()) / name;
}

std::string read_bytes(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

void write_bytes(const fs::path& file, const std::string& bytes) {
  std::ofstream(file, std::ios::binary) << bytes;
}

// The message of the Error `f` throws, or "(no error)".
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

HeadRecord make_head(const std::string& name, const std::string& base = kBaseA,
                     int64_t created_unix = 0) {
  HeadRecord head;
  head.name = name;
  head.domain = "code";
  head.type = "medusa";
  head.base_model_sha256 = base;
  head.file = "/nonexistent/heads/" + name + ".gguf";
  head.created_unix = created_unix;
  head.training_config_json = R"({"epochs":2,"lr":0.001})";
  return head;
}

EvaluationRecord make_evaluation(int64_t head_id, const std::string& domain,
                                 const std::string& spec, double accept,
                                 const std::string& quant = "native") {
  EvaluationRecord e;
  e.head_id = head_id;
  e.domain = domain;
  e.spec = spec;
  e.accept_per_step = accept;
  e.per_position = {0.75, 0.5, 0.125};
  e.decode_tok_s = 80.5;
  e.baseline_decode_tok_s = 50.25;
  e.target_quant = quant;
  e.native_decode_tok_s = 62.125;
  e.devices = "prefill cpu:0, decode cuda:0";
  e.prompts = 16;
  e.tokens = 4096;
  return e;
}

std::string query_text(Database& db, const char* sql) {
  sqlite::Statement statement(db.connection(), sql);
  return statement.step() ? statement.column_text(0) : std::string();
}

// Restores an environment variable when it goes out of scope.
class EnvGuard {
 public:
  explicit EnvGuard(const char* name)
      : name_(name), was_set_(qEnvironmentVariableIsSet(name)), value_(qgetenv(name)) {}
  ~EnvGuard() {
    if (was_set_)
      qputenv(name_, value_);
    else
      qunsetenv(name_);
  }

 private:
  const char* name_;
  bool was_set_;
  QByteArray value_;
};

}  // namespace

class TestStorage : public QObject {
  Q_OBJECT

 private slots:
  void migrations_from_an_empty_file() {
    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    QVERIFY(Database::latest_schema_version() >= 1);

    // A zero-byte file is an empty SQLite database; the missing directory is created.
    const fs::path file = temp_path(dir, "nested/tokenfab.db");
    fs::create_directories(file.parent_path());
    write_bytes(file, "");
    int64_t head_id = 0;
    {
      auto db = Database::open(file);
      QCOMPARE(db->schema_version(), Database::latest_schema_version());
      QCOMPARE(db->path(), file);
      QCOMPARE(query_text(*db, "PRAGMA journal_mode"), std::string("wal"));
      QCOMPARE(query_text(*db, "PRAGMA foreign_keys"), std::string("1"));
      head_id = Registry(*db).add_head(make_head("kept"));
    }
    {
      auto db = Database::open(file);
      QCOMPARE(db->schema_version(), Database::latest_schema_version());
      const auto head = Registry(*db).find_head("kept");
      QVERIFY(head.has_value());
      QCOMPARE(head->id, head_id);
      // A database from a newer build.
      db->connection().exec("PRAGMA user_version = " +
                            std::to_string(Database::latest_schema_version() + 1));
    }
    const std::string before = read_bytes(file);
    const std::string error = error_of([&] { Database::open(file); });
    QVERIFY2(contains(error, file.string()), error.c_str());
    QVERIFY2(contains(error, "newer than this build"), error.c_str());
    QVERIFY2(read_bytes(file) == before, "opening a newer database changed its file");

    // A database file that is missing altogether is created.
    const fs::path fresh = temp_path(dir, "fresh/new.db");
    QCOMPARE(Database::open(fresh)->schema_version(), Database::latest_schema_version());
    QVERIFY(fs::exists(fresh));
  }

  // A database at schema version 3 (before evaluations kept the model's own speed and their
  // devices) opens at the latest version with its evaluations intact, their native_decode_tok_s
  // read as 0 and their devices as "".
  void migration_keeps_older_evaluations() {
    QTemporaryDir dir;
    const fs::path file = temp_path(dir, "v3.db");
    {
      sqlite::Connection connection;
      connection.open(file);
      for (const schema::Migration& m : schema::migrations())
        if (m.version <= 3) connection.exec(m.sql);
      connection.exec("PRAGMA user_version = 3");
      connection.exec(
          "INSERT INTO heads VALUES (1, 'old', 'code', 'mtp', 'aa', '/h/old.gguf', 1, '{}', '{}');"
          "INSERT INTO evaluations (head_id, domain, spec, accept_per_step, per_position_json, "
          "decode_tok_s, baseline_decode_tok_s, target_quant, prompts, tokens, created_unix) "
          "VALUES (1, 'code', 'chain', 1.5, '[0.5]', 90.0, 80.0, 'q4_0', 3, 300, 7);");
    }
    auto db = Database::open(file);
    QCOMPARE(db->schema_version(), Database::latest_schema_version());
    const auto evaluations = Registry(*db).evaluations(1);
    QCOMPARE(evaluations.size(), size_t{1});
    QCOMPARE(evaluations.front().accept_per_step, 1.5);
    QCOMPARE(evaluations.front().target_quant, std::string("q4_0"));
    QCOMPARE(evaluations.front().native_decode_tok_s, 0.0);
    QCOMPARE(evaluations.front().devices, std::string());
  }

  void not_a_database() {
    QTemporaryDir dir;
    const fs::path file = temp_path(dir, "notes.db");
    std::string text;
    for (int i = 0; i < 64; ++i) text += "line " + std::to_string(i) + ": not a database\n";
    write_bytes(file, text);
    const std::string error = error_of([&] { Database::open(file); });
    QVERIFY2(contains(error, "database " + file.string() + " is not a Tokenfab database"),
             error.c_str());
    QVERIFY2(contains(error, "file is not a database"), error.c_str());
    QVERIFY2(read_bytes(file) == text, "opening a text file changed it");

    // Another program's SQLite database is not migrated into ours.
    const fs::path foreign = temp_path(dir, "foreign.db");
    {
      sqlite::Connection connection;
      connection.open(foreign);
      connection.exec("CREATE TABLE t (x); INSERT INTO t VALUES (1);");
    }
    const std::string foreign_bytes = read_bytes(foreign);
    const std::string foreign_error = error_of([&] { Database::open(foreign); });
    QVERIFY2(contains(foreign_error, foreign.string() + " is not a Tokenfab database"),
             foreign_error.c_str());
    QVERIFY2(read_bytes(foreign) == foreign_bytes, "opening a foreign database changed it");
  }

  void models_and_domains_upsert() {
    QTemporaryDir dir;
    auto db = Database::open(temp_path(dir, "tokenfab.db"));
    Registry registry(*db);
    QVERIFY(!registry.find_model(kBaseA).has_value());
    const int64_t id = registry.add_model({0, kBaseA, "tiny", "/models/tiny.gguf", 1000});
    const int64_t again = registry.add_model({0, kBaseA, "tiny-renamed", "/moved/tiny.gguf", 2000});
    QCOMPARE(again, id);
    const auto model = registry.find_model(kBaseA);
    QVERIFY(model.has_value());
    QCOMPARE(model->name, std::string("tiny-renamed"));
    QCOMPARE(model->path, std::string("/moved/tiny.gguf"));
    QCOMPARE(model->added_unix, int64_t{1000});  // first registration kept

    const int64_t code = registry.add_domain({0, "code", "Source code", "builtin"});
    registry.add_domain({0, "chat", "Conversation", "builtin"});
    QCOMPARE(registry.add_domain({0, "code", "Programs", "user"}), code);
    const auto domains = registry.domains();
    QCOMPARE(domains.size(), size_t{2});
    QCOMPARE(domains[0].name, std::string("chat"));
    QCOMPARE(domains[1].description, std::string("Programs"));
    QCOMPARE(domains[1].source, std::string("user"));
    const std::string bad = error_of([&] { registry.add_domain({0, "x", "", "elsewhere"}); });
    QVERIFY2(contains(bad, "builtin, user"), bad.c_str());
  }

  void heads_roundtrip() {
    QTemporaryDir dir;
    auto db = Database::open(temp_path(dir, "tokenfab.db"));
    Registry registry(*db);
    QVERIFY(registry.heads().empty());

    HeadRecord first = make_head("code-medusa", kBaseA, 1000);
    first.summary_json = R"({"accept":2.5})";
    const int64_t first_id = registry.add_head(first);
    const int64_t second_id = registry.add_head(make_head("chat-mtp", kBaseB, 2000));
    QVERIFY(first_id != second_id);

    const auto by_id = registry.find_head(std::to_string(first_id));
    const auto by_name = registry.find_head("code-medusa");
    QVERIFY(by_id.has_value() && by_name.has_value());
    QCOMPARE(by_id->id, first_id);
    QCOMPARE(by_name->id, first_id);
    QCOMPARE(by_id->name, first.name);
    QCOMPARE(by_id->domain, first.domain);
    QCOMPARE(by_id->type, first.type);
    QCOMPARE(by_id->base_model_sha256, first.base_model_sha256);
    QCOMPARE(by_id->file, first.file);
    QCOMPARE(by_id->created_unix, int64_t{1000});
    QCOMPARE(by_id->training_config_json, first.training_config_json);
    QCOMPARE(by_id->summary_json, first.summary_json);
    QVERIFY(!registry.find_head("no-such-head").has_value());
    QVERIFY(!registry.find_head("99999").has_value());
    QVERIFY(!registry.find_head("123456789012345678901234567890").has_value());
    QVERIFY(!registry.find_head("").has_value());

    // Newest first.
    auto heads = registry.heads();
    QCOMPARE(heads.size(), size_t{2});
    QCOMPARE(heads[0].id, second_id);
    QCOMPARE(heads[1].id, first_id);

    const std::string duplicate = error_of([&] { registry.add_head(make_head("code-medusa")); });
    QCOMPARE(duplicate,
             "a head named 'code-medusa' already exists (id " + std::to_string(first_id) + ")");
    QCOMPARE(registry.heads().size(), size_t{2});
    QVERIFY(contains(error_of([&] { registry.add_head(make_head("42")); }), "digits"));
    HeadRecord bad_type = make_head("bad-type");
    bad_type.type = "eagle";
    QVERIFY(contains(error_of([&] { registry.add_head(bad_type); }), "medusa, mtp"));
    HeadRecord bad_json = make_head("bad-json");
    bad_json.summary_json = "{not json";
    QVERIFY(contains(error_of([&] { registry.add_head(bad_json); }), "not valid JSON"));

    // Removing a head removes its evaluations, and only its own.
    registry.add_evaluation(make_evaluation(first_id, "code", "chain", 2.0));
    registry.add_evaluation(make_evaluation(first_id, "code", "tree", 2.5));
    registry.add_evaluation(make_evaluation(second_id, "chat", "chain", 1.5));
    QCOMPARE(registry.evaluations(first_id).size(), size_t{2});
    QVERIFY(registry.remove_head(first_id));
    QVERIFY(!registry.remove_head(first_id));
    QVERIFY(!registry.find_head("code-medusa").has_value());
    QVERIFY(registry.evaluations(first_id).empty());
    QCOMPARE(query_text(*db, "SELECT count(*) FROM evaluations"), std::string("1"));
    QCOMPARE(registry.evaluations(second_id).size(), size_t{1});

    // Foreign keys: the registry refuses an unknown head, and so does the schema itself.
    const std::string orphan =
        error_of([&] { registry.add_evaluation(make_evaluation(first_id, "code", "chain", 1)); });
    QVERIFY2(contains(orphan, "no head"), orphan.c_str());
    const std::string raw = error_of([&] {
      db->connection().exec(
          "INSERT INTO evaluations (head_id, domain, spec, accept_per_step, per_position_json, "
          "decode_tok_s, baseline_decode_tok_s, target_quant, prompts, tokens, created_unix) "
          "VALUES (999, 'code', 'chain', 1, '[]', 1, 1, 'native', 1, 1, 1)");
    });
    QVERIFY2(contains(raw, "FOREIGN KEY constraint failed"), raw.c_str());
    QVERIFY2(contains(raw, db->path().string()), raw.c_str());
  }

  void head_file_missing_is_reported_clearly() {
    QTemporaryDir dir;
    auto db = Database::open(temp_path(dir, "tokenfab.db"));
    Registry registry(*db);
    const fs::path file = temp_path(dir, "heads/code.gguf");
    HeadRecord head = make_head("code-head");
    head.file = file.string();
    head.id = registry.add_head(head);

    const std::string error = error_of([&] { registry.head_file(head); });
    QCOMPARE(error, "head 'code-head' (id " + std::to_string(head.id) + "): its file " +
                        file.string() + " is missing; delete the head or restore the file");

    fs::create_directories(file.parent_path());
    write_bytes(file, "weights");
    QCOMPARE(registry.head_file(head), file);

    // A relative file is found next to the database.
    HeadRecord relative = make_head("relative-head");
    relative.file = "heads/code.gguf";
    relative.id = registry.add_head(relative);
    QCOMPARE(registry.head_file(*registry.find_head("relative-head")), file);
  }

  void evaluations_and_best_head_for() {
    QTemporaryDir dir;
    auto db = Database::open(temp_path(dir, "tokenfab.db"));
    Registry registry(*db);
    const int64_t a1 = registry.add_head(make_head("a1", kBaseA));
    const int64_t a2 = registry.add_head(make_head("a2", kBaseA));
    const int64_t b1 = registry.add_head(make_head("b1", kBaseB));

    QVERIFY(!registry.best_head_for("code", kBaseA, "chain").has_value());

    EvaluationRecord older = make_evaluation(a1, "code", "chain", 2.25);
    older.created_unix = 100;
    const int64_t older_id = registry.add_evaluation(older);
    EvaluationRecord newer = make_evaluation(a1, "file:/tmp/prompts.txt", "tree", 1.75);
    newer.created_unix = 200;
    newer.per_position = {0.875, 0.5};
    const int64_t newer_id = registry.add_evaluation(newer);
    registry.add_evaluation(make_evaluation(a2, "code", "chain", 2.5));
    registry.add_evaluation(make_evaluation(a2, "code", "chain", 3.5, "q8_0"));  // not native
    registry.add_evaluation(make_evaluation(a2, "code", "tree", 2.0));
    registry.add_evaluation(make_evaluation(b1, "code", "chain", 4.0));  // another base model
    registry.add_evaluation(make_evaluation(a1, "chat", "chain", 3.0));  // another domain

    // Round trip, newest first.
    const auto evaluations = registry.evaluations(a1);
    QCOMPARE(evaluations.size(), size_t{3});
    QCOMPARE(evaluations[1].id, newer_id);
    QCOMPARE(evaluations[2].id, older_id);
    const EvaluationRecord& e = evaluations[2];
    QCOMPARE(e.head_id, a1);
    QCOMPARE(e.domain, std::string("code"));
    QCOMPARE(e.spec, std::string("chain"));
    QCOMPARE(e.accept_per_step, 2.25);
    QCOMPARE(e.per_position, (std::vector<double>{0.75, 0.5, 0.125}));
    QCOMPARE(e.decode_tok_s, 80.5);
    QCOMPARE(e.baseline_decode_tok_s, 50.25);
    QCOMPARE(e.native_decode_tok_s, 62.125);
    QCOMPARE(e.devices, std::string("prefill cpu:0, decode cuda:0"));
    QCOMPARE(e.target_quant, std::string("native"));
    QCOMPARE(e.prompts, int64_t{16});
    QCOMPARE(e.tokens, int64_t{4096});
    QCOMPARE(e.created_unix, int64_t{100});
    QCOMPARE(evaluations[1].domain, std::string("file:/tmp/prompts.txt"));
    QCOMPARE(evaluations[1].per_position, (std::vector<double>{0.875, 0.5}));
    QVERIFY(evaluations[0].created_unix > 0);  // 0 means now

    const auto chain = registry.best_head_for("code", kBaseA, "chain");
    QVERIFY(chain.has_value());
    QCOMPARE(chain->first.id, a2);
    QCOMPARE(chain->first.name, std::string("a2"));
    QCOMPARE(chain->second.accept_per_step, 2.5);
    QCOMPARE(chain->second.target_quant, std::string("native"));
    QCOMPARE(chain->second.per_position, (std::vector<double>{0.75, 0.5, 0.125}));

    const auto tree = registry.best_head_for("code", kBaseA, "tree");
    QVERIFY(tree.has_value());
    QCOMPARE(tree->first.id, a2);
    QCOMPARE(tree->second.accept_per_step, 2.0);

    QCOMPARE(registry.best_head_for("code", kBaseB, "chain")->first.id, b1);
    QCOMPARE(registry.best_head_for("chat", kBaseA, "chain")->first.id, a1);
    QVERIFY(!registry.best_head_for("math", kBaseA, "chain").has_value());
    QVERIFY(!registry.best_head_for("code", std::string(64, 'c'), "chain").has_value());

    const std::string bad_spec =
        error_of([&] { registry.add_evaluation(make_evaluation(a1, "code", "beam", 1)); });
    QVERIFY2(contains(bad_spec, "chain, tree"), bad_spec.c_str());
  }

  void concurrent_readers_during_a_write() {
    QTemporaryDir dir;
    const fs::path file = temp_path(dir, "tokenfab.db");
    auto writer_db = Database::open(file);
    Registry(*writer_db).add_head(make_head("before"));
    auto reader_db_1 = Database::open(file);
    auto reader_db_2 = Database::open(file);

    constexpr int kNewHeads = 10;
    std::atomic<bool> in_transaction{false}, committed{false};
    std::atomic<int> partial_reads{0};
    std::string failures;  // written by each thread under failures_mutex
    std::mutex failures_mutex;
    auto fail = [&](const std::string& what) {
      std::lock_guard lock(failures_mutex);
      failures += what + "\n";
    };

    std::thread writer([&] {
      try {
        Registry registry(*writer_db);
        sqlite::Transaction transaction(writer_db->connection());
        for (int i = 0; i < kNewHeads; ++i)
          registry.add_head(make_head("new-" + std::to_string(i)));
        in_transaction = true;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        transaction.commit();
        committed = true;
      } catch (const std::exception& e) {
        fail(std::string("writer: ") + e.what());
        in_transaction = committed = true;
      }
    });

    auto read = [&](Database* db, int* reads_during_write, size_t* final_count) {
      try {
        Registry registry(*db);
        while (!in_transaction) std::this_thread::yield();
        bool done = false;
        while (!done) {
          done = committed;  // one more read after the commit is seen
          const auto start = std::chrono::steady_clock::now();
          const size_t n = registry.heads().size();
          const auto waited = std::chrono::steady_clock::now() - start;
          if (waited > std::chrono::seconds(5)) fail("a read waited past the busy timeout");
          if (n != 1 && n != 1 + kNewHeads) ++partial_reads;
          if (!committed && n == 1) ++*reads_during_write;
          *final_count = n;
        }
      } catch (const std::exception& e) {
        fail(std::string("reader: ") + e.what());
      }
    };
    int reads_1 = 0, reads_2 = 0;
    size_t final_1 = 0, final_2 = 0;
    std::thread reader_1(read, reader_db_1.get(), &reads_1, &final_1);
    std::thread reader_2(read, reader_db_2.get(), &reads_2, &final_2);
    writer.join();
    reader_1.join();
    reader_2.join();

    QVERIFY2(failures.empty(), failures.c_str());
    QCOMPARE(partial_reads.load(), 0);
    // Both readers read while the write transaction was open, so neither was blocked by it.
    QVERIFY(reads_1 > 0);
    QVERIFY(reads_2 > 0);
    QCOMPARE(final_1, size_t{1 + kNewHeads});
    QCOMPARE(final_2, size_t{1 + kNewHeads});
    QCOMPARE(Registry(*reader_db_1).heads().size(), size_t{1 + kNewHeads});
  }

  void killed_writer_leaves_the_registry_consistent() {
    QTemporaryDir dir;
    const fs::path file = temp_path(dir, "tokenfab.db");
    Registry(*Database::open(file)).add_head(make_head("before"));  // closed again: no fd to fork

    const pid_t child = fork();
    QVERIFY(child >= 0);
    if (child == 0) {
      try {
        auto db = Database::open(file);
        // A tiny page cache makes SQLite spill the uncommitted pages into the WAL, so the kill
        // leaves real uncommitted frames behind, not just nothing.
        db->connection().exec("PRAGMA cache_size = 8");
        Registry registry(*db);
        sqlite::Transaction transaction(db->connection());
        HeadRecord doomed = make_head("doomed");
        doomed.summary_json = "{\"pad\":\"" + std::string(2 << 20, 'x') + "\"}";
        registry.add_head(doomed);
        for (int i = 0; i < 20; ++i) registry.add_head(make_head("doomed-" + std::to_string(i)));
        raise(SIGKILL);
      } catch (...) {
      }
      _exit(3);
    }
    int status = 0;
    QCOMPARE(waitpid(child, &status, 0), child);
    QVERIFY2(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
             "the child did not reach its kill (it failed before)");
    const fs::path wal = file.string() + "-wal";
    QVERIFY2(fs::exists(wal) && fs::file_size(wal) > 0,
             "the child's uncommitted pages did not reach the WAL");

    auto db = Database::open(file);
    QCOMPARE(query_text(*db, "PRAGMA integrity_check"), std::string("ok"));
    Registry registry(*db);
    QVERIFY(!registry.find_head("doomed").has_value());
    QVERIFY(!registry.find_head("doomed-0").has_value());
    QCOMPARE(registry.heads().size(), size_t{1});
    const int64_t id = registry.add_head(make_head("after"));
    QCOMPARE(registry.find_head("after")->id, id);
    QCOMPARE(registry.heads().size(), size_t{2});
  }

  void user_data_dir_honours_tokenfab_home() {
    QTemporaryDir dir;
    EnvGuard tokenfab_home("TOKENFAB_HOME"), xdg("XDG_DATA_HOME"), home("HOME");

    const fs::path chosen = temp_path(dir, "chosen/home");
    qputenv("TOKENFAB_HOME", QByteArray::fromStdString(chosen.string()));
    qputenv("XDG_DATA_HOME", QByteArray::fromStdString(temp_path(dir, "xdg").string()));
    QCOMPARE(user_data_dir(), chosen);
    QVERIFY(fs::is_directory(chosen));
    QCOMPARE(Database::open_default()->path(), chosen / "tokenfab.db");
    QVERIFY(fs::exists(chosen / "tokenfab.db"));

    qunsetenv("TOKENFAB_HOME");
    QCOMPARE(user_data_dir(), temp_path(dir, "xdg") / "tokenfab");

    qunsetenv("XDG_DATA_HOME");
    qputenv("HOME", QByteArray::fromStdString(temp_path(dir, "user").string()));
    QCOMPARE(user_data_dir(), temp_path(dir, "user") / ".local" / "share" / "tokenfab");
    QVERIFY(fs::is_directory(temp_path(dir, "user/.local/share/tokenfab")));
  }
};

QTEST_APPLESS_MAIN(TestStorage)
#include "test_storage.moc"
