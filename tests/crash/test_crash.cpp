// Crash safety without a model (label unit): tokenfab-crash-child streaming conversation replies
// and recording runs, and `tokenfab-cli heads export` writing a head's GGUF file, each killed with
// SIGKILL at seeded random moments, a few dozen times. After every kill the database opened again
// passes PRAGMA integrity_check, holds every row the child reported committed, marks the reply
// that was streaming "interrupted" (none stays "generating"), and no exported file is partial.

#include <QtTest>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "core/common/sha256.h"
#include "core/speculative/draft_head.h"
#include "core/storage/conversations.h"
#include "core/storage/registry.h"
#include "core/storage/runs.h"
#include "tests/crash/crash_harness.h"
#include "tests/crash/crash_scenarios.h"

namespace fs = std::filesystem;
using namespace tokenfab;
using namespace tokenfab::crash;

namespace {

const std::string kChild = TOKENFAB_BINARY_DIR "/bin/tokenfab-crash-child";
const std::string kCli = TOKENFAB_BINARY_DIR "/bin/tokenfab-cli";

std::string home_env(const QTemporaryDir& home) {
  return "TOKENFAB_HOME=" + home.path().toStdString();
}

std::string json_state(const std::string& stats_json) {
  const nlohmann::json j = nlohmann::json::parse(stats_json, nullptr, false);
  return j.is_object() && j.contains("state") && j["state"].is_string()
             ? j["state"].get<std::string>()
             : "";
}

}  // namespace

class CrashTest : public QObject {
  Q_OBJECT

 private slots:
  void conversation_replies_survive_kills();
  void recorded_runs_survive_kills();
  void head_export_survives_kills();
};

void CrashTest::conversation_replies_survive_kills() {
  QTemporaryDir home;
  QVERIFY(home.isValid());
  const fs::path log = fs::path(home.path().toStdString()) / "child.log";
  Delays delays(1);
  const std::string full = reply_text();
  std::map<int64_t, size_t> saved;  // reply id → the longest length reported committed
  std::map<int64_t, bool> finished;
  int interrupted = 0;
  const int n = kills(30);
  for (int k = 0; k < n; ++k) {
    const KilledRun run =
        run_and_kill({kChild, "conversation"}, {home_env(home)}, log, delays.next(30, 600));
    QVERIFY2(!run.exited_early, tail_of(log).c_str());
    std::vector<int64_t> messages;
    for (const std::string& line : run.lines) {
      const auto w = words(line);
      if (w[0] == "message") messages.push_back(std::stoll(w[1]));
      if (w[0] == "reply") saved[std::stoll(w[1])] = std::stoull(w[2]);
      if (w[0] == "finished") finished[std::stoll(w[1])] = true;
    }
    const auto db = Database::open(fs::path(home.path().toStdString()) / "tokenfab.db");
    QCOMPARE(integrity(*db), std::string("ok"));
    std::map<int64_t, MessageRecord> rows;
    Conversations store(*db);
    for (const ConversationRecord& c : store.list())
      for (const MessageRecord& m : store.messages(c.id)) rows[m.id] = m;
    for (const int64_t id : messages) QVERIFY2(rows.contains(id), "a committed question is lost");
    for (const auto& [id, length] : saved) {
      QVERIFY2(rows.contains(id), "a committed reply is lost");
      const MessageRecord& m = rows[id];
      // What was committed, or a later save that committed just before the kill.
      QVERIFY(m.content.size() >= length);
      QVERIFY(full.starts_with(m.content));
      const std::string state = json_state(m.stats_json);
      if (finished.contains(id)) {
        QCOMPARE(state, std::string("finished"));
        QCOMPARE(m.content, full);
      } else {
        QVERIFY2(state == "interrupted" || (state == "finished" && m.content == full),
                 ("reply " + std::to_string(id) + " is '" + state + "' after the kill").c_str());
      }
    }
    for (const auto& [id, m] : rows) {
      QVERIFY2(json_state(m.stats_json) != Conversations::kGenerating,
               "a reply of a killed process still reads generating");
    }
    interrupted = 0;
    for (const auto& [id, m] : rows) interrupted += json_state(m.stats_json) == "interrupted";
  }
  qInfo("conversation: %d kills (seed %llu), %zu replies saved, %zu finished, %d interrupted", n,
        static_cast<unsigned long long>(delays.seed()), saved.size(), finished.size(), interrupted);
  QVERIFY2(interrupted > 0, "no kill landed while a reply streamed");
}

