#pragma once
// `tokenfab --screenshot FILE --view VIEW`: once the model has loaded, runs a short real workload
// suited to the view (chat: one message; live, kv: 8 short requests streamed for up to ~3 s;
// devices: the same, once the page has measured the machine's limits on the idle engine;
// demo: a 16-agent run of kDemoTokens tokens each, to its end; history: with fewer than two runs
// recorded, kHistoryBatches batches of short requests, each recorded as a "screenshot-workload" run
// with its measured figures, then the two newest runs selected for comparison; models: no
// workload, the model library once its first scan has finished, the loaded model marked),
// renders the view's page to FILE as PNG and quits the application with 0 — or prints why it
// could not and quits with 1.

#include <QElapsedTimer>
#include <QObject>
#include <QString>
#include <QTimer>
#include <set>
#include <vector>

#include "ui/bridge/engine_bridge.h"

namespace tokenfab::ui {
class MainWindow;
class Page;
}  // namespace tokenfab::ui

namespace tokenfab::app {

class ScreenshotRun : public QObject {
  Q_OBJECT

 public:
  static constexpr int kTimeoutS = 300;   // the whole workload
  static constexpr int kStreamMs = 3000;  // live / kv: how long requests stream at most
  static constexpr int kDemoAgents = 16;
  static constexpr int kDemoTokens = 48;
  static constexpr int kHistoryBatches[] = {4, 8};  // history: requests per recorded batch
  static constexpr int kHistoryTokens = 32;         // history: tokens generated per request

  // `page_title` is the page to show and render; `view` is the --view name.
  ScreenshotRun(ui::MainWindow* window, ui::EngineBridge* bridge, QString view, QString page_title,
                QString file, QObject* parent = nullptr);

 private:
  void start();
  void start_chat(ui::Page* page);
  void start_demo(ui::Page* page);
  void start_devices(ui::Page* page);  // once the limits are measured, start_requests()
  void start_models(ui::Page* page);   // once the library is scanned, grab_soon()
  void start_requests();
  void start_history(ui::Page* page);
  void start_history_batch();
  void on_history_streamed(const QVector<ui::StreamUpdate>& updates);
  void record_history_batch();  // the ended batch's figures → one RunRecord
  void show_history();          // refresh, select the two newest rows, grab
  void on_streamed(const QVector<ui::StreamUpdate>& updates);
  void grab_soon();  // after one more snapshot, so the page shows the latest figures
  void grab();
  void fail(const QString& message);

  ui::MainWindow* window_;
  ui::EngineBridge* bridge_;
  QString view_, page_title_, file_;
  std::set<RequestId> pending_;
  QTimer timeout_;
  bool grabbing_ = false;
  bool requests_started_ = false;
  int64_t conversation_id_ = 0;  // chat: the conversation made for the screenshot (deleted after)
  // history: the requests of each batch (batch i has kHistoryBatches[i] requests), and those of
  // the running batch that have not ended.
  std::vector<std::vector<RequestId>> history_batches_;
  std::set<RequestId> history_pending_;
};

}  // namespace tokenfab::app
