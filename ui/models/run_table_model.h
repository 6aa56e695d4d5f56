#pragma once
// RunTableModel: past runs for the History page, one row per run (newest first as given): time,
// kind, title, model and a few key figures read from the run's summary JSON — whichever of them
// the run has (serve-bench: throughput, TTFT and ITL percentiles; draft-head evaluations:
// decode tok/s, ACCEPT/STEP, speedup). Read-only; set_runs() resets it.

#include <QAbstractTableModel>
#include <QString>
#include <QVariant>
#include <utility>
#include <vector>

#include "core/storage/runs.h"

namespace tokenfab::ui {

// A JSON object's leaves as ("itl_ms.p99", value) pairs in document order; array elements are
// keyed by index ("devices.0.name"). Numbers become double, booleans bool, null an invalid
// QVariant, strings QString. Text that is not a JSON object gives no pairs.
std::vector<std::pair<QString, QVariant>> flatten_json(const std::string& json_text);

class RunTableModel : public QAbstractTableModel {
  Q_OBJECT

 public:
  enum Column {
    kTime,
    kKind,
    kTitle,
    kModel,
    kTokPerS,
    kTtftP50,
    kItlP50,
    kItlP99,
    kAcceptPerStep,
    kSpeedup,
    kColumnCount
  };
  // Qt::UserRole on any column: the run's id; kKindRole: its kind. On a figure column, kValueRole
  // is the number (invalid when the run has none).
  static constexpr int kIdRole = Qt::UserRole;
  static constexpr int kKindRole = Qt::UserRole + 1;
  static constexpr int kValueRole = Qt::UserRole + 2;

  using QAbstractTableModel::QAbstractTableModel;

  void set_runs(std::vector<RunRecord> runs);
  const std::vector<RunRecord>& runs() const { return runs_; }
  const RunRecord& run(int row) const { return runs_.at(static_cast<size_t>(row)); }

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation orientation,
                      int role = Qt::DisplayRole) const override;

 private:
  // Per row, the figure columns' numbers (NaN when absent), parsed once in set_runs().
  std::vector<std::vector<double>> figures_;
  std::vector<RunRecord> runs_;
};

}  // namespace tokenfab::ui
