#pragma once
// EventLoopProbe: how late the GUI thread's event loop runs timers while the app is busy (the
// Demo page samples it during a run: how long the GUI could not react while many streams were
// painting).

#include <QElapsedTimer>
#include <QObject>
#include <QTimer>
#include <cstdint>
#include <optional>
#include <vector>

namespace tokenfab::ui {

// Lateness of the GUI event loop: a precise single-shot timer due every kIntervalMs; each firing
// records how far past its due time it ran, then re-arms for now + kIntervalMs.
class EventLoopProbe : public QObject {
  Q_OBJECT

 public:
  static constexpr int kIntervalMs = 10;

  explicit EventLoopProbe(QObject* parent = nullptr);
  void start();  // clears the samples
  void stop();
  bool running() const { return timer_.isActive(); }
  const std::vector<double>& lateness_ms() const { return lateness_ms_; }
  // When the latest firing was due, seconds after start().
  double worst_at_s() const { return worst_at_s_; }

 private:
  void fire();

  QTimer timer_;
  QElapsedTimer clock_;
  qint64 due_ns_ = 0;
  std::vector<double> lateness_ms_;
  double worst_ms_ = 0, worst_at_s_ = 0;
};

struct LatencySummary {
  int64_t samples = 0;
  std::optional<double> p50_ms, p99_ms, max_ms;
  std::optional<double> max_at_s;  // when the latest firing was due, s after the run began
};
LatencySummary summarize_latency(const std::vector<double>& ms);

}  // namespace tokenfab::ui
