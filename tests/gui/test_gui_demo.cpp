// The Demo page (ui/views/demo_page.h) on the offscreen platform with the real default model: a
// run of 4 agents × 16 tokens ends with each tile's token count equal to the engine's output for
// that request, the HUD's TOKENS equal to their sum, a completion time for every agent within the
// test's own clock readings of when the agents were submitted and when their ends were seen, a
// non-empty event-loop sample, and the run recorded in History; Stop mid-run cancels every agent
// still running and leaves the engine with no request in flight. TOKENFAB_HOME points at a
// temporary directory before anything opens the database.

#include <QSignalSpy>
#include <QtTest>
#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/model/model_files.h"
#include "core/storage/database.h"
#include "core/storage/runs.h"
#include "tests/common/default_model.h"
#include "ui/bridge/engine_bridge.h"
#include "ui/views/demo_page.h"

using namespace tokenfab;
using namespace tokenfab::ui;

namespace {

constexpr int kLoadTimeoutMs = 120'000;
constexpr int kRunTimeoutMs = 300'000;

}  // namespace

class GuiDemoTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void page_constructs();
  void run_matches_what_the_engine_reported();
  void stop_cancels_every_request();
  void cleanupTestCase();

 private:
  QTemporaryDir home_;
  std::unique_ptr<EngineBridge> bridge_;
};

void GuiDemoTest::initTestCase() {
  QString path;
  TOKENFAB_DEFAULT_MODEL_WITH_HOME(path, home_);
  bridge_ = std::make_unique<EngineBridge>();
  QSignalSpy loaded(bridge_.get(), &EngineBridge::loaded);
  QSignalSpy failed(bridge_.get(), &EngineBridge::failed);
  EngineConfig config;
  config.threads = 2;
  bridge_->load(path, config);
  QTRY_VERIFY_WITH_TIMEOUT(loaded.count() + failed.count() > 0, kLoadTimeoutMs);
  QVERIFY2(failed.isEmpty(), qPrintable(failed.isEmpty() ? "" : failed.first().first().toString()));
  QVERIFY(bridge_->ready());
}

void GuiDemoTest::page_constructs() {
  DemoPage page;
  QCOMPARE(page.title(), QString("Demo"));
  QVERIFY(!page.start(4, "chat_turns", 16));  // no bridge yet
  page.attach(bridge_.get());
  QVERIFY(!page.start(4, "no-such-set", 16));
  QVERIFY(page.status_text().contains("no-such-set"));
  QVERIFY(!page.running());
}

