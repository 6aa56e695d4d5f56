#include "ui/views/heads_page.h"

#include <QCheckBox>
#include <QComboBox>
#include <QDateTime>
#include <QDialog>
#include <QDialogButtonBox>
#include <QFileDialog>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QInputDialog>
#include <QLineEdit>
#include <QMessageBox>
#include <QPointer>
#include <QSignalBlocker>
#include <QSpinBox>
#include <QVBoxLayout>
#include <QtCharts/QAbstractAxis>
#include <QtCharts/QChart>
#include <chrono>
#include <filesystem>
#include <map>
#include <set>

#include "core/common/error.h"
#include "core/serving/prompt_sets.h"
#include "core/speculative/draft_head.h"
#include "core/storage/database.h"
#include "core/storage/registry.h"
#include "core/training/generation_eval.h"
#include "ui/bridge/engine_bridge.h"
#include "ui/views/app_settings.h"
#include "ui/widgets/time_chart.h"

namespace tokenfab::ui {

namespace {

constexpr int kProgressIntervalMs = 50;  // coalescing of training progress to the GUI thread

QString duration_text(double s) {
  const auto t = static_cast<qint64>(s + 0.5);
  return t >= 3600 ? QString("%1h%2m").arg(t / 3600).arg(t / 60 % 60, 2, 10, QChar('0'))
                   : QString("%1m%2s").arg(t / 60).arg(t % 60, 2, 10, QChar('0'));
}

double summary_accept(const std::string& summary_json) {
  try {
    const auto j = nlohmann::json::parse(summary_json.empty() ? "{}" : summary_json);
    if (j.contains("simulated_accept_per_step"))
      return j["simulated_accept_per_step"].get<double>();
  } catch (const std::exception&) {
  }
  return 0.0;
}

// White at 1.0 (no gain) to green at `best`.
QColor heat(double value, double best) {
  const double t = best > 1.0 ? std::clamp((value - 1.0) / (best - 1.0), 0.0, 1.0) : 0.0;
  return QColor::fromHsvF(0.33f, static_cast<float>(0.1 + 0.6 * t), 0.95f);
}

QTableWidgetItem* cell(const QString& text) {
  auto* item = new QTableWidgetItem(text);
  item->setFlags(item->flags() & ~Qt::ItemIsEditable);
  return item;
}

// Adds OK and Cancel under the form's rows and runs the dialog; true when OK was pressed.
bool ask(QDialog& dialog, QFormLayout* form) {
  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel);
  form->addRow(buttons);
  QObject::connect(buttons, &QDialogButtonBox::accepted, &dialog, &QDialog::accept);
  QObject::connect(buttons, &QDialogButtonBox::rejected, &dialog, &QDialog::reject);
  return dialog.exec() == QDialog::Accepted;
}

// Train…: name, domain, data (a built-in domain or "all", files and folders, or both), sampled
// continuations, type, layer taps (mtp), steps, heads.
std::optional<HeadTrainingRequest> ask_training_request(QWidget* parent) {
  QDialog dialog(parent);
  dialog.setWindowTitle(QStringLiteral("Train a draft head"));
  auto* form = new QFormLayout(&dialog);
  auto* name = new QLineEdit;
  auto* domain = new QLineEdit(QStringLiteral("code"));
  auto* data = new QComboBox;
  for (const std::string& d : builtin_domains()) data->addItem(QString::fromStdString(d));
  data->addItem(QStringLiteral("all"));
  data->addItem(QStringLiteral("none (files only)"));
  const auto files_only = [data] { return data->currentIndex() == data->count() - 1; };
  QStringList paths;
  auto* paths_label = new QLabel(QStringLiteral("(none)"));
  auto* add_files = new QPushButton(QStringLiteral("Add files…"));
  auto* add_folder = new QPushButton(QStringLiteral("Add folder…"));
  QObject::connect(add_files, &QPushButton::clicked, &dialog, [&] {
    paths += QFileDialog::getOpenFileNames(&dialog, QStringLiteral("Training files"));
    paths_label->setText(paths.isEmpty() ? QStringLiteral("(none)") : paths.join('\n'));
  });
  QObject::connect(add_folder, &QPushButton::clicked, &dialog, [&] {
    const QString dir = QFileDialog::getExistingDirectory(&dialog, QStringLiteral("Folder"));
    if (!dir.isEmpty()) paths += dir;
    paths_label->setText(paths.isEmpty() ? QStringLiteral("(none)") : paths.join('\n'));
  });
  auto* samples = new QSpinBox;
  samples->setRange(0, 16);
  samples->setValue(0);
  samples->setToolTip(
      QStringLiteral("Besides the greedy continuation of each prompt, this many sampled ones: "
                     "the head also learns from contexts off the greedy path (more data, longer "
                     "tracing)."));
  QObject::connect(data, &QComboBox::currentIndexChanged, samples,
                   [samples, files_only] { samples->setEnabled(!files_only()); });
  auto* steps = new QSpinBox;
  steps->setRange(10, 100000);
  steps->setValue(HeadTrainingRequest{}.steps);
  auto* heads = new QSpinBox;
  heads->setRange(1, 16);
  heads->setValue(HeadTrainingRequest{}.heads);
  auto* picks = new QHBoxLayout;
  picks->addWidget(add_files);
  picks->addWidget(add_folder);
  form->addRow(QStringLiteral("Name"), name);
  form->addRow(QStringLiteral("Domain"), domain);
  form->addRow(QStringLiteral("Prompt set"), data);
  form->addRow(QStringLiteral("Sampled continuations"), samples);
  form->addRow(QStringLiteral("Files"), picks);
  form->addRow(QString(), paths_label);
  auto* type = new QComboBox;
  type->addItem(QStringLiteral("medusa — K parallel heads"), QStringLiteral("medusa"));
  type->addItem(QStringLiteral("mtp — one sequential block, K steps"), QStringLiteral("mtp"));
  type->setCurrentIndex(type->findData(QString::fromStdString(HeadTrainingRequest{}.type)));
  form->addRow(QStringLiteral("Type"), type);
  auto* taps = new QCheckBox(QStringLiteral("Also read the target's inner layers"));
  taps->setChecked(HeadTrainingRequest{}.taps);
  taps->setToolTip(
      QStringLiteral("mtp: the first draft step also reads the target's residual stream after "
                     "two inner layers (EAGLE-3 style features): more first drafts accepted, "
                     "three times the trace size on disk."));
  const auto mtp_only = [taps, type] {
    const bool mtp = type->currentData().toString() == QStringLiteral("mtp");
    taps->setEnabled(mtp);
    if (!mtp) taps->setChecked(false);
  };
  QObject::connect(type, &QComboBox::currentIndexChanged, taps, mtp_only);
  mtp_only();
  form->addRow(QStringLiteral("Layer taps"), taps);
  form->addRow(QStringLiteral("Steps"), steps);
  form->addRow(QStringLiteral("Heads"), heads);
  if (!ask(dialog, form)) return std::nullopt;
  HeadTrainingRequest r;
  r.name = name->text().trimmed().toStdString();
  r.domain = domain->text().trimmed().toStdString();
  for (const QString& p : paths) r.corpus.push_back(p.toStdString());
  if (!files_only()) {
    r.prompt_set = data->currentText().toStdString();
    r.samples = samples->value();
  }
  r.type = type->currentData().toString().toStdString();
  r.taps = taps->isChecked();
  r.steps = steps->value();
  r.heads = heads->value();
  return r;
}

// Evaluate…: the domain, the target's weights (the file's own, or re-quantized in memory for the
// quantization study), how many validation prompts and tokens per reply.
struct EvaluationChoice {
  QString domain, target_quant;
  int prompts = 8, max_tokens = 64;
};

std::optional<EvaluationChoice> ask_evaluation(QWidget* parent) {
  QDialog dialog(parent);
  dialog.setWindowTitle(QStringLiteral("Evaluate a draft head"));
  auto* form = new QFormLayout(&dialog);
  auto* domain = new QComboBox;
  for (const std::string& d : builtin_domains()) domain->addItem(QString::fromStdString(d));
  auto* target = new QComboBox;
  for (const std::string& q : target_quant_names())
    target->addItem(q == "native" ? QStringLiteral("native (the model file's own weights)")
                                  : QString::fromStdString(q),
                    QString::fromStdString(q));
  target->setToolTip(
      QStringLiteral("Re-quantize the target in memory before measuring: the study shows whether "
                     "a cheaper target gains more in speed than it loses to rejected drafts. The "
                     "model file's own speed without a head is measured in the same run."));
  auto* prompts = new QSpinBox;
  prompts->setRange(1, 1000);
  prompts->setValue(8);
  auto* tokens = new QSpinBox;
  tokens->setRange(8, 4096);
  tokens->setValue(64);
  form->addRow(QStringLiteral("Domain (validation prompts)"), domain);
  form->addRow(QStringLiteral("Target weights"), target);
  form->addRow(QStringLiteral("Prompts"), prompts);
  form->addRow(QStringLiteral("Tokens per reply"), tokens);
  if (!ask(dialog, form)) return std::nullopt;
  return EvaluationChoice{domain->currentText(), target->currentData().toString(), prompts->value(),
                          tokens->value()};
}

// Where a target quantization sorts in the study: the file's own first, then richest to cheapest.
int quant_rank(const std::string& q) {
  const auto& names = target_quant_names();
  return static_cast<int>(std::find(names.begin(), names.end(), q) - names.begin());
}

QString tok_s_text(double v) {
  return v > 0 ? QString::number(v, 'f', 1) : QStringLiteral("–");
}

}  // namespace

