// The Draft heads page (ui/views/heads_page.h) on the offscreen platform with the real default
// model: training a tiny head from the page reaches 100 % and the head appears in the table (and in
// the registry, with its file); a training cancelled from its progress report leaves no new row and
// no file in the heads folder; a reload of the model while a training or an evaluation runs (a
// chat that names another model does that) leaves the job its own model until it ends; an
// evaluation fills the heat map, and one on a re-quantized target (the quantization study) fills
// the selected head's evaluations table beside the model's own speed; the selected head's recorded
// training curve fills the chart. TOKENFAB_HOME points at a temporary directory before anything
// opens the database.

#include <QSignalSpy>
#include <QValueAxis>
#include <QtTest>
#include <filesystem>
#include <memory>

#include "core/model/model_files.h"
#include "core/storage/database.h"
#include "core/storage/registry.h"
#include "core/training/generation_eval.h"
#include "tests/common/default_model.h"
#include "ui/bridge/engine_bridge.h"
#include "ui/views/app_settings.h"
#include "ui/views/heads_page.h"
#include "ui/widgets/time_chart.h"

using namespace tokenfab;
using namespace tokenfab::ui;

namespace {

constexpr int kLoadTimeoutMs = 120'000;
constexpr int kTrainTimeoutMs = 480'000;

// A run small enough for a unit test: 6 prompts of the code domain, 16 tokens each, 20 steps.
HeadTrainingRequest tiny_request(const std::string& name) {
  HeadTrainingRequest r;
  r.name = name;
  r.domain = "code";
  r.prompt_set = "code";
  r.max_prompts = 6;
  r.continuation = 16;
  r.steps = 20;
  r.heads = 2;
  r.batch = 64;
  r.threads = 2;
  return r;
}

size_t files_in(const std::filesystem::path& dir) {
  if (!std::filesystem::exists(dir)) return 0;
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) n += e.is_regular_file();
  return n;
}

bool table_has(const QTableWidget* table, int column, const QString& text) {
  for (int row = 0; row < table->rowCount(); ++row)
    if (table->item(row, column) && table->item(row, column)->text() == text) return true;
  return false;
}

}  // namespace

class GuiHeadsTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void page_constructs();
  void chart_axes_fit_their_own_series();
  void training_reaches_100_percent_and_lists_the_head();
  void cancelled_training_leaves_no_head_and_no_file();
  void evaluation_fills_the_matrix_export_and_delete();
  void reloading_the_model_leaves_running_jobs_their_model();
  void closing_the_page_mid_training_leaves_nothing();
  void cleanupTestCase();

 private:
  QTemporaryDir home_;
  QString model_path_;
  std::unique_ptr<EngineBridge> bridge_;
};

void GuiHeadsTest::initTestCase() {
  TOKENFAB_DEFAULT_MODEL_WITH_HOME(model_path_, home_);
  bridge_ = std::make_unique<EngineBridge>();
  QSignalSpy loaded(bridge_.get(), &EngineBridge::loaded);
  QSignalSpy failed(bridge_.get(), &EngineBridge::failed);
  EngineConfig config;
  config.threads = 2;
  bridge_->load(model_path_, config);
  QTRY_VERIFY_WITH_TIMEOUT(loaded.count() + failed.count() > 0, kLoadTimeoutMs);
  QVERIFY2(failed.isEmpty(), qPrintable(failed.isEmpty() ? "" : failed.first().first().toString()));
  QVERIFY(bridge_->ready());
}

void GuiHeadsTest::page_constructs() {
  HeadsPage page;
  QCOMPARE(page.title(), QString("Draft heads"));
  QVERIFY(!page.start_training(tiny_request("unattached")));  // no bridge yet
  page.attach(bridge_.get());
  QCOMPARE(page.heads_table()->rowCount(), 0);
  QVERIFY(page.matrix()->columnCount() >= 5);  // the built-in domains
}

