#include "ui/views/history_page.h"

#include <QDateTime>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QItemSelectionModel>
#include <QMessageBox>
#include <QSplitter>
#include <QVBoxLayout>
#include <algorithm>
#include <cmath>
#include <exception>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "core/storage/registry.h"

namespace tokenfab::ui {

namespace {

constexpr int kMaxRuns = 500;
const QStringList kKnownKinds = {"serve-bench", "demo", HistoryPage::kHeadsEvalKind};

// The registry's evaluations as runs of kind "heads-eval" (ids are the evaluations' ids).
std::vector<RunRecord> evaluation_runs(Registry& registry) {
  std::vector<RunRecord> out;
  for (const HeadRecord& head : registry.heads()) {
    const auto model = registry.find_model(head.base_model_sha256);
    for (const EvaluationRecord& e : registry.evaluations(head.id)) {
      nlohmann::ordered_json summary = {{"accept_per_step", e.accept_per_step},
                                        {"decode_tok_s", e.decode_tok_s},
                                        {"baseline_decode_tok_s", e.baseline_decode_tok_s}};
      if (e.baseline_decode_tok_s > 0)
        summary["speedup"] = e.decode_tok_s / e.baseline_decode_tok_s;
      // The quantization study's figures: the model file's own speed, measured in the same run.
      if (e.target_quant != "native" && e.native_decode_tok_s > 0) {
        summary["native_decode_tok_s"] = e.native_decode_tok_s;
        summary["net_speedup_vs_native"] = e.decode_tok_s / e.native_decode_tok_s;
      }
      summary["tokens"] = e.tokens;
      summary["per_position"] = e.per_position;
      nlohmann::ordered_json config = {
          {"head", head.name}, {"head_type", head.type},         {"domain", e.domain},
          {"spec", e.spec},    {"target_quant", e.target_quant}, {"prompts", e.prompts}};
      if (!e.devices.empty()) config["devices"] = e.devices;
      RunRecord r;
      r.id = e.id;
      r.kind = HistoryPage::kHeadsEvalKind;
      r.title = head.name + " on " + e.domain + " (" + e.spec +
                (e.target_quant == "native" ? "" : ", target " + e.target_quant) + ")";
      r.model = model ? model->name : head.base_model_sha256.substr(0, 12);
      r.config_json = config.dump();
      r.summary_json = summary.dump();
      r.created_at_ms = e.created_unix * 1000;
      out.push_back(std::move(r));
    }
  }
  return out;
}

QString value_text(const QVariant& v) {
  if (!v.isValid()) return QStringLiteral("null");
  if (v.typeId() == QMetaType::Double) {
    const double d = v.toDouble();
    if (d == static_cast<double>(static_cast<int64_t>(d)) && std::abs(d) < 1e15)
      return QString::number(static_cast<qint64>(d));
    return QString::number(d, 'g', 6);
  }
  if (v.typeId() == QMetaType::Bool) return v.toBool() ? "true" : "false";
  return v.toString();
}

// One group of the comparison ("summary", "config"): every key of A then B's others.
void add_group(QTreeWidget* tree, const QString& name, const std::string& a_json,
               const std::string& b_json) {
  const auto a = flatten_json(a_json);
  const auto b = flatten_json(b_json);
  std::map<QString, QVariant> b_values(b.begin(), b.end());
  std::map<QString, QVariant> a_values(a.begin(), a.end());
  std::vector<QString> keys;
  for (const auto& [key, value] : a) keys.push_back(key);
  for (const auto& [key, value] : b)
    if (!a_values.count(key)) keys.push_back(key);

  auto* group = new QTreeWidgetItem(tree, QStringList{name});
  group->setFirstColumnSpanned(true);
  for (const QString& key : keys) {
    const auto ia = a_values.find(key);
    const auto ib = b_values.find(key);
    const QString ta = ia == a_values.end() ? QStringLiteral("—") : value_text(ia->second);
    const QString tb = ib == b_values.end() ? QStringLiteral("—") : value_text(ib->second);
    QString ratio;
    if (ia != a_values.end() && ib != b_values.end() && ia->second.typeId() == QMetaType::Double &&
        ib->second.typeId() == QMetaType::Double && ia->second.toDouble() != 0.0)
      ratio = QString::number(ib->second.toDouble() / ia->second.toDouble(), 'f', 3);
    auto* item = new QTreeWidgetItem(group, QStringList{key, ta, tb, ratio});
    for (int c = 1; c <= 3; ++c) item->setTextAlignment(c, Qt::AlignRight | Qt::AlignVCenter);
    if (ta != tb) {
      QFont bold = item->font(2);
      bold.setBold(true);
      item->setFont(2, bold);
      item->setFont(3, bold);
    }
  }
  group->setExpanded(true);
}

QString run_label(char letter, const RunRecord& r) {
  return QStringLiteral("%1: %2 #%3")
      .arg(QChar(letter))
      .arg(QString::fromStdString(r.kind))
      .arg(r.id);
}

}  // namespace

HistoryPage::HistoryPage(QWidget* parent) : Page(parent) {
  model_ = new RunTableModel(this);
  table_ = new QTableView;
  table_->setModel(model_);
  table_->setSelectionBehavior(QAbstractItemView::SelectRows);
  table_->setSelectionMode(QAbstractItemView::ExtendedSelection);
  table_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  table_->verticalHeader()->setVisible(false);
  table_->horizontalHeader()->setStretchLastSection(true);
  table_->setAlternatingRowColors(true);
  table_->setWordWrap(false);

  comparison_ = new QTreeWidget;
  comparison_->setColumnCount(4);
  comparison_->setRootIsDecorated(true);
  comparison_->setAlternatingRowColors(true);
  comparison_->setUniformRowHeights(true);

  kind_filter_ = new QComboBox;
  kind_filter_->addItem(QStringLiteral("All kinds"), QString());
  refresh_button_ = new QPushButton(QStringLiteral("Refresh"));
  delete_button_ = new QPushButton(QStringLiteral("Delete…"));
  status_label_ = new QLabel;
  error_label_ = new QLabel;
  error_label_->setWordWrap(true);
  error_label_->setStyleSheet(QStringLiteral("color: #b00020; font-weight: bold;"));
  error_label_->setVisible(false);

  auto* bar = new QHBoxLayout;
  bar->addWidget(new QLabel(QStringLiteral("Kind:")));
  bar->addWidget(kind_filter_);
  bar->addWidget(refresh_button_);
  bar->addWidget(delete_button_);
  bar->addWidget(status_label_, 1);

  auto* splitter = new QSplitter(Qt::Vertical);
  splitter->addWidget(table_);
  splitter->addWidget(comparison_);
  splitter->setStretchFactor(0, 1);
  splitter->setStretchFactor(1, 1);

  auto* layout = new QVBoxLayout(this);
  layout->addLayout(bar);
  layout->addWidget(error_label_);
  layout->addWidget(splitter, 1);

  connect(kind_filter_, &QComboBox::currentIndexChanged, this, [this] { refresh(); });
  connect(refresh_button_, &QPushButton::clicked, this, &HistoryPage::refresh);
  connect(delete_button_, &QPushButton::clicked, this, &HistoryPage::confirm_delete);
  connect(table_->selectionModel(), &QItemSelectionModel::selectionChanged, this, [this] {
    update_comparison();
    update_buttons();
  });
  update_comparison();
  update_buttons();
}

void HistoryPage::attach(EngineBridge*) {
  // The history is read from the database, not from the running engine.
}

void HistoryPage::showEvent(QShowEvent* event) {
  Page::showEvent(event);
  refresh();
}

std::vector<RunRecord> HistoryPage::read_runs() {
  error_.clear();
  try {
    const auto db = Database::open_default();
    std::vector<RunRecord> runs = RunStore(*db).list({}, kMaxRuns);
    Registry registry(*db);
    std::vector<RunRecord> evaluations = evaluation_runs(registry);
    runs.insert(runs.end(), std::make_move_iterator(evaluations.begin()),
                std::make_move_iterator(evaluations.end()));
    std::stable_sort(runs.begin(), runs.end(), [](const RunRecord& a, const RunRecord& b) {
      return a.created_at_ms > b.created_at_ms;
    });
    return runs;
  } catch (const std::exception& e) {
    error_ = QString::fromUtf8(e.what());
    return {};
  }
}

void HistoryPage::refresh() {
  std::set<std::pair<std::string, int64_t>> selected;
  for (const RunRecord* r : selected_runs()) selected.insert({r->kind, r->id});

  std::vector<RunRecord> runs = read_runs();
  error_label_->setText(QStringLiteral("The run history could not be read: %1").arg(error_));
  error_label_->setVisible(!error_.isEmpty());
  update_kinds(runs);
  const std::string kind = kind_filter_->currentData().toString().toStdString();
  if (!kind.empty()) std::erase_if(runs, [&kind](const RunRecord& r) { return r.kind != kind; });
  model_->set_runs(std::move(runs));

  QItemSelection keep;
  for (int row = 0; row < model_->rowCount(); ++row) {
    const RunRecord& r = model_->run(row);
    if (selected.count({r.kind, r.id}))
      keep.select(model_->index(row, 0), model_->index(row, RunTableModel::kColumnCount - 1));
  }
  table_->selectionModel()->select(keep, QItemSelectionModel::ClearAndSelect);
  table_->resizeColumnsToContents();
  status_label_->setText(QStringLiteral("%1 run(s)").arg(model_->rowCount()));
  update_comparison();
  update_buttons();
}

void HistoryPage::update_kinds(const std::vector<RunRecord>& runs) {
  QStringList kinds = kKnownKinds;
  for (const RunRecord& r : runs)
    if (!kinds.contains(QString::fromStdString(r.kind))) kinds << QString::fromStdString(r.kind);
  const QString current = kind_filter_->currentData().toString();
  if (!current.isEmpty() && !kinds.contains(current)) kinds << current;  // kept while empty
  const QSignalBlocker block(kind_filter_);
  while (kind_filter_->count() > 1) kind_filter_->removeItem(1);
  for (const QString& k : kinds) kind_filter_->addItem(k, k);
  kind_filter_->setCurrentIndex(std::max(0, kind_filter_->findData(current)));
}

void HistoryPage::set_kind_filter(const QString& kind) {
  const int index = kind.isEmpty() ? 0 : kind_filter_->findData(kind);
  if (index < 0) {
    kind_filter_->addItem(kind, kind);
    kind_filter_->setCurrentIndex(kind_filter_->count() - 1);
  } else if (index == kind_filter_->currentIndex()) {
    refresh();
  } else {
    kind_filter_->setCurrentIndex(index);  // refreshes
  }
}

void HistoryPage::select_rows(const QList<int>& rows) {
  QItemSelection selection;
  for (int row : rows)
    if (row >= 0 && row < model_->rowCount())
      selection.select(model_->index(row, 0), model_->index(row, RunTableModel::kColumnCount - 1));
  table_->selectionModel()->select(selection, QItemSelectionModel::ClearAndSelect);
}

std::vector<const RunRecord*> HistoryPage::selected_runs() const {
  std::vector<const RunRecord*> out;
  for (const QModelIndex& index : table_->selectionModel()->selectedRows())
    out.push_back(&model_->run(index.row()));
  return out;
}

void HistoryPage::update_comparison() {
  comparison_->clear();
  std::vector<const RunRecord*> runs = selected_runs();
  if (runs.size() != 2) {
    comparison_->setHeaderLabels({"Key", "Run A", "Run B", "B/A"});
    auto* hint = new QTreeWidgetItem(
        comparison_, QStringList{QStringLiteral("Select two runs to compare them side by side.")});
    hint->setFirstColumnSpanned(true);
    return;
  }
  std::sort(runs.begin(), runs.end(), [](const RunRecord* x, const RunRecord* y) {
    return std::pair(x->created_at_ms, x->id) < std::pair(y->created_at_ms, y->id);
  });
  const RunRecord& a = *runs[0];
  const RunRecord& b = *runs[1];
  comparison_->setHeaderLabels({"Key", run_label('A', a), run_label('B', b), "B/A"});
  const auto describe = [](const RunRecord& r) {
    return nlohmann::ordered_json{{"title", r.title},
                                  {"kind", r.kind},
                                  {"model", r.model},
                                  {"time", QDateTime::fromMSecsSinceEpoch(r.created_at_ms)
                                               .toString(QStringLiteral("yyyy-MM-dd hh:mm:ss"))
                                               .toStdString()}}
        .dump();
  };
  add_group(comparison_, QStringLiteral("run"), describe(a), describe(b));
  add_group(comparison_, QStringLiteral("summary"), a.summary_json, b.summary_json);
  add_group(comparison_, QStringLiteral("config"), a.config_json, b.config_json);
  comparison_->resizeColumnToContents(0);
  comparison_->resizeColumnToContents(1);
  comparison_->resizeColumnToContents(2);
}

void HistoryPage::update_buttons() {
  bool deletable = false;
  for (const RunRecord* r : selected_runs()) deletable |= r->kind != kHeadsEvalKind;
  delete_button_->setEnabled(deletable);
}

int HistoryPage::delete_selected() {
  std::vector<int64_t> ids;
  for (const RunRecord* r : selected_runs())
    if (r->kind != kHeadsEvalKind) ids.push_back(r->id);
  if (ids.empty()) return 0;
  int removed = 0;
  try {
    const auto db = Database::open_default();
    RunStore store(*db);
    for (int64_t id : ids) {
      store.remove(id);
      ++removed;
    }
  } catch (const std::exception& e) {
    QMessageBox::warning(this, QStringLiteral("History"),
                         QStringLiteral("A run could not be deleted: %1").arg(e.what()));
  }
  refresh();
  return removed;
}

void HistoryPage::confirm_delete() {
  int count = 0, evaluations = 0;
  for (const RunRecord* r : selected_runs()) (r->kind == kHeadsEvalKind ? evaluations : count)++;
  if (count == 0) return;
  QString text = QStringLiteral("Delete %1 recorded run(s)? This cannot be undone.").arg(count);
  if (evaluations > 0)
    text += QStringLiteral(
                "\n\n%1 selected head evaluation(s) stay: they are deleted with their "
                "head on the Draft heads page.")
                .arg(evaluations);
  if (QMessageBox::question(this, QStringLiteral("Delete runs"), text) == QMessageBox::Yes)
    delete_selected();
}

}  // namespace tokenfab::ui
