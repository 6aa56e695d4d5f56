#include "ui/views/kv_page.h"

#include <QHBoxLayout>
#include <QHeaderView>
#include <QSplitter>
#include <QTabWidget>
#include <QVBoxLayout>
#include <chrono>
#include <map>

#include "core/tokenizer/tokenizer.h"
#include "ui/views/kv_block_tokens.h"
#include "ui/widgets/time_chart.h"

namespace tokenfab::ui {

namespace {

const QString kDash = QStringLiteral("—");

QString percent(const std::optional<double>& fraction) {
  return fraction ? QString::number(*fraction * 100.0, 'f', 1) + " %" : kDash;
}

QString bytes_text(int64_t bytes) {
  if (bytes >= 1'000'000'000) return QString::number(bytes / 1e9, 'f', 2) + " GB";
  if (bytes >= 1'000'000) return QString::number(bytes / 1e6, 'f', 2) + " MB";
  if (bytes >= 1'000) return QString::number(bytes / 1e3, 'f', 1) + " kB";
  return QString::number(bytes) + " B";
}

QTableWidget* make_table(const QStringList& headers, QWidget* parent) {
  auto* table = new QTableWidget(0, static_cast<int>(headers.size()), parent);
  table->setHorizontalHeaderLabels(headers);
  table->setEditTriggers(QAbstractItemView::NoEditTriggers);
  table->setSelectionBehavior(QAbstractItemView::SelectRows);
  table->verticalHeader()->setVisible(false);
  table->horizontalHeader()->setStretchLastSection(true);
  return table;
}

// Reuses the cell's item: a table refreshed at 10 Hz should not reallocate every cell.
void set_cell(QTableWidget* table, int row, int column, const QString& text,
              const QString& tooltip = {}) {
  QTableWidgetItem* item = table->item(row, column);
  if (!item) {
    item = new QTableWidgetItem();
    table->setItem(row, column, item);
  }
  if (item->text() != text) item->setText(text);
  if (item->toolTip() != tooltip) item->setToolTip(tooltip);
}

}  // namespace

KvPage::KvPage(QWidget* parent) : Page(parent) {
  devices_ = new QComboBox(this);
  devices_->setSizeAdjustPolicy(QComboBox::AdjustToContents);
  usage_ = new QLabel("No snapshot yet.", this);
  usage_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  auto* top = new QHBoxLayout();
  top->addWidget(new QLabel("Device", this));
  top->addWidget(devices_);
  top->addWidget(usage_, 1);

  map_ = new BlockMap(this);
  details_ = new QLabel("Click a block to inspect it.", this);
  details_->setWordWrap(true);
  details_->setAlignment(Qt::AlignTop | Qt::AlignLeft);
  details_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  tokens_ = new QPlainTextEdit(this);
  tokens_->setReadOnly(true);
  tokens_->setPlaceholderText("The block's tokens, decoded, when the snapshot allows.");
  auto* panel = new QWidget(this);
  panel->setMinimumWidth(260);
  auto* panel_layout = new QVBoxLayout(panel);
  panel_layout->setContentsMargins(0, 0, 0, 0);
  panel_layout->addWidget(details_);
  panel_layout->addWidget(new QLabel("Tokens", panel));
  panel_layout->addWidget(tokens_, 1);
  auto* upper = new QSplitter(Qt::Horizontal, this);
  upper->addWidget(map_);
  upper->addWidget(panel);
  upper->setStretchFactor(0, 3);
  upper->setStretchFactor(1, 1);

  sequences_ = make_table({"Request", "State", "Devices", "Prompt tokens", "Cached prompt",
                           "Output tokens", "Preemptions", "Blocks held"},
                          this);
  // "Copy ms": the transfer's own copying; "Waited ms": time it waited for the prefill's layers
  // (streamed transfers); "Overlapped": layers copied while the prefill was still computing.
  transfers_ = make_table({"Request", "Src → dst", "Blocks", "Bytes", "Copy ms", "Waited ms",
                           "Overlapped", "GB/s", "State"},
                          this);
  usage_chart_ = new TimeChart("KV blocks of the shown device over time", "% of blocks", this);
  usage_chart_->ensure_series("owned", "owned by sequences");
  usage_chart_->ensure_series("cached", "prefix-cached, unreferenced");
  auto* tabs = new QTabWidget(this);
  tabs->addTab(sequences_, "Live sequences");
  tabs->addTab(transfers_, "Transfer log");
  tabs->addTab(usage_chart_, "Usage over time");

  auto* split = new QSplitter(Qt::Vertical, this);
  split->addWidget(upper);
  split->addWidget(tabs);
  split->setStretchFactor(0, 3);
  split->setStretchFactor(1, 2);

  auto* layout = new QVBoxLayout(this);
  layout->addLayout(top);
  layout->addWidget(split, 1);

  connect(devices_, &QComboBox::currentIndexChanged, this, [this](int index) {
    if (index < 0) return;
    const std::string name = devices_->itemData(index).toString().toStdString();
    if (name == device_) return;
    device_ = name;
    block_ = -1;
    map_->set_selected(-1);
    show_device();
    show_usage();
    update_details();
  });
  connect(map_, &BlockMap::blockClicked, this, &KvPage::select_block);
}

void KvPage::attach(EngineBridge* bridge) {
  bridge_ = bridge;
  connect(bridge, &EngineBridge::snapshotTaken, this, &KvPage::on_snapshot);
}

const Tokenizer* KvPage::tokenizer() const {
  if (tokenizer_) return tokenizer_;
  return bridge_ ? bridge_->tokenizer() : nullptr;
}

void KvPage::on_snapshot(const SnapshotPtr& snapshot) {
  if (!snapshot) return;
  snapshot_ = snapshot;
  sync_device_list();
  record_usage();
  show_device();
  show_usage();
  update_details();
  update_sequences();
  update_transfers();
}

void KvPage::record_usage() {
  if (!origin_) origin_ = snapshot_->time;
  const double t = std::chrono::duration<double>(snapshot_->time - *origin_).count();
  for (const DeviceSnapshot& d : snapshot_->devices) {
    if (d.kv.n_blocks <= 0) continue;
    auto& history = usage_history_[d.name];
    history.push_back(
        {t, 100.0 * d.kv.n_owned / d.kv.n_blocks, 100.0 * d.kv.n_cached / d.kv.n_blocks});
    while (history.size() > kUsagePoints) history.pop_front();
  }
}

void KvPage::show_usage() {
  QList<QPointF> owned, cached;
  const auto it = usage_history_.find(device_);
  if (it != usage_history_.end()) {
    for (const UsagePoint& p : it->second) {
      owned.append({p.t_s, p.owned_pct});
      cached.append({p.t_s, p.cached_pct});
    }
  }
  usage_chart_->set_points("owned", owned);
  usage_chart_->set_points("cached", cached);
  usage_chart_->fit_axes(owned.isEmpty() ? 0.0 : owned.front().x(),
                         owned.isEmpty() ? 60.0 : owned.back().x());
}

int KvPage::usage_points() const {
  return usage_chart_->points("owned");
}

const DeviceSnapshot* KvPage::shown_device() const {
  if (!snapshot_) return nullptr;
  for (const DeviceSnapshot& d : snapshot_->devices)
    if (d.name == device_) return &d;
  return nullptr;
}

// Rebuilds the combo only when the device set changed (a reconfigured engine); keeps the
// selection by name, else shows the first device.
void KvPage::sync_device_list() {
  QStringList names;
  for (const DeviceSnapshot& d : snapshot_->devices) names << QString::fromStdString(d.name);
  QStringList current;
  for (int i = 0; i < devices_->count(); ++i) current << devices_->itemData(i).toString();
  if (names != current) {
    const QSignalBlocker blocker(devices_);
    devices_->clear();
    for (const DeviceSnapshot& d : snapshot_->devices)
      devices_->addItem(
          QString("%1 (%2)").arg(QString::fromStdString(d.name), QString::fromStdString(d.role)),
          QString::fromStdString(d.name));
  }
  if (!shown_device()) {
    device_ = snapshot_->devices.empty() ? std::string() : snapshot_->devices.front().name;
    block_ = -1;
    map_->set_selected(-1);
  }
  const QSignalBlocker blocker(devices_);
  devices_->setCurrentIndex(devices_->findData(QString::fromStdString(device_)));
}

bool KvPage::select_device(const QString& name) {
  const int index = devices_->findData(name);
  if (index < 0) return false;
  devices_->setCurrentIndex(index);  // currentIndexChanged does the rest
  return true;
}

void KvPage::show_device() {
  const DeviceSnapshot* d = shown_device();
  if (!d) {
    map_->set_snapshot(KvSnapshot{});
    usage_->setText("No device.");
    return;
  }
  map_->set_snapshot(d->kv);
  const KvSnapshot& kv = d->kv;
  usage_->setText(QString("%1 blocks × %2 tokens · free %3 · owned %4 · cached %5 · "
                          "%6 sequences · prefix hit rate: this pool %7, engine %8")
                      .arg(kv.n_blocks)
                      .arg(kv.block_size)
                      .arg(kv.n_free)
                      .arg(kv.n_owned)
                      .arg(kv.n_cached)
                      .arg(kv.n_sequences)
                      .arg(kv.prefix.hit_tokens + kv.prefix.miss_tokens > 0
                               ? percent(kv.prefix_hit_rate())
                               : kDash)
                      .arg(percent(snapshot_->summary.prefix_hit_rate)));
}

void KvPage::select_block(int block) {
  block_ = block;
  map_->set_selected(block);
  update_details();
}

void KvPage::update_details() {
  const DeviceSnapshot* d = shown_device();
  if (!d || block_ < 0 || block_ >= static_cast<int>(d->kv.blocks.size())) {
    details_->setText("Click a block to inspect it.");
    tokens_->clear();
    return;
  }
  details_->setText(QString("%1 · %2\n")
                        .arg(QString::fromStdString(d->name))
                        .arg(BlockMap::describe(d->kv, block_)));
  const BlockTokens found = tokenfab::ui::block_tokens(d->kv, block_, snapshot_->requests);
  QString text;
  if (found.tokens.empty()) {
    text = found.unavailable;
  } else {
    const QString where =
        found.first_position < 0
            ? QString("request #%1 (output tokens repeat: position not unique)").arg(*found.request)
            : QString("request #%1, positions %2–%3")
                  .arg(*found.request)
                  .arg(found.first_position)
                  .arg(found.first_position + static_cast<int>(found.tokens.size()) - 1);
    if (const Tokenizer* t = tokenizer()) {
      text = where + ":\n" + QString::fromStdString(t->decode(found.tokens));
    } else {
      QStringList ids;
      for (const TokenId id : found.tokens) ids << QString::number(id);
      text = where + ", token ids (no tokenizer loaded): " + ids.join(' ');
    }
  }
  if (tokens_->toPlainText() != text) tokens_->setPlainText(text);
}

void KvPage::update_sequences() {
  // Blocks each request holds per device (a prefill device's hold on -id counts for id).
  std::map<RequestId, std::map<std::string, int>> held;
  for (const DeviceSnapshot& d : snapshot_->devices)
    for (const BlockRecord& r : d.kv.blocks)
      for (const SequenceId owner : r.owners) ++held[owner < 0 ? -owner : owner][d.name];

  const auto& requests = snapshot_->requests;
  sequences_->setRowCount(static_cast<int>(requests.size()));
  for (int row = 0; row < static_cast<int>(requests.size()); ++row) {
    const RequestInfo& r = requests[static_cast<size_t>(row)];
    QString devices = QString::fromStdString(r.prefill_device);
    if (!r.decode_device.empty() && r.decode_device != r.prefill_device)
      devices += " → " + QString::fromStdString(r.decode_device);
    QStringList blocks;
    for (const auto& [device, n] : held[r.id])
      blocks << QString("%1: %2").arg(QString::fromStdString(device)).arg(n);
    set_cell(sequences_, row, 0, QString("#%1").arg(r.id));
    set_cell(sequences_, row, 1, request_state_name(r.state));
    set_cell(sequences_, row, 2, devices);
    set_cell(sequences_, row, 3, QString::number(r.n_prompt));
    set_cell(sequences_, row, 4, QString::number(r.cached_prompt_tokens));
    set_cell(sequences_, row, 5, QString::number(r.output.size()));
    set_cell(sequences_, row, 6, QString::number(r.preemptions));
    set_cell(sequences_, row, 7, blocks.isEmpty() ? kDash : blocks.join(" · "));
  }
}

void KvPage::update_transfers() {
  const auto& transfers = snapshot_->transfers;  // most recent last; shown most recent first
  const int n = static_cast<int>(transfers.size());
  transfers_->setRowCount(n);
  for (int row = 0; row < n; ++row) {
    const KvTransferStats& t = transfers[static_cast<size_t>(n - 1 - row)];
    const auto gb_s = t.gb_per_s();
    set_cell(transfers_, row, 0, QString("#%1").arg(t.request));
    set_cell(transfers_, row, 1,
             QString("%1 → %2").arg(QString::fromStdString(t.src), QString::fromStdString(t.dst)));
    // Between a device's two partitions full blocks change hands: no byte moves for them.
    set_cell(transfers_, row, 2,
             t.handed_over > 0 ? QString("%1 (%2 handed over)").arg(t.blocks).arg(t.handed_over)
                               : QString::number(t.blocks));
    set_cell(transfers_, row, 3, bytes_text(t.bytes));
    set_cell(transfers_, row, 4, QString::number(t.copy_seconds() * 1e3, 'f', 2));
    set_cell(transfers_, row, 5, QString::number(t.waited_s * 1e3, 'f', 1));
    set_cell(transfers_, row, 6, QString("%1 / %2").arg(t.layers_overlapped).arg(t.layers_done));
    set_cell(transfers_, row, 7, gb_s ? QString::number(*gb_s, 'f', 2) : kDash);
    set_cell(transfers_, row, 8, transfer_state_name(t.state), QString::fromStdString(t.error));
  }
}

}  // namespace tokenfab::ui