// The training chart draws ACCEPT/STEP (about 1–3) beside losses (up to about 12) on an axis of
// its own, each axis fitted to its own series: 10 % above the largest point, from 0.
void GuiHeadsTest::chart_axes_fit_their_own_series() {
  TimeChart chart("Training", "loss");
  chart.ensure_series("loss", "training loss");
  chart.ensure_series("accept", "simulated ACCEPT/STEP");
  chart.use_right_axis("accept", "ACCEPT/STEP");
  chart.use_right_axis("no-such-series", "ignored");
  chart.set_points("loss", {QPointF(0, 12.0), QPointF(50, 4.0)});
  chart.set_points("accept", {QPointF(0, 1.0), QPointF(50, 2.0)});
  chart.fit_axes(0, 50);
  QValueAxis *left = nullptr, *right = nullptr;
  for (QAbstractAxis* axis : chart.chart()->axes(Qt::Vertical)) {
    auto* value = qobject_cast<QValueAxis*>(axis);
    QVERIFY(value);
    (axis->alignment() == Qt::AlignRight ? right : left) = value;
  }
  QVERIFY(left && right);
  QCOMPARE(right->titleText(), QString("ACCEPT/STEP"));
  QCOMPARE(left->min(), 0.0);
  QVERIFY(std::abs(left->max() - 13.2) < 1e-9);
  QCOMPARE(right->min(), 0.0);
  QVERIFY(std::abs(right->max() - 2.2) < 1e-9);
  QCOMPARE(chart.points("accept"), 2);
}

void GuiHeadsTest::training_reaches_100_percent_and_lists_the_head() {
  HeadsPage page;
  page.attach(bridge_.get());
  QSignalSpy progress(&page, &HeadsPage::trainingProgress);
  QSignalSpy finished(&page, &HeadsPage::trainingFinished);
  QVERIFY(page.start_training(tiny_request("gui-code")));
  QVERIFY(page.busy());
  QTRY_VERIFY_WITH_TIMEOUT(!finished.isEmpty(), kTrainTimeoutMs);
  QVERIFY2(finished.first().at(0).toBool(), qPrintable(finished.first().at(1).toString()));
  QVERIFY(!progress.isEmpty());
  QCOMPARE(progress.last().at(0).toDouble(), 1.0);
  QCOMPARE(page.progress_fraction(), 1.0);
  QVERIFY(!page.busy());
  QVERIFY(table_has(page.heads_table(), 1, "gui-code"));

  const auto db = Database::open_default();
  Registry registry(*db);
  const auto record = registry.find_head("gui-code");
  QVERIFY(record.has_value());
  QVERIFY(std::filesystem::exists(registry.head_file(*record)));

  // The new head is selected and the chart shows its recorded curve: the 20 steps evaluated at
  // steps 0 and 20, each series one point per evaluation.
  const auto selected = page.heads_table()->selectionModel()->selectedRows();
  QCOMPARE(selected.size(), 1);
  QCOMPARE(page.heads_table()->item(selected.first().row(), 1)->text(), QString("gui-code"));
  const TrainingCurve curve = TrainingCurve::from_summary(record->summary_json);
  QCOMPARE(curve.step, (std::vector<int32_t>{0, 20}));
  for (const char* series : {"loss", "val_loss", "accept"}) QCOMPARE(page.chart_points(series), 2);
  QVERIFY2(page.chart_title().contains("gui-code"), qPrintable(page.chart_title()));
  const int kept = curve.val_loss[1] < curve.val_loss[0] ? 20 : 0;
  QVERIFY2(page.chart_title().contains(QString("the head kept is step %1's").arg(kept)),
           qPrintable(page.chart_title()));
  // A head trained before curves were kept (a summary without one) shows an empty chart that
  // says so; selecting the trained head again brings its curve back.
  HeadRecord old = *record;
  old.name = "gui-no-curve";
  old.summary_json = R"({"simulated_accept_per_step": 1.5})";
  const int64_t old_id = registry.add_head(old);
  page.refresh();
  for (int row = 0; row < page.heads_table()->rowCount(); ++row)
    if (page.heads_table()->item(row, 1)->text() == "gui-no-curve")
      page.heads_table()->selectRow(row);
  QCOMPARE(page.chart_points("loss"), 0);
  QCOMPARE(page.chart_points("accept"), 0);
  QVERIFY2(page.chart_title().contains("no curve recorded"), qPrintable(page.chart_title()));
  for (int row = 0; row < page.heads_table()->rowCount(); ++row)
    if (page.heads_table()->item(row, 1)->text() == "gui-code") page.heads_table()->selectRow(row);
  QCOMPARE(page.chart_points("val_loss"), 2);
  QVERIFY(registry.remove_head(old_id));  // the row only: the file is the trained head's
  page.refresh();

  // The new head can be made the default for new chats (kept in the settings file).
  QVERIFY(page.set_default_head("gui-code"));
  QCOMPARE(AppSettings().value(settings_keys::kDefaultHead).toString(), QString("gui-code"));
  QVERIFY(!page.set_default_head("no-such-head"));
  QVERIFY(page.set_default_head("auto"));
  page.refresh();
  QCOMPARE(page.default_head(), QString("auto"));
  AppSettings().remove(settings_keys::kDefaultHead);
}