HeadsPage::HeadsPage(QWidget* parent) : Page(parent) {
  heads_table_ = new QTableWidget(0, 6, this);
  heads_table_->setHorizontalHeaderLabels(
      {"ID", "Name", "Domain", "Type", "Created", "Simulated ACCEPT/STEP"});
  heads_table_->setSelectionBehavior(QAbstractItemView::SelectRows);
  heads_table_->setSelectionMode(QAbstractItemView::SingleSelection);
  heads_table_->horizontalHeader()->setStretchLastSection(true);
  heads_table_->verticalHeader()->hide();
  matrix_ = new QTableWidget(0, 0, this);
  matrix_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  matrix_->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  matrix_->horizontalHeader()->setMinimumSectionSize(64);
  evaluations_table_ = new QTableWidget(0, 9, this);
  evaluations_table_->setHorizontalHeaderLabels({"Domain", "Spec", "Target", "ACCEPT/STEP",
                                                 "tok/s with head", "without", "model's own", "net",
                                                 "Devices"});
  evaluations_table_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  evaluations_table_->verticalHeader()->hide();
  evaluations_table_->verticalHeader()->setDefaultSectionSize(fontMetrics().height() + 8);
  evaluations_table_->horizontalHeaderItem(2)->setToolTip(
      QStringLiteral("The target's weights: the model file's own (native), or re-quantized in "
                     "memory before the evaluation"));
  evaluations_table_->horizontalHeaderItem(5)->setToolTip(
      QStringLiteral("tok/s of the same target without drafts"));
  evaluations_table_->horizontalHeaderItem(6)->setToolTip(
      QStringLiteral("tok/s of the model file's own weights without drafts, measured in the same "
                     "run"));
  evaluations_table_->horizontalHeaderItem(7)->setToolTip(
      QStringLiteral("tok/s with the head on this target over the model's own tok/s without "
                     "drafts: above 1, this target with this head is faster than the plain model"));
  evaluations_table_->horizontalHeaderItem(8)->setToolTip(
      QStringLiteral("The devices the evaluation generated on: its tok/s are theirs"));

  train_button_ = new QPushButton(QStringLiteral("Train…"));
  evaluate_button_ = new QPushButton(QStringLiteral("Evaluate…"));
  delete_button_ = new QPushButton(QStringLiteral("Delete"));
  export_button_ = new QPushButton(QStringLiteral("Export…"));
  refresh_button_ = new QPushButton(QStringLiteral("Refresh"));
  cancel_button_ = new QPushButton(QStringLiteral("Cancel"));
  default_head_ = new QComboBox;
  default_head_->setToolTip(
      QStringLiteral("The draft head new chat conversations start with; auto picks per message "
                     "the head with the best recorded ACCEPT/STEP on the message's domain"));
  auto* buttons = new QHBoxLayout;
  for (QPushButton* b :
       {train_button_, evaluate_button_, delete_button_, export_button_, refresh_button_})
    buttons->addWidget(b);
  buttons->addStretch();
  buttons->addWidget(new QLabel(QStringLiteral("Default for new chats")));
  buttons->addWidget(default_head_);

  progress_bar_ = new QProgressBar;
  progress_bar_->setRange(0, 1000);
  status_label_ = new QLabel;
  chart_ = new TimeChart(QStringLiteral("Training"), QStringLiteral("loss"));
  chart_->ensure_series(QStringLiteral("loss"), QStringLiteral("training loss"));
  chart_->ensure_series(QStringLiteral("val_loss"), QStringLiteral("validation loss"));
  chart_->ensure_series(QStringLiteral("accept"), QStringLiteral("simulated ACCEPT/STEP"));
  chart_->use_right_axis(QStringLiteral("accept"), QStringLiteral("ACCEPT/STEP"));
  chart_->setMinimumHeight(200);
  for (QAbstractAxis* axis : chart_->chart()->axes(Qt::Horizontal))
    axis->setTitleText(QStringLiteral("step"));
  auto* job_row = new QHBoxLayout;
  job_row->addWidget(progress_bar_, 1);
  job_row->addWidget(status_label_);
  job_row->addWidget(cancel_button_);

  auto* layout = new QVBoxLayout(this);
  layout->addLayout(buttons);
  layout->addWidget(new QLabel(QStringLiteral("Registered heads")));
  layout->addWidget(heads_table_, 2);
  auto* tables = new QHBoxLayout;
  auto* matrix_column = new QVBoxLayout;
  matrix_column->addWidget(new QLabel(QStringLiteral("Best recorded ACCEPT/STEP per domain")));
  matrix_column->addWidget(matrix_);
  auto* evaluations_column = new QVBoxLayout;
  evaluations_column->addWidget(new QLabel(
      QStringLiteral("Evaluations of the selected head, by target weights (quantization study)")));
  evaluations_column->addWidget(evaluations_table_);
  tables->addLayout(matrix_column, 1);
  tables->addLayout(evaluations_column, 1);
  layout->addLayout(tables, 2);
  layout->addLayout(job_row);
  layout->addWidget(chart_, 3);

  connect(train_button_, &QPushButton::clicked, this, &HeadsPage::open_train_dialog);
  connect(evaluate_button_, &QPushButton::clicked, this, &HeadsPage::open_evaluate_dialog);
  connect(delete_button_, &QPushButton::clicked, this, &HeadsPage::confirm_delete);
  connect(export_button_, &QPushButton::clicked, this, &HeadsPage::choose_export);
  connect(refresh_button_, &QPushButton::clicked, this, &HeadsPage::refresh);
  connect(default_head_, &QComboBox::currentIndexChanged, this, [this] {
    AppSettings().setValue(settings_keys::kDefaultHead, default_head_->currentData().toString());
  });
  connect(cancel_button_, &QPushButton::clicked, this, &HeadsPage::cancel_job);
  connect(heads_table_, &QTableWidget::itemSelectionChanged, this, [this] {
    update_buttons();
    show_evaluations();
    show_training_curve();
  });
  connect(this, &HeadsPage::trainingFinished, this, [this](bool ok, const QString& message) {
    if (!ok && interactive_ && !message.contains(QStringLiteral("cancelled")))
      QMessageBox::critical(this, QStringLiteral("Training failed"), message);
  });
  connect(this, &HeadsPage::evaluationFinished, this, [this](bool ok, const QString& message) {
    if (!ok && interactive_ && !message.contains(QStringLiteral("cancelled")))
      QMessageBox::critical(this, QStringLiteral("Evaluation failed"), message);
  });
  refresh();
  update_buttons();
}