void CrashTest::recorded_runs_survive_kills() {
  QTemporaryDir home;
  QVERIFY(home.isValid());
  const fs::path log = fs::path(home.path().toStdString()) / "child.log";
  Delays delays(2);
  std::map<int64_t, int64_t> committed;  // run id → seq
  const int n = kills(30);
  for (int k = 0; k < n; ++k) {
    const KilledRun run =
        run_and_kill({kChild, "runs"}, {home_env(home)}, log, delays.next(30, 400));
    QVERIFY2(!run.exited_early, tail_of(log).c_str());
    for (const std::string& line : run.lines) {
      const auto w = words(line);
      committed[std::stoll(w[1])] = std::stoll(w[2]);
    }
    const auto db = Database::open(fs::path(home.path().toStdString()) / "tokenfab.db");
    QCOMPARE(integrity(*db), std::string("ok"));
    const RunStore store(*db);
    for (const auto& [id, seq] : committed) {
      const auto r = store.get(id);
      QVERIFY2(r.has_value(), ("committed run " + std::to_string(id) + " is lost").c_str());
      QCOMPARE(nlohmann::json::parse(r->summary_json)["seq"].get<int64_t>(), seq);
    }
  }
  qInfo("runs: %d kills (seed %llu), %zu committed runs all present", n,
        static_cast<unsigned long long>(delays.seed()), committed.size());
  QVERIFY(!committed.empty());
}

// A synthetic medusa head (no model needed: the gguf export only reads and writes the head file),
// large enough (4 × 1024² F32) that a kill lands in the write.
void CrashTest::head_export_survives_kills() {
  QTemporaryDir home;
  QVERIFY(home.isValid());
  const fs::path dir = home.path().toStdString();
  const fs::path log = dir / "child.log";
  DraftHeadInfo info;
  info.type = "medusa";
  info.name = "crash-export";
  info.domain = "code";
  info.base_model_sha256 = std::string(64, 'a');
  info.n_heads = 4;
  info.n_embd = 1024;
  info.n_vocab = 1000;
  DraftHead head = make_medusa_head(info);
  for (size_t k = 0; k < head.w.size(); ++k)
    for (size_t i = 0; i < head.w[k].size(); ++i) head.w[k][i] = float((i * 31 + k) % 97) / 97.0f;
  const fs::path source = dir / "heads" / "crash-export.gguf";
  fs::create_directories(source.parent_path());
  save_draft_head(head, source);
  {
    const auto db = Database::open(dir / "tokenfab.db");
    HeadRecord record;
    record.name = info.name;
    record.domain = info.domain;
    record.type = info.type;
    record.base_model_sha256 = info.base_model_sha256;
    record.file = source.string();
    Registry(*db).add_head(record);
  }
  const fs::path out = dir / "export" / "head.gguf";
  fs::create_directories(out.parent_path());
  const std::vector<std::string> export_args = {kCli,           "heads", "export",
                                                "crash-export", "--out", out.string()};
  const auto [status, seconds] = run_to_end(export_args, {home_env(home)}, log);
  QVERIFY2(WIFEXITED(status) && WEXITSTATUS(status) == 0, tail_of(log).c_str());
  const std::string reference = sha256_file(out);
  const uintmax_t size = fs::file_size(out);
  Delays delays(3);
  // Mostly past the start-up, where the file is written.
  const int min_ms = int(seconds * 400), max_ms = std::max(20, int(seconds * 1100));
  int complete = 0, absent = 0;
  const int n = kills(30);
  for (int k = 0; k < n; ++k) {
    fs::remove(out);
    const KilledRun run =
        run_and_kill(export_args, {home_env(home)}, log, delays.next(min_ms, max_ms));
    if (run.exited_early)
      QVERIFY2(WIFEXITED(run.exit_status) && WEXITSTATUS(run.exit_status) == 0,
               tail_of(log).c_str());
    if (!fs::exists(out)) {
      ++absent;
      continue;
    }
    QCOMPARE(fs::file_size(out), size);
    QCOMPARE(sha256_file(out), reference);
    QCOMPARE(load_draft_head(out).info.n_heads, 4);
    ++complete;
  }
  // Hidden temporary files (.head.gguf.tmp-*) may stay beside it; never the file itself, partial.
  qInfo(
      "heads export: %d kills (seed %llu, %d–%d ms; a full export takes %.0f ms): %d complete "
      "files, %d absent",
      n, static_cast<unsigned long long>(delays.seed()), min_ms, max_ms, seconds * 1e3, complete,
      absent);
}

QTEST_GUILESS_MAIN(CrashTest)
#include "test_crash.moc"