void GuiHeadsTest::cancelled_training_leaves_no_head_and_no_file() {
  HeadsPage page;
  page.attach(bridge_.get());
  const std::filesystem::path heads_dir = user_data_dir() / "heads";
  const size_t files_before = files_in(heads_dir);
  const int rows_before = page.heads_table()->rowCount();
  QSignalSpy finished(&page, &HeadsPage::trainingFinished);
  // Cancel as soon as training (past the cached traces) reports a step.
  connect(&page, &HeadsPage::trainingProgress, &page, [&page](double, const QString& phase) {
    if (phase == "training") page.cancel_job();
  });
  HeadTrainingRequest r = tiny_request("gui-cancelled");
  r.steps = 2000;
  QVERIFY(page.start_training(r));
  QTRY_VERIFY_WITH_TIMEOUT(!finished.isEmpty(), kTrainTimeoutMs);
  QVERIFY(!finished.first().at(0).toBool());
  QVERIFY2(finished.first().at(1).toString().contains("cancelled"),
           qPrintable(finished.first().at(1).toString()));
  QCOMPARE(page.heads_table()->rowCount(), rows_before);
  QVERIFY(!table_has(page.heads_table(), 1, "gui-cancelled"));
  QCOMPARE(files_in(heads_dir), files_before);
  const auto db = Database::open_default();
  Registry registry(*db);
  QVERIFY(!registry.find_head("gui-cancelled").has_value());
}