HeadsPage::~HeadsPage() {
  cancel_.store(true);
  join_worker();
}

void HeadsPage::attach(EngineBridge* bridge) {
  bridge_ = bridge;
  connect(bridge_, &EngineBridge::loaded, this, &HeadsPage::update_buttons);
  connect(bridge_, &EngineBridge::failed, this, &HeadsPage::update_buttons);
  update_buttons();
}

void HeadsPage::update_buttons() {
  const bool ready = bridge_ && bridge_->ready() && !busy_;
  const bool selected = selected_head_id() > 0;
  train_button_->setEnabled(ready);
  evaluate_button_->setEnabled(ready && selected);
  delete_button_->setEnabled(!busy_ && selected);
  export_button_->setEnabled(selected);
  cancel_button_->setEnabled(busy_);
}

QString HeadsPage::default_head() const {
  return default_head_->currentData().toString();
}

bool HeadsPage::set_default_head(const QString& choice) {
  const int index = default_head_->findData(choice);
  if (index < 0) return false;
  default_head_->setCurrentIndex(index);  // saved by the currentIndexChanged connection
  AppSettings().setValue(settings_keys::kDefaultHead, choice);
  return true;
}

int64_t HeadsPage::selected_head_id() const {
  const auto rows = heads_table_->selectionModel()->selectedRows();
  if (rows.isEmpty()) return 0;
  return heads_table_->item(rows.first().row(), 0)->text().toLongLong();
}

