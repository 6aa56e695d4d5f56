// The app's switch for the OpenAI-compatible server (ui/bridge/api_server_bridge.h, the status
// bar's ApiServerControl) on the offscreen platform with the real default model: the server runs
// on the bridge's own engine, so a request from the API is in the snapshots the Live page and the
// KV inspector draw (running, owning KV blocks) and its tokens stream to the bridge like a chat
// reply's; reconfiguring the engine detaches the server and serves the new engine; a refused
// address is reported in words; the status bar's switch turns it off and the choice is kept.
// TOKENFAB_HOME points at a temporary directory (the settings live there).

#include <QLabel>
#include <QStatusBar>
#include <QToolButton>
#include <QtTest>
#include <atomic>
#include <memory>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "tests/common/default_model.h"
#include "ui/bridge/api_server_bridge.h"
#include "ui/bridge/engine_bridge.h"
#include "ui/views/api_server_control.h"
#include "ui/views/main_window.h"

using namespace tokenfab;
using namespace tokenfab::ui;

namespace {

constexpr int kLoadTimeoutMs = 120'000;
constexpr int kReplyTimeoutMs = 300'000;

EngineConfig test_config() {
  EngineConfig config;
  config.threads = 2;
  config.max_context = 1024;
  return config;
}

int port_of(const QString& address) {
  return address.section(QLatin1Char(':'), -1).toInt();
}

}  // namespace

class GuiApiTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void api_requests_run_on_the_apps_engine();
  void a_refused_address_is_reported();
  void the_status_bar_switch_turns_it_off_and_is_kept();

 private:
  QTemporaryDir home_;
  QString model_path_;
};

void GuiApiTest::initTestCase() {
  TOKENFAB_DEFAULT_MODEL_WITH_HOME(model_path_, home_);
}

void GuiApiTest::api_requests_run_on_the_apps_engine() {
  EngineBridge bridge;
  ApiServerBridge server(&bridge);
  ApiServerSettings settings;
  settings.port = 0;
  // Started before the model loads: it answers 503 until the engine is there.
  QVERIFY2(server.start(settings), qPrintable(server.error()));
  QVERIFY(server.address().startsWith(QStringLiteral("http://127.0.0.1:")));
  httplib::Client client("127.0.0.1", port_of(server.address()));
  client.set_read_timeout(kReplyTimeoutMs / 1000, 0);
  {
    const auto health = client.Get("/health");
    QVERIFY(health);
    QCOMPARE(health->status, 503);
  }
  QSignalSpy loaded(&bridge, &EngineBridge::loaded);
  bridge.load(model_path_, test_config());
  QTRY_VERIFY_WITH_TIMEOUT(loaded.count() == 1, kLoadTimeoutMs);
  QCOMPARE(client.Get("/health")->status, 200);

  // A long request from the API, on another thread; the GUI thread watches the bridge.
  QSignalSpy streamed(&bridge, &EngineBridge::streamed);
  std::atomic<int> status{0};
  std::string body;
  std::thread caller([&] {
    httplib::Client c("127.0.0.1", port_of(server.address()));
    c.set_read_timeout(kReplyTimeoutMs / 1000, 0);
    const auto r = c.Post("/v1/completions",
                          R"({"prompt":"Once upon a time","max_tokens":200,"temperature":0.8})",
                          "application/json");
    if (r) body = r->body;
    status = r ? r->status : -1;
  });
  bool seen_running = false, seen_blocks = false;
  RequestId api_request = 0;
  QTRY_VERIFY_WITH_TIMEOUT(
      [&] {
        const SnapshotPtr s = bridge.last_snapshot();
        if (s && !s->requests.empty()) {
          seen_running = true;
          api_request = s->requests.front().id;
          for (const DeviceSnapshot& d : s->devices) seen_blocks |= d.kv.n_owned > 0;
        }
        return (seen_running && seen_blocks) || status != 0;
      }(),
      kReplyTimeoutMs);
  QVERIFY2(seen_running, "the API request never showed in the engine's snapshot");
  QVERIFY2(seen_blocks, "the API request owned no KV block in the snapshot");
  caller.join();
  QCOMPARE(status.load(), 200);
  const nlohmann::json reply = nlohmann::json::parse(body);
  QVERIFY(!reply["choices"][0]["text"].get<std::string>().empty());
  // Its tokens streamed to the bridge like a chat reply's.
  QTRY_VERIFY_WITH_TIMEOUT(
      [&] {
        for (const QList<QVariant>& args : streamed)
          for (const StreamUpdate& u : args.first().value<QVector<StreamUpdate>>())
            if (u.id == api_request && u.ended()) return true;
        return false;
      }(),
      10'000);

  // A new engine (the Devices page applying roles): the server follows it.
  bridge.reconfigure(test_config());
  const auto again =
      client.Post("/v1/completions", R"({"prompt":"The capital of France is","max_tokens":8})",
                  "application/json");
  QVERIFY(again);
  QCOMPARE(again->status, 200);
  server.stop();
  QVERIFY(!server.running());
  QVERIFY(!client.Get("/health"));  // nothing listens any more
}

void GuiApiTest::a_refused_address_is_reported() {
  EngineBridge bridge;
  ApiServerBridge server(&bridge);
  ApiServerSettings settings;
  settings.host = QStringLiteral("0.0.0.0");  // beyond this machine, without a key
  settings.port = 0;
  QVERIFY(!server.start(settings));
  QVERIFY(!server.running());
  QVERIFY2(server.error().contains(QStringLiteral("API key")), qPrintable(server.error()));
  QVERIFY(!ApiServerSettings::load().enabled);  // a failed start is not remembered as on
}

void GuiApiTest::the_status_bar_switch_turns_it_off_and_is_kept() {
  EngineBridge bridge;
  ApiServerBridge server(&bridge);
  MainWindow window(&bridge);
  window.set_api_server(&server);
  ApiServerControl* control = window.api_control();
  QVERIFY(control != nullptr);
  QVERIFY(window.statusBar()->isAncestorOf(control));
  QCOMPARE(control->button()->text(), QStringLiteral("API off"));
  ApiServerSettings settings;
  settings.port = 0;
  settings.save();
  control->toggle_action()->trigger();  // on, with the saved settings
  QVERIFY2(server.running(), qPrintable(server.error()));
  QCOMPARE(control->button()->text(), QStringLiteral("API on"));
  QCOMPARE(control->status_label()->text(), server.address());
  QVERIFY(ApiServerSettings::load().enabled);  // the next start runs it again
  control->toggle_action()->trigger();         // off
  QVERIFY(!server.running());
  QCOMPARE(control->button()->text(), QStringLiteral("API off"));
  QVERIFY(!ApiServerSettings::load().enabled);
}

QTEST_MAIN(GuiApiTest)
#include "test_gui_api.moc"
