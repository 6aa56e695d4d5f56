#pragma once
// DevicesPage ("Devices"): the engine's devices and how close their steps run to the machine's
// physical limits.
//   - a table of the devices in the latest snapshot: name, role, threads, KV blocks used/total,
//     steps, mean decode step (decode busy time ÷ decode steps);
//   - a mode / role editor: colocated or disaggregated, a role per CPU virtual device
//     (cpu:0 … cpu:N−1, N = hardware threads, at least 2; "unused", "prefill", "decode", "both"),
//     the total thread count; Apply restarts the engine through EngineBridge::reconfigure (the
//     model stays loaded);
//   - a roofline panel per device (core/device/roofline.h): for the snapshot's recent steps, the
//     measured compute time against the memory-bound and compute-bound times, and the share of
//     the physical limit the steps reached (Σ bound ÷ Σ measured).
//
// The limits are measured on a background thread, once per distinct device thread count, while
// the page is shown and a model is loaded (bandwidth and the model's matmul peak both depend on
// the threads used; a probe takes the cores for a second or two, so it is not run for a user
// who never opens the page); the panel says "measuring…" until its device's limits are in. A
// probe shares the cores and the memory bus with whatever the engine runs meanwhile, which slows
// it, so limits measured while the engine had requests or took steps are provisional: the panel
// says so, and they are measured again at the next snapshot of an idle engine. Each limit keeps
// the highest value measured (sharing only ever makes a probe slower). The measuring thread reads the model's weights: the page joins it before
// it is destroyed, and a measurement for a model that has since been replaced is discarded.
//
// Works without a bridge: tests call set_model / on_snapshot directly; attach() connects the
// bridge's loaded() and snapshotTaken().

#include <QString>
#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/device/roofline.h"
#include "ui/bridge/engine_bridge.h"
#include "ui/views/page.h"

class QButtonGroup;
class QComboBox;
class QLabel;
class QRadioButton;
class QSpinBox;
class QTableWidget;
class QVBoxLayout;

namespace tokenfab::ui {

class TimeChart;

// Measured limits for a device with a given number of threads.
struct MachineLimits {
  double bandwidth_gbs = 0;
  double peak_gmacs = 0;
};

class DevicesPage : public Page {
  Q_OBJECT

 public:
  explicit DevicesPage(QWidget* parent = nullptr);
  ~DevicesPage() override;  // joins the measuring thread

  QString title() const override { return "Devices"; }
  void attach(EngineBridge* bridge) override;

  // The model the roofline is computed for; starts measuring the limits for every thread count
  // seen so far (once the page is shown). nullptr clears it. The page and its measuring thread
  // share the model's ownership, so a reload cannot free it under a measurement.
  void set_model(std::shared_ptr<const LlamaModel> model);
  // Restarts the engine with `config` through the bridge; returns the error message (empty on
  // success). Without a bridge, says so.
  QString apply(const EngineConfig& config);
  // The configuration the editor describes (devices, roles, threads over the bridge's current
  // configuration).
  EngineConfig editor_config() const;

  // For tests and screenshots.
  int device_rows() const;
  QString cell(int row, int column) const;
  // Points of a device's roofline series: "measured", "memory", "compute"; -1 when unknown.
  int roofline_points(const QString& device, const QString& series) const;
  QString roofline_summary(const QString& device) const;  // the sentence under the chart
  // The roofline chart's time axis (seconds before the newest step); (0, 0) when unknown.
  std::pair<double, double> roofline_x_range(const QString& device) const;
  std::optional<MachineLimits> limits(int threads) const;
  // Whether the limits for `threads` were measured while the engine was busy (to be measured
  // again when it is idle).
  bool limits_provisional(int threads) const { return provisional_.count(threads) != 0; }
  // Whether the limits of every thread count seen so far are measured, none provisionally.
  bool limits_settled() const {
    return !limits_.empty() && wanted_.empty() && provisional_.empty() && !measuring_.load();
  }
  int cpu_choices() const { return static_cast<int>(role_boxes_.size()); }

 public slots:
  void on_snapshot(const tokenfab::ui::SnapshotPtr& snapshot);

 protected:
  void showEvent(QShowEvent* event) override;  // starts measuring what is wanted

 signals:
  void limitsMeasured(int threads);

 private:
  struct Panel {
    QWidget* box = nullptr;
    TimeChart* chart = nullptr;
    QLabel* summary = nullptr;
  };

  QWidget* make_editor();
  void fill_table(const EngineSnapshot& snapshot);
  void update_panels(const EngineSnapshot& snapshot);
  void update_panel(Panel& panel, const DeviceSnapshot& device);
  Panel& panel_for(const std::string& device);
  void load_editor(const EngineConfig& config);
  void on_apply_clicked();
  // Starts measuring the next wanted thread count when the page is shown, the model is set and
  // no measurement is running.
  void measure_next();
  void on_measured(int threads, MachineLimits limits, uint64_t generation);
  void join_measurer();

  EngineBridge* bridge_ = nullptr;
  std::shared_ptr<const LlamaModel> model_;
  uint64_t model_generation_ = 0;  // bumped by set_model: older measurements are discarded
  SnapshotPtr last_snapshot_;

  std::map<int, MachineLimits> limits_;  // by threads
  std::set<int> wanted_;                 // thread counts seen, not yet measured
  std::set<int> provisional_;            // measured while the engine was busy
  std::thread measurer_;
  std::atomic<bool> measuring_{false};
  // The running measurement's start: the engine's steps then, and whether it had requests.
  int64_t steps_at_start_ = 0;
  bool busy_at_start_ = false;

  QTableWidget* table_ = nullptr;
  QRadioButton* colocated_ = nullptr;
  QRadioButton* disaggregated_ = nullptr;
  std::vector<QComboBox*> role_boxes_;  // cpu:0 … cpu:N−1
  QSpinBox* threads_ = nullptr;
  QVBoxLayout* panels_layout_ = nullptr;
  std::map<std::string, Panel> panels_;  // by device name
};

}  // namespace tokenfab::ui