void HeadsPage::refresh() {
  std::vector<HeadRecord> heads;
  std::map<int64_t, std::map<std::string, double>> best;  // head → domain → ACCEPT/STEP
  std::set<std::string> domains;
  for (const std::string& d : builtin_domains()) domains.insert(d);
  try {
    const auto db = Database::open_default();
    Registry registry(*db);
    heads = registry.heads();
    for (const HeadRecord& h : heads) {
      for (const EvaluationRecord& e : registry.evaluations(h.id)) {
        if (e.target_quant != "native") continue;
        double& b = best[h.id][e.domain];
        b = std::max(b, e.accept_per_step);
        domains.insert(e.domain);
      }
    }
  } catch (const std::exception& e) {
    status_label_->setText(QStringLiteral("registry: %1").arg(e.what()));
  }
  {
    const QSignalBlocker block(default_head_);
    default_head_->clear();
    default_head_->addItem(QStringLiteral("No draft head"), QStringLiteral("none"));
    default_head_->addItem(QStringLiteral("auto"), QStringLiteral("auto"));
    for (const HeadRecord& h : heads) {
      const QString name = QString::fromStdString(h.name);
      default_head_->addItem(name, name);
    }
    const int shown = default_head_->findData(
        AppSettings().value(settings_keys::kDefaultHead, QStringLiteral("none")).toString());
    default_head_->setCurrentIndex(std::max(shown, 0));
  }
  const int64_t selected = selected_head_id();
  // The selection is restored without signals; the evaluations table and the buttons follow it
  // at the end. With none (the first view, or the selected head deleted) the newest head is
  // selected, so its evaluations show.
  const QSignalBlocker block_selection(heads_table_);
  heads_table_->clearSelection();
  heads_table_->setRowCount(static_cast<int>(heads.size()));
  for (int row = 0; row < static_cast<int>(heads.size()); ++row) {
    const HeadRecord& h = heads[row];
    heads_table_->setItem(row, 0, cell(QString::number(h.id)));
    heads_table_->setItem(row, 1, cell(QString::fromStdString(h.name)));
    heads_table_->setItem(row, 2, cell(QString::fromStdString(h.domain)));
    heads_table_->setItem(row, 3, cell(QString::fromStdString(h.type)));
    heads_table_->setItem(row, 4,
                          cell(QDateTime::fromSecsSinceEpoch(h.created_unix)
                                   .toString(QStringLiteral("yyyy-MM-dd hh:mm"))));
    heads_table_->setItem(row, 5, cell(QString::number(summary_accept(h.summary_json), 'f', 2)));
    if (h.id == selected) heads_table_->selectRow(row);
  }
  if (selected_head_id() == 0 && !heads.empty()) heads_table_->selectRow(0);
  heads_table_->resizeColumnsToContents();
  heads_table_->horizontalHeader()->setStretchLastSection(true);
  double top = 1.0;
  for (const auto& [id, by_domain] : best)
    for (const auto& [d, v] : by_domain) top = std::max(top, v);
  matrix_->clear();
  matrix_->setRowCount(static_cast<int>(heads.size()));
  matrix_->setColumnCount(static_cast<int>(domains.size()));
  QStringList columns, rows;
  for (const std::string& d : domains) columns << QString::fromStdString(d);
  for (const HeadRecord& h : heads) rows << QString::fromStdString(h.name);
  matrix_->setHorizontalHeaderLabels(columns);
  matrix_->setVerticalHeaderLabels(rows);
  for (int row = 0; row < static_cast<int>(heads.size()); ++row) {
    int column = 0;
    for (const std::string& d : domains) {
      const auto by_domain = best.find(heads[row].id);
      if (by_domain != best.end() && by_domain->second.count(d)) {
        const double v = by_domain->second.at(d);
        auto* item = cell(QString::number(v, 'f', 2));
        item->setBackground(heat(v, top));
        item->setTextAlignment(Qt::AlignCenter);
        matrix_->setItem(row, column, item);
      } else {
        auto* item = cell(QStringLiteral("–"));
        item->setForeground(palette().color(QPalette::Disabled, QPalette::Text));
        item->setTextAlignment(Qt::AlignCenter);
        item->setToolTip(QStringLiteral("not evaluated on %1 yet: select the head and press "
                                        "Evaluate…")
                             .arg(QString::fromStdString(d)));
        matrix_->setItem(row, column, item);
      }
      ++column;
    }
  }
  update_buttons();
  show_evaluations();
  show_training_curve();
}

