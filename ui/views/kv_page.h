#pragma once
// KvPage ("KV inspector"): one device's paged KV cache block by block (BlockMap), the clicked
// block's record and — where the snapshot allows — its tokens as text, the live sequences with
// the blocks they hold per device, the KV transfer log, the prefix-cache figures, and the shown
// device's blocks owned and prefix-cached over time (the last kUsagePoints snapshots).
//
// Everything shown comes from the latest EngineSnapshot (~10 Hz through the bridge, or fed
// directly by tests): on_snapshot() updates the selected device's map and the tables; the clicked
// block's details are re-read from each new snapshot, since its owners and contents change.

#include <QComboBox>
#include <QLabel>
#include <QPlainTextEdit>
#include <QTableWidget>
#include <deque>
#include <map>
#include <optional>
#include <string>

#include "ui/bridge/engine_bridge.h"
#include "ui/views/page.h"
#include "ui/widgets/block_map.h"

namespace tokenfab {
class Tokenizer;
}

namespace tokenfab::ui {

class TimeChart;

class KvPage : public Page {
  Q_OBJECT

 public:
  explicit KvPage(QWidget* parent = nullptr);

  QString title() const override { return "KV inspector"; }
  void attach(EngineBridge* bridge) override;
  // Decodes block tokens to text; attach() takes the bridge's (once its model has loaded).
  void set_tokenizer(const Tokenizer* tokenizer) { tokenizer_ = tokenizer; }

  // For tests and the screenshot mode.
  BlockMap* block_map() const { return map_; }
  QTableWidget* sequences_table() const { return sequences_; }
  QTableWidget* transfers_table() const { return transfers_; }
  QString device() const { return QString::fromStdString(device_); }  // the one shown
  bool select_device(const QString& name);  // false when the snapshot has no such device
  void select_block(int block);             // as if clicked
  QString block_details() const { return details_->text(); }
  QString block_tokens() const { return tokens_->toPlainText(); }
  QString usage_text() const { return usage_->text(); }
  int usage_points() const;  // points of the shown device's "owned" series over time
  static constexpr size_t kUsagePoints = 600;

 public slots:
  void on_snapshot(const tokenfab::ui::SnapshotPtr& snapshot);

 private:
  const DeviceSnapshot* shown_device() const;  // in snapshot_, or nullptr
  void sync_device_list();
  void show_device();  // the map and the usage line for device_
  void update_details();
  void update_sequences();
  void update_transfers();
  void record_usage();  // every device's owned / cached share at this snapshot
  void show_usage();    // the shown device's history in the chart
  const Tokenizer* tokenizer() const;

  EngineBridge* bridge_ = nullptr;
  const Tokenizer* tokenizer_ = nullptr;
  SnapshotPtr snapshot_;
  std::string device_;  // selected device name
  int block_ = -1;      // selected block on device_

  QComboBox* devices_ = nullptr;
  QLabel* usage_ = nullptr;
  BlockMap* map_ = nullptr;
  QLabel* details_ = nullptr;
  QPlainTextEdit* tokens_ = nullptr;
  QTableWidget* sequences_ = nullptr;
  QTableWidget* transfers_ = nullptr;
  TimeChart* usage_chart_ = nullptr;
  struct UsagePoint {
    double t_s, owned_pct, cached_pct;
  };
  std::map<std::string, std::deque<UsagePoint>> usage_history_;  // by device
  std::optional<MetricsTime> origin_;                            // the first snapshot's time
};

}  // namespace tokenfab::ui