void GuiHeadsTest::evaluation_fills_the_matrix_export_and_delete() {
  HeadsPage page;
  page.attach(bridge_.get());
  std::optional<HeadRecord> record;
  {
    const auto db = Database::open_default();
    record = Registry(*db).find_head("gui-code");
  }
  QVERIFY(record.has_value());
  // Not evaluated yet: every domain's cell of the head says so.
  QCOMPARE(page.matrix()->rowCount(), 1);
  for (int c = 0; c < page.matrix()->columnCount(); ++c)
    QCOMPARE(page.matrix()->item(0, c)->text(), QString::fromUtf8("–"));
  QSignalSpy finished(&page, &HeadsPage::evaluationFinished);
  QVERIFY(page.start_evaluation(record->id, "code", 2, 16));
  QTRY_VERIFY_WITH_TIMEOUT(!finished.isEmpty(), kTrainTimeoutMs);
  QVERIFY2(finished.first().at(0).toBool(), qPrintable(finished.first().at(1).toString()));
  // The recorded evaluation is the heat map's cell (head's row, "code" column).
  const auto db = Database::open_default();
  Registry registry(*db);
  const auto evaluations = registry.evaluations(record->id);
  QCOMPARE(evaluations.size(), size_t{1});
  QVERIFY(evaluations.front().accept_per_step >= 1.0);
  int row = -1, column = -1;
  for (int r = 0; r < page.matrix()->rowCount(); ++r)
    if (page.matrix()->verticalHeaderItem(r)->text() == "gui-code") row = r;
  for (int c = 0; c < page.matrix()->columnCount(); ++c)
    if (page.matrix()->horizontalHeaderItem(c)->text() == "code") column = c;
  QVERIFY(row >= 0 && column >= 0);
  QVERIFY(page.matrix()->item(row, column));
  QCOMPARE(page.matrix()->item(row, column)->text(),
           QString::number(evaluations.front().accept_per_step, 'f', 2));
  // On the model's own weights the model's own speed is the baseline, measured in the same run.
  QCOMPARE(evaluations.front().target_quant, std::string("native"));
  QCOMPARE(evaluations.front().native_decode_tok_s, evaluations.front().baseline_decode_tok_s);

  // The quantization study: the target re-quantized to Q8_0 in memory, its evaluation recorded
  // with the model's own speed beside it; it reports each prompt and shows in the selected head's
  // evaluations table, while the heat map keeps the model's own weights' figure.
  QSignalSpy progress(&page, &HeadsPage::evaluationProgress);
  QVERIFY(page.start_evaluation(record->id, "code", 2, 16, "q8_0"));
  QTRY_VERIFY_WITH_TIMEOUT(finished.size() == 2, kTrainTimeoutMs);
  QVERIFY2(finished.last().at(0).toBool(), qPrintable(finished.last().at(1).toString()));
  QVERIFY(!progress.isEmpty());
  QCOMPARE(progress.last().at(0).toDouble(), 1.0);
  const auto studied = registry.evaluations(record->id);
  QCOMPARE(studied.size(), size_t{2});
  QCOMPARE(studied.front().target_quant, std::string("q8_0"));  // newest first
  QVERIFY(studied.front().native_decode_tok_s > 0);
  QVERIFY(studied.front().baseline_decode_tok_s > 0);
  QCOMPARE(page.matrix()->item(row, column)->text(),
           QString::number(evaluations.front().accept_per_step, 'f', 2));
  // With no head picked, the newest (here the only) head is selected and its evaluations show.
  QTableWidget* table = page.evaluations_table();
  QCOMPARE(page.heads_table()->rowCount(), 1);
  QCOMPARE(table->rowCount(), 2);
  page.heads_table()->clearSelection();
  QCOMPARE(table->rowCount(), 0);
  page.heads_table()->selectRow(0);
  QCOMPARE(table->rowCount(), 2);
  QCOMPARE(table->item(0, 2)->text(), QString("native"));  // the model's own weights first
  QCOMPARE(table->item(1, 2)->text(), QString("q8_0"));
  QCOMPARE(table->item(1, 3)->text(), QString::number(studied.front().accept_per_step, 'f', 2));
  QVERIFY(table->item(1, 7)->text().endsWith(QString::fromUtf8("×")));
  QCOMPARE(studied.front().devices, std::string("cpu:0"));  // the app's engine, as configured
  QCOMPARE(table->item(1, 8)->text(), QString("cpu:0"));
  // An unknown target quantization is refused with the accepted names.
  QVERIFY(page.start_evaluation(record->id, "code", 1, 16, "q3_k"));
  QTRY_VERIFY_WITH_TIMEOUT(finished.size() == 3, kTrainTimeoutMs);
  QVERIFY(!finished.last().at(0).toBool());
  QVERIFY2(finished.last().at(1).toString().contains(
               QString::fromStdString("expected " + target_quant_names_text())),
           qPrintable(finished.last().at(1).toString()));
  QCOMPARE(registry.evaluations(record->id).size(), size_t{2});

  const QString exported = home_.filePath("exported.gguf");
  page.export_head(record->id, exported);
  QVERIFY(std::filesystem::exists(exported.toStdString()));
  QVERIFY(page.delete_head(record->id));
  QVERIFY(!registry.find_head("gui-code").has_value());
  QVERIFY(!std::filesystem::exists(record->file));
  QVERIFY(!table_has(page.heads_table(), 1, "gui-code"));
}