void HeadsPage::show_training_curve() {
  if (training_) return;  // the live curve stays
  loss_points_.clear();
  val_points_.clear();
  accept_points_.clear();
  chart_->clear_points();
  const auto rows = heads_table_->selectionModel()->selectedRows();
  if (rows.isEmpty()) {
    chart_->chart()->setTitle(QStringLiteral("Training"));
    return;
  }
  const QString name = heads_table_->item(rows.first().row(), 1)->text();
  TrainingCurve curve;
  try {
    const auto db = Database::open_default();
    if (const auto record = Registry(*db).find_head(std::to_string(selected_head_id())))
      curve = TrainingCurve::from_summary(record->summary_json);
  } catch (const std::exception& e) {
    status_label_->setText(QStringLiteral("registry: %1").arg(e.what()));
  }
  if (curve.empty()) {
    chart_->chart()->setTitle(
        QStringLiteral("Training of %1: no curve recorded (trained before curves were kept)")
            .arg(name));
    return;
  }
  for (size_t i = 0; i < curve.size(); ++i) {
    // A training loss is the mean over the steps since the previous evaluation: drawn at the
    // middle of those steps (at step 0, the untrained head's loss, at 0).
    const double middle = i == 0 ? curve.step[0] : 0.5 * (curve.step[i - 1] + 1 + curve.step[i]);
    loss_points_.append(QPointF(middle, curve.train_loss[i]));
    val_points_.append(QPointF(curve.step[i], curve.val_loss[i]));
    accept_points_.append(QPointF(curve.step[i], curve.accept[i]));
  }
  chart_->set_points(QStringLiteral("loss"), loss_points_);
  chart_->set_points(QStringLiteral("val_loss"), val_points_);
  chart_->set_points(QStringLiteral("accept"), accept_points_);
  chart_->fit_axes(0, std::max(1, curve.step.back()));
  // The trainer keeps the weights of the first evaluation with the lowest validation loss.
  const auto kept = std::min_element(curve.val_loss.begin(), curve.val_loss.end());
  chart_->chart()->setTitle(
      QStringLiteral("Training of %1: %2 evaluations, the head kept is step "
                     "%3's (lowest validation loss); training loss: each "
                     "interval's mean")
          .arg(name)
          .arg(curve.size())
          .arg(curve.step[static_cast<size_t>(kept - curve.val_loss.begin())]));
}

