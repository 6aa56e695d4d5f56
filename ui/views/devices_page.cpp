#include "ui/views/devices_page.h"

#include <QButtonGroup>
#include <QComboBox>
#include <QGridLayout>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QMessageBox>
#include <QPushButton>
#include <QRadioButton>
#include <QScrollArea>
#include <QSpinBox>
#include <QTableWidget>
#include <QVBoxLayout>
#include <algorithm>
#include <chrono>
#include <exception>

#include "core/device/device.h"
#include "ui/views/app_settings.h"
#include "ui/widgets/time_chart.h"

namespace tokenfab::ui {

namespace {

const QStringList kTableHeader = {
    "Device", "Role", "Threads", "KV blocks used / total", "Steps", "Mean decode step (ms)"};
const QStringList kRoles = {"unused", "prefill", "decode", "both"};
enum RoleIndex { kUnused = 0, kPrefill = 1, kDecode = 2, kBoth = 3 };

// No request queued, running or transferring.
bool engine_idle(const EngineSnapshot& snapshot) {
  return snapshot.requests.empty();
}

int64_t engine_steps(const EngineSnapshot& snapshot) {
  int64_t steps = 0;
  for (const DeviceSnapshot& d : snapshot.devices) steps += d.steps;
  return steps;
}

int cpu_device_count() {
  return std::max(2, static_cast<int>(std::thread::hardware_concurrency()));
}

std::vector<DeviceSpec> parse_or_empty(const std::string& list) {
  if (list.empty()) return {};
  try {
    return parse_device_list(list);
  } catch (const std::exception&) {
    return {};
  }
}

}  // namespace

DevicesPage::DevicesPage(QWidget* parent) : Page(parent) {
  table_ = new QTableWidget(0, static_cast<int>(kTableHeader.size()), this);
  table_->setHorizontalHeaderLabels(kTableHeader);
  table_->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  table_->horizontalHeader()->setStretchLastSection(true);
  table_->verticalHeader()->setVisible(false);
  table_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  table_->setSelectionMode(QAbstractItemView::NoSelection);
  table_->setMaximumHeight(160);

  auto* panels = new QWidget;
  panels_layout_ = new QVBoxLayout(panels);
  panels_layout_->setContentsMargins(0, 0, 0, 0);
  panels_layout_->addStretch(1);
  auto* scroll = new QScrollArea(this);
  scroll->setWidgetResizable(true);
  scroll->setWidget(panels);

  auto* top = new QHBoxLayout;
  top->addWidget(table_, 1);
  top->addWidget(make_editor());

  auto* layout = new QVBoxLayout(this);
  layout->addLayout(top);
  layout->addWidget(new QLabel(tr("<b>Roofline</b> — each step's measured compute time against "
                                  "the time its bytes need at the measured bandwidth and the "
                                  "time its multiply-adds need at the measured matmul peak."),
                               this));
  layout->addWidget(scroll, 1);
}

DevicesPage::~DevicesPage() {
  join_measurer();
}

QWidget* DevicesPage::make_editor() {
  auto* box = new QGroupBox(tr("Mode and roles"), this);
  auto* grid = new QGridLayout(box);
  colocated_ = new QRadioButton(tr("colocated"), box);
  disaggregated_ = new QRadioButton(tr("disaggregated"), box);
  colocated_->setChecked(true);
  auto* mode = new QButtonGroup(box);
  mode->addButton(colocated_);
  mode->addButton(disaggregated_);
  grid->addWidget(colocated_, 0, 0);
  grid->addWidget(disaggregated_, 0, 1);
  const int n = cpu_device_count();
  for (int i = 0; i < n; ++i) {
    auto* combo = new QComboBox(box);
    combo->addItems(kRoles);
    combo->setCurrentIndex(i == 0 ? kBoth : kUnused);
    combo->setToolTip(
        tr("Colocated: every device not unused is a full worker. Disaggregated: a device "
           "that does both serves as two partitions, a prefill and a decode worker over one KV "
           "storage (prompts change partition without a copy)."));
    grid->addWidget(new QLabel(QStringLiteral("cpu:%1").arg(i), box), i + 1, 0);
    grid->addWidget(combo, i + 1, 1);
    role_boxes_.push_back(combo);
  }
  threads_ = new QSpinBox(box);
  threads_->setRange(0, 4096);
  threads_->setSpecialValueText(tr("all"));
  threads_->setToolTip(
      tr("Total threads over all devices, split evenly (0: all hardware threads)"));
  grid->addWidget(new QLabel(tr("threads total"), box), n + 1, 0);
  grid->addWidget(threads_, n + 1, 1);
  auto* apply_button = new QPushButton(tr("Apply"), box);
  connect(apply_button, &QPushButton::clicked, this, &DevicesPage::on_apply_clicked);
  grid->addWidget(apply_button, n + 2, 0, 1, 2);
  return box;
}

void DevicesPage::attach(EngineBridge* bridge) {
  bridge_ = bridge;
  auto on_loaded = [this] {
    load_editor(bridge_->config());
    set_model(bridge_->shared_model());
  };
  connect(bridge, &EngineBridge::loaded, this, on_loaded);
  // The bridge drops the model when another one starts loading; so does the page (a measurement
  // running then keeps its own handle).
  connect(bridge, &EngineBridge::loadStarted, this, [this] { set_model(nullptr); });
  connect(bridge, &EngineBridge::snapshotTaken, this, &DevicesPage::on_snapshot);
  if (bridge->ready()) on_loaded();
}

void DevicesPage::set_model(std::shared_ptr<const LlamaModel> model) {
  if (model == model_) return;
  model_ = std::move(model);
  ++model_generation_;
  limits_.clear();
  provisional_.clear();
  if (last_snapshot_)
    for (const DeviceSnapshot& d : last_snapshot_->devices) wanted_.insert(d.threads);
  measure_next();
  if (last_snapshot_) update_panels(*last_snapshot_);
}

void DevicesPage::load_editor(const EngineConfig& config) {
  disaggregated_->setChecked(config.disaggregated());
  colocated_->setChecked(!config.disaggregated());
  for (QComboBox* combo : role_boxes_) combo->setCurrentIndex(kUnused);
  auto mark = [this](const std::string& list, int role) {
    for (const DeviceSpec& spec : parse_or_empty(list))
      if (spec.kind == DeviceKind::kCpu && spec.index < static_cast<int>(role_boxes_.size())) {
        QComboBox* box = role_boxes_[static_cast<size_t>(spec.index)];
        // A device in both lists: its two partitions.
        const bool other = (role == kDecode && box->currentIndex() == kPrefill);
        box->setCurrentIndex(other ? kBoth : role);
      }
  };
  if (config.disaggregated()) {
    mark(config.prefill, kPrefill);
    mark(config.decode, kDecode);
  } else {
    mark(config.devices, kBoth);
  }
  threads_->setValue(config.threads);
}

EngineConfig DevicesPage::editor_config() const {
  EngineConfig config = bridge_ ? bridge_->config() : EngineConfig{};
  config.devices = EngineConfig{}.devices;
  config.prefill.clear();
  config.decode.clear();
  config.long_prefill.clear();
  config.long_prompt_tokens = 0;
  config.threads = threads_->value();
  QStringList used, prefill, decode;
  for (size_t i = 0; i < role_boxes_.size(); ++i) {
    const QString name = QStringLiteral("cpu:%1").arg(i);
    const int role = role_boxes_[i]->currentIndex();
    if (role != kUnused) used << name;
    if (role == kPrefill || role == kBoth) prefill << name;
    if (role == kDecode || role == kBoth) decode << name;
  }
  if (disaggregated_->isChecked()) {
    // Left empty when none is chosen, so the engine names the missing side.
    config.prefill = prefill.join(',').toStdString();
    config.decode = decode.join(',').toStdString();
  } else {
    config.devices = used.join(',').toStdString();
  }
  return config;
}

QString DevicesPage::apply(const EngineConfig& config) {
  if (!bridge_) return tr("no engine is attached to this page");
  try {
    if (!config.disaggregated() && config.devices.empty())
      return tr("colocated mode needs at least one device (give one a role other than unused)");
    config.validate();
    bridge_->reconfigure(config);
    save_device_roles(config);
  } catch (const std::exception& e) {
    return QString::fromStdString(e.what());
  }
  return {};
}

void DevicesPage::on_apply_clicked() {
  const QString error = apply(editor_config());
  if (!error.isEmpty())
    QMessageBox::warning(this, tr("Devices"),
                         tr("The engine was not reconfigured.\n\n%1").arg(error));
}

void DevicesPage::on_snapshot(const SnapshotPtr& snapshot) {
  if (!snapshot) return;
  last_snapshot_ = snapshot;
  for (const DeviceSnapshot& d : snapshot->devices)
    if (d.threads > 0 && !limits_.count(d.threads)) wanted_.insert(d.threads);
  measure_next();
  fill_table(*snapshot);
  update_panels(*snapshot);
}

void DevicesPage::fill_table(const EngineSnapshot& snapshot) {
  table_->setRowCount(static_cast<int>(snapshot.devices.size()));
  auto set = [this](int row, int column, const QString& text) {
    QTableWidgetItem* item = table_->item(row, column);
    if (!item) {
      item = new QTableWidgetItem;
      table_->setItem(row, column, item);
    }
    if (item->text() != text) item->setText(text);
  };
  for (size_t i = 0; i < snapshot.devices.size(); ++i) {
    const DeviceSnapshot& d = snapshot.devices[i];
    const int row = static_cast<int>(i);
    set(row, 0, QString::fromStdString(d.name));
    set(row, 1, QString::fromStdString(d.role));
    set(row, 2, QString::number(d.threads));
    set(row, 3, QStringLiteral("%1 / %2").arg(d.kv.n_blocks - d.kv.n_free).arg(d.kv.n_blocks));
    set(row, 4, QString::number(d.steps));
    set(row, 5,
        d.decode_steps > 0 ? QString::number(1000.0 * d.decode_busy_s / d.decode_steps, 'f', 2)
                           : QStringLiteral("—"));
  }
}

DevicesPage::Panel& DevicesPage::panel_for(const std::string& device) {
  auto it = panels_.find(device);
  if (it != panels_.end()) return it->second;
  Panel panel;
  auto* box = new QGroupBox(QString::fromStdString(device));
  auto* layout = new QVBoxLayout(box);
  panel.box = box;
  panel.chart = new TimeChart(tr("Step compute time vs physical limits (recent steps)"), "ms", box);
  panel.chart->ensure_series("measured", tr("measured"));
  panel.chart->ensure_series("memory", tr("memory-bound (bytes ÷ bandwidth)"));
  panel.chart->ensure_series("compute", tr("compute-bound (MACs ÷ peak)"));
  panel.chart->setMinimumHeight(260);
  panel.summary = new QLabel(box);
  panel.summary->setWordWrap(true);
  layout->addWidget(panel.chart);
  layout->addWidget(panel.summary);
  panels_layout_->insertWidget(panels_layout_->count() - 1, box);  // before the stretch
  return panels_.emplace(device, panel).first->second;
}

void DevicesPage::update_panels(const EngineSnapshot& snapshot) {
  std::set<std::string> present;
  for (const DeviceSnapshot& d : snapshot.devices) {
    present.insert(d.name);
    update_panel(panel_for(d.name), d);
  }
  for (auto it = panels_.begin(); it != panels_.end();) {  // devices gone after a reconfigure
    if (present.count(it->first)) {
      ++it;
      continue;
    }
    it->second.box->deleteLater();
    it = panels_.erase(it);
  }
}

void DevicesPage::update_panel(Panel& panel, const DeviceSnapshot& device) {
  QList<QPointF> measured, memory, compute;
  const auto limits = this->limits(device.threads);
  const std::vector<StepSample>& steps = device.recent_steps;
  double sum_measured = 0, sum_bound = 0;
  int n = 0;
  const MetricsTime newest = steps.empty() ? MetricsTime{} : steps.back().end;
  for (const StepSample& s : steps) {
    if (s.compute_s <= 0) continue;
    const double x = std::chrono::duration<double>(s.end - newest).count();  // ≤ 0 s
    measured.append({x, 1000.0 * s.compute_s});
    if (!limits || !model_) continue;
    const StepWork work{s.rows, s.logit_rows, s.attended_positions, s.kv_positions, s.compute_s};
    const RooflinePoint p = roofline(work, model_->hparams(), model_->weight_bytes(),
                                     limits->bandwidth_gbs, limits->peak_gmacs);
    memory.append({x, 1000.0 * p.memory_bound_s});
    compute.append({x, 1000.0 * p.compute_bound_s});
    sum_measured += p.measured_s;
    sum_bound += p.bound_s;
    ++n;
  }
  panel.chart->set_points("measured", measured);
  panel.chart->set_points("memory", memory);
  panel.chart->set_points("compute", compute);
  const double x_min = measured.isEmpty() ? -1.0 : measured.front().x();
  // At least the last second, ending now (the newest step).
  panel.chart->fit_axes(std::min(x_min, -1.0), 0.0);

  QString text;
  if (!model_) {
    text = tr("No model loaded.");
  } else if (!limits) {
    text = tr("measuring… (host bandwidth and matmul peak with %1 threads)").arg(device.threads);
  } else if (n == 0) {
    text = tr("No steps yet. Limits with %1 threads: %2 GB/s, %3 GMAC/s (%4 kernels).")
               .arg(device.threads)
               .arg(limits->bandwidth_gbs, 0, 'f', 1)
               .arg(limits->peak_gmacs, 0, 'f', 1)
               .arg(QString::fromLatin1(cpu_matmul_kernels()));
  } else {
    text = tr("The last %1 steps ran at %2% of the physical limit (limit %3 ms, measured %4 ms "
              "per step on average; %5 GB/s and %6 GMAC/s measured with %7 threads, %8 "
              "kernels).")
               .arg(n)
               .arg(100.0 * sum_bound / sum_measured, 0, 'f', 1)
               .arg(1000.0 * sum_bound / n, 0, 'f', 2)
               .arg(1000.0 * sum_measured / n, 0, 'f', 2)
               .arg(limits->bandwidth_gbs, 0, 'f', 1)
               .arg(limits->peak_gmacs, 0, 'f', 1)
               .arg(device.threads)
               .arg(QString::fromLatin1(cpu_matmul_kernels()));
  }
  if (limits && limits_provisional(device.threads))
    text +=
        tr(" The limits were measured while the engine was running, which slows the probe; "
           "they are measured again when it is idle.");
  if (panel.summary->text() != text) panel.summary->setText(text);
}

void DevicesPage::showEvent(QShowEvent* event) {
  Page::showEvent(event);
  measure_next();
}

void DevicesPage::measure_next() {
  if (!model_ || measuring_.load() || !isVisible()) return;
  int threads = 0;
  if (!wanted_.empty()) {
    threads = *wanted_.begin();
    wanted_.erase(wanted_.begin());
    if (limits_.count(threads)) return measure_next();
  } else if (!provisional_.empty() && last_snapshot_ && engine_idle(*last_snapshot_)) {
    threads = *provisional_.begin();
  } else {
    return;
  }
  join_measurer();  // the previous one has finished
  steps_at_start_ = last_snapshot_ ? engine_steps(*last_snapshot_) : 0;
  busy_at_start_ = last_snapshot_ && !engine_idle(*last_snapshot_);
  measuring_ = true;
  std::shared_ptr<const LlamaModel> model = model_;
  const uint64_t generation = model_generation_;
  measurer_ = std::thread([this, model = std::move(model), threads, generation] {
    MachineLimits limits;
    try {
      limits.bandwidth_gbs = measure_host_bandwidth_gbs(threads);
      limits.peak_gmacs = measure_int8_peak_gmacs(*model, threads);
    } catch (const std::exception&) {
      limits = {};  // reported as not positive: the panel shows no bound
    }
    QMetaObject::invokeMethod(
        this, [this, threads, limits, generation] { on_measured(threads, limits, generation); },
        Qt::QueuedConnection);
  });
}

void DevicesPage::on_measured(int threads, MachineLimits limits, uint64_t generation) {
  measuring_ = false;
  join_measurer();
  if (generation == model_generation_) {
    const bool busy =
        busy_at_start_ || (last_snapshot_ && (!engine_idle(*last_snapshot_) ||
                                              engine_steps(*last_snapshot_) != steps_at_start_));
    const auto known = limits_.find(threads);
    if (known != limits_.end()) {
      limits.bandwidth_gbs = std::max(limits.bandwidth_gbs, known->second.bandwidth_gbs);
      limits.peak_gmacs = std::max(limits.peak_gmacs, known->second.peak_gmacs);
    }
    limits_[threads] = limits;
    wanted_.erase(threads);  // snapshots during the measurement asked for it again
    if (busy)
      provisional_.insert(threads);
    else
      provisional_.erase(threads);
    if (last_snapshot_) update_panels(*last_snapshot_);
    emit limitsMeasured(threads);
  }
  measure_next();
}

void DevicesPage::join_measurer() {
  if (measurer_.joinable()) measurer_.join();
}

std::optional<MachineLimits> DevicesPage::limits(int threads) const {
  const auto it = limits_.find(threads);
  if (it == limits_.end()) return std::nullopt;
  return it->second;
}

int DevicesPage::device_rows() const {
  return table_->rowCount();
}

QString DevicesPage::cell(int row, int column) const {
  const QTableWidgetItem* item = table_->item(row, column);
  return item ? item->text() : QString();
}

int DevicesPage::roofline_points(const QString& device, const QString& series) const {
  const auto it = panels_.find(device.toStdString());
  return it == panels_.end() ? -1 : it->second.chart->points(series);
}

std::pair<double, double> DevicesPage::roofline_x_range(const QString& device) const {
  const auto it = panels_.find(device.toStdString());
  return it == panels_.end() ? std::pair<double, double>{} : it->second.chart->x_range();
}

QString DevicesPage::roofline_summary(const QString& device) const {
  const auto it = panels_.find(device.toStdString());
  return it == panels_.end() ? QString() : it->second.summary->text();
}

}  // namespace tokenfab::ui
