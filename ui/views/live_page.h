#pragma once
// LivePage ("Live"): a HUD of big numbers — DECODE TPS, ACCEPT/STEP, TOKENS, TTFT p50 — over
// charts that follow the engine at the snapshot rate (~10 Hz): decode tok/s (all requests, and
// per running request: its tokens after the first over the time since its first), ACCEPT/STEP,
// ITL and TTFT p50/p99, KV usage per device, KV transfer GB/s, and two bar charts of completed
// requests:
// the accept-length histogram (steps by tokens emitted) and the acceptance rate per draft
// position. Every figure comes from an EngineSnapshot or from streamed token updates; nothing is
// interpolated or smoothed.
//
// Data: one Sample per snapshot, the last kMaxSamples kept (60 s at 10 Hz); the charts show that
// window and Export CSV writes it. Pause freezes the window (snapshots are dropped, tokens are
// still counted); Reset empties it and zeroes the token count.
//
// Works without a bridge: tests (and the screenshot mode) call on_snapshot / on_streamed
// directly; attach() only connects the bridge's signals to them.

#include <QLabel>
#include <QPushButton>
#include <QString>
#include <QVector>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ui/bridge/engine_bridge.h"
#include "ui/views/page.h"

namespace tokenfab::ui {

class BarChart;
class TimeChart;

class LivePage : public Page {
  Q_OBJECT

 public:
  static constexpr size_t kMaxSamples = 600;

  explicit LivePage(QWidget* parent = nullptr);

  QString title() const override { return "Live"; }
  void attach(EngineBridge* bridge) override;

  // Writes the current window, one row per sample, a header first. False (and no file) when the
  // file cannot be written.
  bool export_csv(const QString& path) const;
  bool export_png(const QString& path);  // the page as shown (grab())

  // For tests and the status bar.
  int64_t tokens_seen() const { return tokens_seen_; }
  size_t samples() const { return samples_.size(); }
  bool paused() const { return paused_; }
  // Points of a chart series: "decode_tps", "req:<id>", "accept_per_step", "draft_ms",
  // "verify_ms", "itl_p50", "itl_p99", "ttft_p50", "ttft_p99", "transfer_gb_s", "kv:<device>"; -1
  // for an unknown series.
  int points(const QString& series) const;
  // Bars now shown: "accept_length" (share of steps, %, by tokens per step 1, 2, …) and
  // "position_acceptance" (% of drafts accepted at position +1, +2, …).
  QList<qreal> bars(const QString& chart) const;
  static constexpr int kMaxRequestSeries = 8;   // per-request lines: the newest requests
  QString hud_text(const QString& name) const;  // "DECODE TPS", "ACCEPT/STEP", "TOKENS", "TTFT"

 public slots:
  void on_snapshot(const tokenfab::ui::SnapshotPtr& snapshot);
  void on_streamed(const QVector<tokenfab::ui::StreamUpdate>& updates);
  void set_paused(bool paused);
  void reset();

 private:
  struct Sample {
    double t_s = 0;           // since the first sample of the window's run
    double decode_tok_s = 0;  // output tokens/s over the engine's rate window
    std::optional<double> accept_per_step;
    // Per verifying step of the completed requests: proposing its drafts, and the step itself.
    std::optional<double> draft_ms, verify_ms;
    std::optional<double> itl_p50_ms, itl_p99_ms, ttft_p50_ms, ttft_p99_ms;
    std::map<std::string, double> kv_used_pct;  // device → owned blocks / blocks × 100
    // KV transfers that ended since the previous sample: their bytes over their own copy time.
    std::optional<double> transfer_gb_s;
    std::map<RequestId, double> request_tok_s;  // running requests past their first token
  };

  QWidget* make_hud();
  QWidget* make_buttons();
  void update_hud(const EngineSnapshot* snapshot);
  void update_charts();
  void update_request_series();
  void update_bars(const ServingSummary& summary);
  void choose_and_export_csv();
  void choose_and_export_png();

  std::deque<Sample> samples_;
  std::vector<std::string> devices_;  // every device seen in the window, first-seen order
  std::optional<MetricsTime> origin_;
  // Cumulative transfer totals at the previous sample (for per-interval rates).
  std::optional<TransferTotals> last_transfer_;
  int64_t tokens_seen_ = 0;
  bool paused_ = false;

  // Cumulative step / draft counts of completed requests (ServingSummary), at the last snapshot
  // and at the last Reset: the bars show the difference.
  struct Counts {
    std::vector<int64_t> steps_by_tokens, proposed_at, accepted_at;
  };
  Counts last_counts_, bars_base_;

  std::map<QString, QLabel*> hud_;  // big numbers by name
  TimeChart* tps_chart_ = nullptr;
  TimeChart* request_chart_ = nullptr;
  BarChart* accept_length_chart_ = nullptr;
  BarChart* position_chart_ = nullptr;
  TimeChart* accept_chart_ = nullptr;
  TimeChart* itl_chart_ = nullptr;
  TimeChart* ttft_chart_ = nullptr;
  TimeChart* kv_chart_ = nullptr;
  TimeChart* transfer_chart_ = nullptr;
  QPushButton* pause_button_ = nullptr;
};

}  // namespace tokenfab::ui