QString HeadsPage::chart_title() const {
  return chart_->chart()->title();
}

void HeadsPage::show_evaluations() {
  std::vector<EvaluationRecord> evaluations;
  const int64_t id = selected_head_id();
  if (id > 0) {
    try {
      const auto db = Database::open_default();
      evaluations = Registry(*db).evaluations(id);  // newest first
    } catch (const std::exception& e) {
      status_label_->setText(QStringLiteral("registry: %1").arg(e.what()));
    }
  }
  // By domain, then the file's own weights before the re-quantized ones (richest first), then
  // newest first: each domain's quantization study reads top to bottom.
  std::stable_sort(evaluations.begin(), evaluations.end(), [](const auto& a, const auto& b) {
    if (a.domain != b.domain) return a.domain < b.domain;
    return quant_rank(a.target_quant) < quant_rank(b.target_quant);
  });
  evaluations_table_->setRowCount(static_cast<int>(evaluations.size()));
  for (int row = 0; row < static_cast<int>(evaluations.size()); ++row) {
    const EvaluationRecord& e = evaluations[static_cast<size_t>(row)];
    const double net = e.native_decode_tok_s > 0 ? e.decode_tok_s / e.native_decode_tok_s : 0.0;
    evaluations_table_->setItem(row, 0, cell(QString::fromStdString(e.domain)));
    evaluations_table_->setItem(row, 1, cell(QString::fromStdString(e.spec)));
    evaluations_table_->setItem(row, 2, cell(QString::fromStdString(e.target_quant)));
    evaluations_table_->setItem(row, 3, cell(QString::number(e.accept_per_step, 'f', 2)));
    evaluations_table_->setItem(row, 4, cell(tok_s_text(e.decode_tok_s)));
    evaluations_table_->setItem(row, 5, cell(tok_s_text(e.baseline_decode_tok_s)));
    evaluations_table_->setItem(row, 6, cell(tok_s_text(e.native_decode_tok_s)));
    auto* ratio = cell(net > 0 ? QStringLiteral("%1×").arg(net, 0, 'f', 2) : QStringLiteral("–"));
    if (net > 0)
      ratio->setBackground(net >= 1.0 ? QColor::fromHsvF(0.33f, 0.35f, 0.95f)
                                      : QColor::fromHsvF(0.0f, 0.3f, 0.97f));
    evaluations_table_->setItem(row, 7, ratio);
    evaluations_table_->setItem(
        row, 8, cell(e.devices.empty() ? QStringLiteral("–") : QString::fromStdString(e.devices)));
  }
  evaluations_table_->resizeColumnsToContents();
}

void HeadsPage::begin_job(const QString& label) {
  join_worker();
  cancel_.store(false);
  busy_ = true;
  last_fraction_ = 0.0;
  progress_bar_->setValue(0);
  status_label_->setText(label);
  update_buttons();
}

void HeadsPage::end_job() {
  join_worker();
  busy_ = false;
  refresh();
}

void HeadsPage::join_worker() {
  if (worker_.joinable()) worker_.join();
}

