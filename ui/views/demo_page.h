#pragma once
// DemoPage ("Demo"): N parallel agents — one request per prompt of a prompt set, all submitted at
// once — as a grid of live streaming tiles, with the aggregate decode TPS large on top and each
// agent's completion time: the 1000-TPS demo.
//
// Figures, all measured:
//   DECODE TPS     the engine's output tokens/s over its rate window (EngineSnapshot::output_rate),
//                  live while a run is going, frozen when it ends;
//   RUN TPS        the run's tokens / time since its submit (after the run: / its wall time);
//   completion     per agent, engine timestamps: the request's end − the run's submit;
//   event loop     lateness of a 10 ms precise single-shot timer on the GUI thread, re-armed at
//                  each firing, sampled for the whole run (p50 / p99 / max): how long the GUI
//                  could not react while 16+ streams were painting.
// A run ends when every agent's request has ended (finished, cancelled by Stop, or failed); its
// DemoSummary is emitted by finished() and recorded in History (RunStore, kind "demo").
//
// Tiles append only the new text of each 30 Hz StreamUpdate; nothing re-renders per token.

#include <QElapsedTimer>
#include <QLabel>
#include <QMetaType>
#include <QPushButton>
#include <QString>
#include <QTimer>
#include <QVector>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/metrics/request_metrics.h"
#include "core/serving/engine.h"
#include "ui/bridge/engine_bridge.h"
#include "ui/views/demo_tile.h"
#include "ui/views/event_loop_probe.h"
#include "ui/views/page.h"

#include <nlohmann/json_fwd.hpp>

class QComboBox;
class QGridLayout;
class QPlainTextEdit;
class QSpinBox;

namespace tokenfab::ui {

struct DemoSummary {
  int agents = 0;
  QString prompt_set;
  int max_tokens = 0;
  bool stopped = false;  // Stop was pressed before every agent had ended
  int finished = 0, cancelled = 0, failed = 0;
  int64_t tokens = 0;
  double wall_s = 0;                        // submit → the last agent's end (engine clock)
  std::optional<double> tok_s;              // tokens / wall_s
  std::optional<double> peak_decode_tok_s;  // highest DECODE TPS snapshot during the run
  std::optional<double> completion_p50_s, completion_max_s;  // over finished agents
  std::vector<std::optional<double>> completion_s;           // per agent, in agent order
  std::vector<int64_t> agent_tokens;                         // per agent
  LatencySummary event_loop;

  nlohmann::json to_json() const;
};

class DemoPage : public Page {
  Q_OBJECT

 public:
  static constexpr int kColumns = 4;
  static constexpr int kMaxAgents = 64;

  explicit DemoPage(QWidget* parent = nullptr);
  ~DemoPage() override;  // cancels a run in progress

  QString title() const override { return "Demo"; }
  void attach(EngineBridge* bridge) override;

  // Submits `agents` requests, prompt i being entry i (mod size) of `prompt_set` (a builtin set
  // name, see prompt_sets.h) in the model's chat template. False (with the reason on the status
  // line) when no model is loaded, a run is going, or a request is refused.
  bool start(int agents, const QString& prompt_set, int max_tokens);
  void stop();  // cancels every agent still running; the run then ends as usual

  bool running() const { return running_; }
  DemoSummary summary() const { return summary_; }  // of the last run that ended
  const std::vector<DemoAgent>& agents() const { return agents_; }
  QString hud_text(const QString& name) const;  // "DECODE TPS", "RUN TPS", "TOKENS", ...
  QString status_text() const;
  const EventLoopProbe& event_loop() const { return probe_; }

 signals:
  void finished(const tokenfab::ui::DemoSummary& summary);

 public slots:
  void on_streamed(const QVector<tokenfab::ui::StreamUpdate>& updates);
  void on_snapshot(const tokenfab::ui::SnapshotPtr& snapshot);

 private:
  QWidget* make_controls();
  QWidget* make_hud();
  void build_tiles(int n);
  std::vector<std::vector<TokenId>> make_prompts(int agents, const std::string& set_name,
                                                 std::vector<QString>& titles);
  void on_agent_ended(size_t index);
  void finish_run();
  void record_run();
  void update_hud();
  void update_buttons();
  void show_status(const QString& text);

  EngineBridge* bridge_ = nullptr;
  EventLoopProbe probe_;

  // The run in progress (or the last one).
  std::vector<DemoAgent> agents_;
  std::map<RequestId, size_t> index_of_;
  std::vector<DemoTile*> tiles_;
  MetricsTime submitted_{};
  QElapsedTimer elapsed_;
  int64_t tokens_ = 0;
  int ended_ = 0;
  bool running_ = false, stopped_ = false;
  std::optional<double> decode_tok_s_, peak_decode_tok_s_;
  QString prompt_set_;
  int max_tokens_ = 0;
  DemoSummary summary_;

  QSpinBox* agents_spin_ = nullptr;
  QComboBox* set_combo_ = nullptr;
  QSpinBox* tokens_spin_ = nullptr;
  QPushButton* start_button_ = nullptr;
  QPushButton* stop_button_ = nullptr;
  std::map<QString, QLabel*> hud_;
  QLabel* detail_ = nullptr;  // event-loop and completion percentiles
  QLabel* status_ = nullptr;
  QWidget* grid_host_ = nullptr;
  QGridLayout* grid_ = nullptr;
};

}  // namespace tokenfab::ui

Q_DECLARE_METATYPE(tokenfab::ui::DemoSummary)
