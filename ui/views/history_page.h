#pragma once
// HistoryPage ("History"): past runs from the database — serve-bench runs and other recorded
// workloads (core/storage/runs.h) and draft-head evaluations (the registry's evaluations table,
// shown as kind "heads-eval") — as a table with their key figures, filtered by kind. Selecting two
// rows compares them side by side: every summary and config key (nested keys flattened as
// "itl_ms.p99"), run A (the older), run B and, for numbers, the ratio B/A.
//
// The database is opened for each refresh (on show, on Refresh, after a delete), so runs recorded
// by `tokenfab-cli serve-bench` meanwhile appear. A database that cannot be opened is reported in
// the page, never as a crash. Evaluations belong to their head and are deleted with it (Draft
// heads page); Delete here removes recorded runs only.

#include <QComboBox>
#include <QLabel>
#include <QPushButton>
#include <QTableView>
#include <QTreeWidget>
#include <vector>

#include "ui/models/run_table_model.h"
#include "ui/views/page.h"

namespace tokenfab::ui {

class HistoryPage : public Page {
  Q_OBJECT

 public:
  static constexpr const char* kHeadsEvalKind = "heads-eval";

  explicit HistoryPage(QWidget* parent = nullptr);

  QString title() const override { return "History"; }
  void attach(EngineBridge* bridge) override;

  // Re-reads runs and evaluations into the table (keeping the selection where it can).
  void refresh();
  // Shows only runs of `kind` (empty: all).
  void set_kind_filter(const QString& kind);
  // Selects these table rows (replacing the selection); the comparison follows.
  void select_rows(const QList<int>& rows);
  // Removes the selected recorded runs without asking (Delete asks first); returns how many.
  int delete_selected();

  RunTableModel* model() const { return model_; }
  QTableView* table() const { return table_; }
  QTreeWidget* comparison() const { return comparison_; }
  QComboBox* kind_filter() const { return kind_filter_; }
  // The database error of the last refresh; empty when it read fine.
  QString error() const { return error_; }

 protected:
  void showEvent(QShowEvent* event) override;

 private:
  std::vector<RunRecord> read_runs();  // sets error_
  void update_kinds(const std::vector<RunRecord>& runs);
  void update_comparison();
  void update_buttons();
  void confirm_delete();
  std::vector<const RunRecord*> selected_runs() const;

  RunTableModel* model_;
  QTableView* table_;
  QTreeWidget* comparison_;
  QComboBox* kind_filter_;
  QPushButton* refresh_button_;
  QPushButton* delete_button_;
  QLabel* status_label_;
  QLabel* error_label_;
  QString error_;
};

}  // namespace tokenfab::ui