void GuiDemoTest::run_matches_what_the_engine_reported() {
  DemoPage page;
  page.attach(bridge_.get());
  QSignalSpy finished(&page, &DemoPage::finished);
  // This test's own clock readings: before and after the agents are submitted, and when each
  // request's last event reached a subscriber of the engine (after the engine stamped its end).
  // Shared with the subscriber, which may outlive an early return.
  struct Seen {
    std::mutex mutex;
    std::map<RequestId, MetricsTime> ended;
  };
  auto seen = std::make_shared<Seen>();
  const int64_t subscription = bridge_->engine()->subscribe([seen](const TokenEvent& e) {
    if (!request_ended(e.state)) return;
    const MetricsTime now = MetricsClock::now();
    std::lock_guard lock(seen->mutex);
    seen->ended.emplace(e.id, now);
  });
  const MetricsTime before_start = MetricsClock::now();
  QVERIFY2(page.start(4, "chat_turns", 16), qPrintable(page.status_text()));
  const MetricsTime after_start = MetricsClock::now();
  QVERIFY(page.running());
  QTRY_VERIFY_WITH_TIMEOUT(!finished.isEmpty(), kRunTimeoutMs);
  QVERIFY(!page.running());
  bridge_->engine()->unsubscribe(subscription);

  const DemoSummary s = page.summary();
  QCOMPARE(s.agents, 4);
  QCOMPARE(s.finished, 4);
  QVERIFY(!s.stopped);
  int64_t sum = 0;
  // Each agent's completion time (its submission to its end, on the engine's stamps) lies within
  // this test's own readings: at most from before the submissions to the moment its end was seen,
  // at least from after them to that moment, less kSeenLag for the engine's thread to pass the
  // event on after stamping it.
  constexpr double kSeenLag = 0.25;  // seconds
  double latest_seen_from_before = 0.0, latest_seen_from_after = 0.0;
  std::vector<double> completions;
  for (const DemoAgent& agent : page.agents()) {
    const RequestInfo info = bridge_->engine()->request(agent.id);
    QCOMPARE(info.state, RequestState::kFinished);
    QCOMPARE(agent.tokens, static_cast<int64_t>(info.output.size()));
    QVERIFY(agent.tokens >= 1 && agent.tokens <= 16);
    QVERIFY2(agent.completion_s.has_value(), qPrintable(agent.title));
    MetricsTime ended;
    {
      std::lock_guard lock(seen->mutex);
      const auto it = seen->ended.find(agent.id);
      QVERIFY2(it != seen->ended.end(), qPrintable(agent.title + ": no end event was seen"));
      ended = it->second;
    }
    const double from_before = seconds_between(before_start, ended);
    const double from_after = seconds_between(after_start, ended);
    QVERIFY2(*agent.completion_s <= from_before && *agent.completion_s >= from_after - kSeenLag,
             qPrintable(QString("%1: completion %2 s, seen %3 s after the submissions began and "
                                "%4 s after they ended")
                            .arg(agent.title)
                            .arg(*agent.completion_s)
                            .arg(from_before)
                            .arg(from_after)));
    latest_seen_from_before = std::max(latest_seen_from_before, from_before);
    latest_seen_from_after = std::max(latest_seen_from_after, from_after);
    completions.push_back(*agent.completion_s);
    sum += agent.tokens;
  }
  // The run's wall time is the last agent's end: within the same readings of the last end seen.
  QVERIFY2(s.wall_s <= latest_seen_from_before && s.wall_s >= latest_seen_from_after - kSeenLag,
           qPrintable(QString("wall %1 s, the last end seen %2 s after the submissions began")
                          .arg(s.wall_s)
                          .arg(latest_seen_from_before)));
  std::sort(completions.begin(), completions.end());
  QVERIFY(s.completion_max_s.has_value() && *s.completion_max_s == completions.back());
  QVERIFY(s.completion_p50_s.has_value() && *s.completion_p50_s >= completions.front() &&
          *s.completion_p50_s <= completions.back());
  QCOMPARE(s.tokens, sum);
  QCOMPARE(page.hud_text("TOKENS"), QString::number(sum));
  QCOMPARE(page.hud_text("AGENTS DONE"), QString("4/4"));
  QVERIFY(s.tok_s.has_value() && *s.tok_s > 0);
  QVERIFY(s.event_loop.samples > 0);
  QVERIFY(s.event_loop.p99_ms.has_value() && s.event_loop.max_ms.has_value());
  QVERIFY(*s.event_loop.p50_ms <= *s.event_loop.p99_ms &&
          *s.event_loop.p99_ms <= *s.event_loop.max_ms);

  // Recorded in History with the same figures.
  const auto db = Database::open_default();
  const std::vector<RunRecord> runs = RunStore(*db).list("demo");
  QVERIFY2(!runs.empty(), qPrintable(page.status_text()));
  const nlohmann::json recorded = nlohmann::json::parse(runs.front().summary_json);
  QCOMPARE(recorded.at("output_tokens").get<int64_t>(), sum);
  QCOMPARE(recorded.at("event_loop_ms").at("samples").get<int64_t>(), s.event_loop.samples);
}

void GuiDemoTest::stop_cancels_every_request() {
  DemoPage page;
  page.attach(bridge_.get());
  QSignalSpy finished(&page, &DemoPage::finished);
  QVERIFY2(page.start(4, "documents", 1024), qPrintable(page.status_text()));
  QTRY_VERIFY_WITH_TIMEOUT(page.hud_text("TOKENS").toLongLong() >= 4, kRunTimeoutMs);
  page.stop();
  QTRY_VERIFY_WITH_TIMEOUT(!finished.isEmpty(), kRunTimeoutMs);

  const DemoSummary s = page.summary();
  QVERIFY(s.stopped);
  QVERIFY(s.cancelled >= 1);
  QCOMPARE(s.finished + s.cancelled, 4);
  for (const DemoAgent& agent : page.agents()) {
    const RequestInfo info = bridge_->engine()->request(agent.id);
    QVERIFY(request_ended(info.state));
    QCOMPARE(agent.state, info.state);
    QCOMPARE(agent.tokens, static_cast<int64_t>(info.output.size()));
    if (info.state != RequestState::kFinished) QCOMPARE(info.state, RequestState::kCancelled);
  }
  QVERIFY(bridge_->engine()->snapshot().requests.empty());
}

void GuiDemoTest::cleanupTestCase() {
  bridge_.reset();
}

QTEST_MAIN(GuiDemoTest)
#include "test_gui_demo.moc"