bool HeadsPage::start_training(const HeadTrainingRequest& request) {
  if (busy_ || !bridge_ || !bridge_->ready() || !bridge_->model() || !bridge_->tokenizer())
    return false;
  begin_job(QStringLiteral("starting…"));
  training_ = true;
  loss_points_.clear();
  val_points_.clear();
  accept_points_.clear();
  chart_->clear_points();
  chart_->chart()->setTitle(
      QStringLiteral("Training %1").arg(QString::fromStdString(request.name)));
  HeadTrainingRequest r = request;
  if (r.threads == 0) r.threads = bridge_->config().threads;
  // Owned jointly with the bridge: a reload while this runs (a chat that names another model)
  // frees the old model only when the training ends.
  std::shared_ptr<const LlamaModel> model = bridge_->shared_model();
  std::shared_ptr<const Tokenizer> tokenizer = bridge_->shared_tokenizer();
  worker_ = std::thread([this, r, model = std::move(model), tokenizer = std::move(tokenizer)] {
    auto last_post = std::chrono::steady_clock::now() - std::chrono::seconds(1);
    auto progress = [&](const HeadTrainingProgress& p) {
      const auto now = std::chrono::steady_clock::now();
      const bool always = p.val_loss || !p.message.empty() || p.fraction >= 1.0 || p.step <= 1;
      if (always || now - last_post >= std::chrono::milliseconds(kProgressIntervalMs)) {
        last_post = now;
        QMetaObject::invokeMethod(
            this, [this, p] { on_training_progress(p); }, Qt::QueuedConnection);
      }
      return !cancel_.load();
    };
    bool ok = true;
    QString message;
    int64_t trained = 0;
    try {
      const HeadTrainingResult result = run_head_training(*model, *tokenizer, r, progress);
      trained = result.head_id;
      message = QStringLiteral("trained head %1 (%2), simulated ACCEPT/STEP %3")
                    .arg(result.head_id)
                    .arg(QString::fromStdString(r.name))
                    .arg(result.report.value("simulated_accept_per_step", 0.0), 0, 'f', 2);
    } catch (const std::exception& e) {
      ok = false;
      message = QString::fromUtf8(e.what());
    }
    finish_job_later(ok, message, &HeadsPage::trainingFinished, trained);
  });
  return true;
}

void HeadsPage::on_training_progress(const HeadTrainingProgress& p) {
  last_fraction_ = p.fraction;
  progress_bar_->setValue(static_cast<int>(p.fraction * 1000.0 + 0.5));
  QString text = QString::fromStdString(p.phase);
  if (p.phase == "training") {
    text = QStringLiteral("step %1/%2  loss %3").arg(p.step).arg(p.steps).arg(p.loss, 0, 'f', 3);
    loss_points_.append(QPointF(p.step, p.loss));
    if (p.val_loss) val_points_.append(QPointF(p.step, *p.val_loss));
    if (p.sim_accept_per_step) accept_points_.append(QPointF(p.step, *p.sim_accept_per_step));
    chart_->set_points(QStringLiteral("loss"), loss_points_);
    chart_->set_points(QStringLiteral("val_loss"), val_points_);
    chart_->set_points(QStringLiteral("accept"), accept_points_);
    chart_->fit_axes(0, std::max(1, p.steps));
  } else if (p.phase == "tracing") {
    text = QStringLiteral("tracing %1/%2 tokens").arg(p.step).arg(p.steps);
  }
  if (p.fraction < 1.0) text += QStringLiteral("  ETA ") + duration_text(p.eta_s);
  status_label_->setText(text);
  emit trainingProgress(p.fraction, QString::fromStdString(p.phase));
}

int HeadsPage::chart_points(const QString& series) const {
  return chart_->points(series);
}

bool HeadsPage::start_evaluation(int64_t head_id, const QString& domain, int max_prompts,
                                 int max_tokens, const QString& target_quant) {
  if (busy_ || !bridge_ || !bridge_->ready() || !bridge_->model() || !bridge_->tokenizer())
    return false;
  begin_job(QStringLiteral("evaluating on %1…").arg(domain));
  // Owned jointly with the bridge, as for training.
  std::shared_ptr<const LlamaModel> model = bridge_->shared_model();
  std::shared_ptr<const Tokenizer> tokenizer = bridge_->shared_tokenizer();
  GenerationEvalRequest r;
  // An engine of its own with the bridge's configuration: the chat's traffic does not skew the
  // measurement, and reconfiguring the bridge's engine meanwhile cannot pull it away.
  r.config = bridge_->config();
  r.max_tokens = max_tokens;
  r.target_quant = target_quant.toStdString();
  const std::string d = domain.toStdString();
  worker_ = std::thread([this, r, model = std::move(model), tokenizer = std::move(tokenizer),
                         head_id, d, max_prompts]() mutable {
    bool ok = true;
    QString message;
    try {
      check_target_quant(r.target_quant);
      const auto db = Database::open_default();
      Registry registry(*db);
      const auto record = registry.find_head(std::to_string(head_id));
      if (!record) throw Error("no head " + std::to_string(head_id));
      DraftHead h = load_draft_head(registry.head_file(*record));
      check_head_matches(h.info, model_file_sha256(*model), model->hparams().n_embd,
                         model->hparams().n_vocab, model->file().name());
      r.draft_len = h.n_heads();
      r.head = std::make_shared<const DraftHead>(std::move(h));
      r.prompts = named_prompts(d, "validation");
      if (max_prompts > 0 && static_cast<int>(r.prompts.size()) > max_prompts)
        r.prompts.resize(max_prompts);
      auto last_post = std::chrono::steady_clock::now() - std::chrono::seconds(1);
      const GenerationEvalResult result =
          evaluate_by_generating(*model, *tokenizer, r, [&](const GenerationEvalProgress& p) {
            const auto now = std::chrono::steady_clock::now();
            if (p.done == p.total ||
                now - last_post >= std::chrono::milliseconds(kProgressIntervalMs)) {
              last_post = now;
              QMetaObject::invokeMethod(
                  this, [this, p] { on_evaluation_progress(p); }, Qt::QueuedConnection);
            }
            return !cancel_.load();
          });
      if (!result.lossless)
        throw Error("speculative output differed from the target's own; nothing was recorded");
      EvaluationRecord e = evaluation_record(r, result);
      e.head_id = head_id;
      e.domain = d;
      registry.add_evaluation(e);
      message = QStringLiteral("%1 on %2 (%3): ACCEPT/STEP %4")
                    .arg(QString::fromStdString(record->name), QString::fromStdString(d),
                         QString::fromStdString(r.target_quant))
                    .arg(e.accept_per_step, 0, 'f', 2);
    } catch (const std::exception& e) {
      ok = false;
      message = QString::fromUtf8(e.what());
    }
    finish_job_later(ok, message, &HeadsPage::evaluationFinished);
  });
  return true;
}