// The bridge's load() drops its model while a training or an evaluation may be running on another
// thread. Each job holds the model it started with: after the reload that model is still alive
// while the job reports progress, and it is freed once the job has ended.
void GuiHeadsTest::reloading_the_model_leaves_running_jobs_their_model() {
  HeadsPage page;
  page.attach(bridge_.get());
  QSignalSpy loaded(bridge_.get(), &EngineBridge::loaded);
  QSignalSpy failed(bridge_.get(), &EngineBridge::failed);
  EngineConfig config;
  config.threads = 2;
  // Loads the same file again (a new model object); true once it is in.
  const auto reload = [&] {
    const qsizetype before = loaded.size();
    bridge_->load(model_path_, config);
    return QTest::qWaitFor([&] { return loaded.size() > before || !failed.isEmpty(); },
                           kLoadTimeoutMs) &&
           failed.isEmpty();
  };

  // A head to evaluate later (the same file reloaded has the same SHA-256, so it stays usable).
  QSignalSpy trained(&page, &HeadsPage::trainingFinished);
  QVERIFY(page.start_training(tiny_request("gui-reload")));
  QTRY_VERIFY_WITH_TIMEOUT(!trained.isEmpty(), kTrainTimeoutMs);
  QVERIFY2(trained.last().at(0).toBool(), qPrintable(trained.last().at(1).toString()));

  // Training: reloaded once it reports a training step.
  {
    std::weak_ptr<const LlamaModel> first = bridge_->shared_model();
    QSignalSpy progress(&page, &HeadsPage::trainingProgress);
    HeadTrainingRequest r = tiny_request("gui-reload-training");
    r.steps = 100000;  // cancelled below: it must outlast the reload
    QVERIFY(page.start_training(r));
    QTRY_VERIFY_WITH_TIMEOUT(!progress.isEmpty() && progress.last().at(1).toString() == "training",
                             kTrainTimeoutMs);
    QVERIFY(reload());
    QVERIFY(bridge_->shared_model() != first.lock());
    QVERIFY2(page.busy(), "the training ended during the reload");
    QVERIFY2(!first.expired(), "the training's model was freed by the reload");
    const qsizetype reports = progress.size();
    QTRY_VERIFY_WITH_TIMEOUT(progress.size() > reports, kTrainTimeoutMs);  // it goes on
    page.cancel_job();
    QTRY_VERIFY_WITH_TIMEOUT(trained.size() == 2, kTrainTimeoutMs);
    QVERIFY(first.expired());  // the job ended and held the last handle
  }

  // Evaluation: reloaded once it reports a prompt done.
  std::optional<HeadRecord> record;
  {
    const auto db = Database::open_default();
    record = Registry(*db).find_head("gui-reload");
  }
  QVERIFY(record.has_value());
  {
    std::weak_ptr<const LlamaModel> first = bridge_->shared_model();
    QSignalSpy progress(&page, &HeadsPage::evaluationProgress);
    QSignalSpy evaluated(&page, &HeadsPage::evaluationFinished);
    QVERIFY(page.start_evaluation(record->id, "code", 0, 512));
    QTRY_VERIFY_WITH_TIMEOUT(!progress.isEmpty() || !evaluated.isEmpty(), kTrainTimeoutMs);
    QVERIFY2(evaluated.isEmpty(), "the evaluation ended before its first prompt was reported");
    QVERIFY(reload());
    QVERIFY2(page.busy(), "the evaluation ended during the reload");
    QVERIFY2(!first.expired(), "the evaluation's model was freed by the reload");
    page.cancel_job();
    QTRY_VERIFY_WITH_TIMEOUT(!evaluated.isEmpty(), kTrainTimeoutMs);
    QVERIFY(first.expired());
  }
  QVERIFY(page.delete_head(record->id));
}

void GuiHeadsTest::closing_the_page_mid_training_leaves_nothing() {
  const std::filesystem::path heads_dir = user_data_dir() / "heads";
  const size_t files_before = files_in(heads_dir);
  auto page = std::make_unique<HeadsPage>();
  page->attach(bridge_.get());
  QSignalSpy progress(page.get(), &HeadsPage::trainingProgress);
  HeadTrainingRequest r = tiny_request("gui-closed");
  r.steps = 2000;
  QVERIFY(page->start_training(r));
  QTRY_VERIFY_WITH_TIMEOUT(!progress.isEmpty() && progress.last().at(1).toString() == "training",
                           kTrainTimeoutMs);
  page.reset();  // cancels and joins the job
  QCOMPARE(files_in(heads_dir), files_before);
  const auto db = Database::open_default();
  QVERIFY(!Registry(*db).find_head("gui-closed").has_value());
}

void GuiHeadsTest::cleanupTestCase() {
  bridge_.reset();
}

QTEST_MAIN(GuiHeadsTest)
#include "test_gui_heads.moc"