void HeadsPage::on_evaluation_progress(const GenerationEvalProgress& p) {
  last_fraction_ = p.total > 0 ? static_cast<double>(p.done) / static_cast<double>(p.total) : 0.0;
  progress_bar_->setValue(static_cast<int>(last_fraction_ * 1000.0 + 0.5));
  QString text = p.phase == "quantizing" ? QStringLiteral("re-quantizing the target…")
                                         : QStringLiteral("prompt %1/%2  ACCEPT/STEP %3")
                                               .arg(p.done)
                                               .arg(p.total)
                                               .arg(p.accept_per_step, 0, 'f', 2);
  if (p.done > 0 && p.done < p.total) text += QStringLiteral("  ETA ") + duration_text(p.eta_s);
  status_label_->setText(text);
  emit evaluationProgress(last_fraction_);
}

void HeadsPage::finish_job_later(bool ok, const QString& message,
                                 void (HeadsPage::*finished)(bool, const QString&),
                                 int64_t select_head) {
  QMetaObject::invokeMethod(
      this,
      [this, ok, message, finished, select_head] {
        training_ = false;
        end_job();  // refreshes: the selected head's recorded curve replaces the live one
        for (int row = 0; select_head > 0 && row < heads_table_->rowCount(); ++row)
          if (heads_table_->item(row, 0)->text().toLongLong() == select_head)
            heads_table_->selectRow(row);
        status_label_->setText(message);
        emit(this->*finished)(ok, message);
      },
      Qt::QueuedConnection);
}

bool HeadsPage::delete_head(int64_t head_id) {
  const auto db = Database::open_default();
  Registry registry(*db);
  const auto record = registry.find_head(std::to_string(head_id));
  if (!record || !registry.remove_head(head_id)) return false;
  std::error_code ec;
  std::filesystem::remove(record->file, ec);
  refresh();
  return true;
}

void HeadsPage::export_head(int64_t head_id, const QString& path) {
  const auto db = Database::open_default();
  Registry registry(*db);
  const auto record = registry.find_head(std::to_string(head_id));
  if (!record) throw Error("no head " + std::to_string(head_id));
  save_draft_head(load_draft_head(registry.head_file(*record)), path.toStdString());
}

void HeadsPage::open_train_dialog() {
  const auto request = ask_training_request(this);
  if (!request) return;
  interactive_ = true;
  start_training(*request);
}

void HeadsPage::open_evaluate_dialog() {
  const int64_t id = selected_head_id();
  if (id <= 0) return;
  const auto choice = ask_evaluation(this);
  if (!choice) return;
  interactive_ = true;
  start_evaluation(id, choice->domain, choice->prompts, choice->max_tokens, choice->target_quant);
}

void HeadsPage::confirm_delete() {
  const int64_t id = selected_head_id();
  if (id <= 0) return;
  if (QMessageBox::question(this, QStringLiteral("Delete head"),
                            QStringLiteral("Delete head %1 and its file?").arg(id)) !=
      QMessageBox::Yes)
    return;
  delete_head(id);
}

void HeadsPage::choose_export() {
  const int64_t id = selected_head_id();
  if (id <= 0) return;
  const QString path = QFileDialog::getSaveFileName(this, QStringLiteral("Export head"), QString(),
                                                    QStringLiteral("GGUF (*.gguf)"));
  if (path.isEmpty()) return;
  try {
    export_head(id, path);
  } catch (const std::exception& e) {
    QMessageBox::critical(this, QStringLiteral("Export failed"), QString::fromUtf8(e.what()));
  }
}

}  // namespace tokenfab::ui
