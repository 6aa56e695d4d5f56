// The Models page (ui/views/models_page.h) on the offscreen platform, over a library made here:
// HOME and TOKENFAB_HOME point at a temporary directory whose Tokenfab cache holds tiny synthetic
// models (qwen3, llama3: random weights, core/model/synthetic_model.h), a GPT-2 header (an
// architecture Tokenfab cannot run, written with GgufWriter) and a text file named .gguf. The
// page scans off the GUI thread; its table (which passes QAbstractItemModelTester) lists each
// model with its family, whether it runs (and why not), the memory it needs and the verdict; a
// larger context re-judges the rows and Load refuses what does not fit, with the numbers; Add
// folder / Remove folder change the rows; Open file and a drop list a file from anywhere; Load
// runs a synthetic model through a real EngineBridge and marks its row, and a cancelled load
// leaves the next one to finish. The Gemma download asks for the Gemma Terms of Use first, and
// fetches nothing when they are declined. Nothing is downloaded here.

#include <QAbstractItemModelTester>
#include <QApplication>
#include <QMessageBox>
#include <QMimeData>
#include <QPushButton>
#include <QSignalSpy>
#include <QTableView>
#include <QTemporaryDir>
#include <QTimer>
#include <QUrl>
#include <QtTest>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "app/gui/model_fetch.h"
#include "core/gguf/gguf_writer.h"
#include "core/model/model_folders.h"
#include "core/model/model_library.h"
#include "core/model/synthetic_model.h"
#include "ui/bridge/engine_bridge.h"
#include "ui/models/model_library_model.h"
#include "ui/views/models_page.h"

namespace fs = std::filesystem;
using namespace tokenfab;
using namespace tokenfab::ui;
using Col = ModelLibraryModel::Column;

namespace {

constexpr int kScanTimeoutMs = 60'000;
constexpr int kLoadTimeoutMs = 120'000;

// A GPT-2 header: an architecture Tokenfab does not run. 2 layers, 64 wide, 8 heads, context 1024;
// two F32 tensors of zeros.
void write_gpt2(const fs::path& path) {
  gguf::GgufWriter w;
  w.add("general.architecture", gguf::Value::string("gpt2"));
  w.add("general.name", gguf::Value::string("GPT-2 header"));
  w.add("gpt2.block_count", gguf::Value::u32(2));
  w.add("gpt2.embedding_length", gguf::Value::u32(64));
  w.add("gpt2.attention.head_count", gguf::Value::u32(8));
  w.add("gpt2.context_length", gguf::Value::u32(1024));
  const std::vector<float> zeros(64 * 32, 0.0f);
  const auto bytes = [&](size_t n) {
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(zeros.data()), n * 4);
  };
  w.add_tensor("token_embd.weight", gguf::TensorType::F32, {64, 32}, bytes(64 * 32));
  w.add_tensor("output_norm.weight", gguf::TensorType::F32, {64}, bytes(64));
  w.write(path);
}

void write_tiny(const fs::path& path, const std::string& family, uint64_t seed) {
  write_synthetic_llama(path, SyntheticShape::family_tiny(family), kernels::WeightType::Q8_0, seed);
}

QString q(const fs::path& p) {
  return QString::fromStdString(p.string());
}

}  // namespace

class GuiModelsTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void init();
  void cleanup();
  void scan_lists_families_runnability_and_verdicts();
  void context_rejudges_and_load_refuses_what_does_not_fit();
  void add_folder_adds_rows_and_remove_folder_drops_them();
  void open_file_and_drop_list_files_from_anywhere();
  void load_runs_a_synthetic_model_and_marks_its_row();
  void gemma_download_asks_for_the_terms_first();

 private:
  // page_ shown, its first scan waited for (QVERIFY inside).
  void open_page();
  bool wait_for_scan(int scans_before);
  QString cell(const fs::path& file, int column, int role = Qt::DisplayRole) const;
  int row(const fs::path& file) const { return page_->library_model()->row_of(q(file)); }

  QTemporaryDir home_;
  fs::path models_, extra_, elsewhere_;
  fs::path qwen3_, llama3_, gpt2_, notes_, gemma3_, phi3_, qwen2_;
  std::unique_ptr<EngineBridge> bridge_;
  std::unique_ptr<ModelsPage> page_;  // destroyed before bridge_
  std::unique_ptr<QSignalSpy> scans_;
};

void GuiModelsTest::initTestCase() {
  QVERIFY(home_.isValid());
  const fs::path home = home_.path().toStdString();
  qputenv("HOME", home_.path().toUtf8());
  qputenv("TOKENFAB_HOME", home_.path().toUtf8());
  qputenv("OLLAMA_MODELS", q(home / "no-ollama").toUtf8());
  qunsetenv("XDG_CACHE_HOME");
  qunsetenv("XDG_DATA_HOME");
  models_ = home / "models";  // models_dir() under TOKENFAB_HOME
  extra_ = home / "extra";
  elsewhere_ = home / "elsewhere";
  for (const fs::path& dir : {models_, extra_, elsewhere_}) fs::create_directories(dir);
  qwen3_ = models_ / "qwen3-tiny.gguf";
  llama3_ = models_ / "llama3-tiny.gguf";
  gpt2_ = models_ / "gpt2-header.gguf";
  notes_ = models_ / "notes.gguf";
  gemma3_ = extra_ / "gemma3-tiny.gguf";
  phi3_ = elsewhere_ / "phi3-tiny.gguf";
  qwen2_ = elsewhere_ / "qwen2-tiny.gguf";
  write_tiny(qwen3_, "qwen3", 1);
  write_tiny(llama3_, "llama3", 2);
  write_tiny(gemma3_, "gemma3", 3);
  write_tiny(phi3_, "phi3", 4);
  write_tiny(qwen2_, "qwen2", 5);
  write_gpt2(gpt2_);
  std::ofstream(notes_) << "not a model\n";
}

void GuiModelsTest::init() {
  bridge_ = std::make_unique<EngineBridge>();
  page_ = std::make_unique<ModelsPage>();
  page_->attach(bridge_.get());
  scans_ = std::make_unique<QSignalSpy>(page_.get(), &ModelsPage::scanFinished);
}

void GuiModelsTest::cleanup() {
  scans_.reset();
  page_.reset();
  bridge_.reset();
}

bool GuiModelsTest::wait_for_scan(int scans_before) {
  return QTest::qWaitFor([&] { return scans_->count() > scans_before && !page_->scanning(); },
                         kScanTimeoutMs);
}

void GuiModelsTest::open_page() {
  page_->resize(1200, 700);
  page_->show();  // the first showing scans
  QVERIFY(page_->scanning());
  QVERIFY(wait_for_scan(0));
  QVERIFY(page_->scanned());
}

QString GuiModelsTest::cell(const fs::path& file, int column, int role) const {
  const ModelLibraryModel* m = page_->library_model();
  return m->data(m->index(row(file), column), role).toString();
}

void GuiModelsTest::scan_lists_families_runnability_and_verdicts() {
  open_page();
  if (QTest::currentTestFailed()) return;
  ModelLibraryModel* m = page_->library_model();
  QAbstractItemModelTester tester(m, QAbstractItemModelTester::FailureReportingMode::QtTest);
  QVERIFY(row(qwen3_) >= 0);
  QVERIFY(row(llama3_) >= 0);
  QVERIFY(row(gpt2_) >= 0);
  QCOMPARE(row(notes_), -1);
  QCOMPARE(row(gemma3_), -1);  // not in a folder the library searches yet

  QCOMPARE(cell(qwen3_, Col::kName), QString("synthetic qwen3-tiny (random weights)"));
  QCOMPARE(cell(llama3_, Col::kName), QString("synthetic llama3-tiny (random weights)"));
  QCOMPARE(cell(gpt2_, Col::kName), QString("GPT-2 header"));
  QCOMPARE(cell(qwen3_, Col::kSource), QString("tokenfab"));
  QCOMPARE(cell(qwen3_, Col::kFamily), QString("qwen3"));
  QCOMPARE(cell(llama3_, Col::kFamily), QString("llama"));
  QCOMPARE(cell(gpt2_, Col::kFamily), QString("gpt2"));
  QCOMPARE(cell(qwen3_, Col::kContextLength), QString("4096"));

  // Runs: yes for the synthetic families, no for GPT-2 with the loader's reason as the tooltip.
  QCOMPARE(cell(qwen3_, Col::kRuns), QString("yes"));
  QCOMPARE(cell(llama3_, Col::kRuns), QString("yes"));
  QCOMPARE(cell(gpt2_, Col::kRuns), QString("no"));
  QVERIFY(!m->data(m->index(row(gpt2_), 0), ModelLibraryModel::kRunnableRole).toBool());
  QVERIFY2(cell(gpt2_, Col::kRuns, Qt::ToolTipRole).contains("unsupported architecture 'gpt2'"),
           qPrintable(cell(gpt2_, Col::kRuns, Qt::ToolTipRole)));
  QCOMPARE(cell(gpt2_, 0, ModelLibraryModel::kReasonRole),
           cell(gpt2_, Col::kRuns, Qt::ToolTipRole));

  // Needs and the verdict: the library's own arithmetic at min(4096, context) tokens, against the
  // places the table shows (this machine's RAM first, then any GPU); a tiny model fits.
  const std::vector<MemoryPlace>& places = m->places();
  QVERIFY(!places.empty());
  QVERIFY(places.front().is_host);
  QCOMPARE(m->columnCount(), Col::kFirstPlace + static_cast<int>(places.size()));
  for (const fs::path& file : {qwen3_, llama3_, gpt2_}) {
    const ModelInfo expected =
        describe_model({file, ModelSource::kTokenfab, "", {file}}, 0, places);
    const ModelInfo& shown = m->model(row(file));
    QCOMPARE(shown.memory.context, expected.memory.context);
    QCOMPARE(shown.memory.total_bytes(), expected.memory.total_bytes());
    QCOMPARE(cell(file, Col::kVerdict), QString::fromLatin1(verdict_text(expected.fit.verdict)));
    QVERIFY(cell(file, Col::kNeeds).endsWith(QString("@ %1").arg(expected.memory.context)));
  }
  QCOMPARE(cell(qwen3_, Col::kVerdict), QString("fits"));
  QCOMPARE(cell(qwen3_, Col::kFirstPlace).left(4), QString("fits"));
  QCOMPARE(m->data(m->index(row(qwen3_), Col::kVerdict), ModelLibraryModel::kVerdictRole).toInt(),
           static_cast<int>(FitVerdict::kFits));
  QVERIFY(m->data(m->index(row(qwen3_), Col::kVerdict), Qt::ForegroundRole).isValid());
  QVERIFY(cell(qwen3_, Col::kVerdict, Qt::ToolTipRole).startsWith("needs "));

  // The text file named .gguf is skipped, with its reason.
  bool notes_skipped = false;
  for (const QString& line : page_->skipped_lines())
    notes_skipped = notes_skipped || line.startsWith(q(notes_) + ": ");
  QVERIFY2(notes_skipped, qPrintable(page_->skipped_lines().join('\n')));

  // Sortable by number: parameters ascending through the view's proxy.
  page_->table()->sortByColumn(Col::kParameters, Qt::AscendingOrder);
  QAbstractItemModel* view = page_->table()->model();
  for (int r = 1; r < view->rowCount(); ++r)
    QVERIFY(view->index(r - 1, Col::kParameters).data(ModelLibraryModel::kSortRole).toULongLong() <=
            view->index(r, Col::kParameters).data(ModelLibraryModel::kSortRole).toULongLong());
}

void GuiModelsTest::context_rejudges_and_load_refuses_what_does_not_fit() {
  open_page();
  if (QTest::currentTestFailed()) return;
  ModelLibraryModel* m = page_->library_model();
  QAbstractItemModelTester tester(m, QAbstractItemModelTester::FailureReportingMode::QtTest);
  // 2^30 tokens of KV (qwen3-tiny: 4 layers · 2 KV heads · (96 + 96) · 2 bytes = 3 KiB per token,
  // 3 TiB in all): no memory of this machine holds it.
  page_->set_context(1 << 30);
  QCOMPARE(m->context(), int64_t{1} << 30);
  QCOMPARE(cell(qwen3_, Col::kVerdict), QString("does not fit"));
  QVERIFY(cell(qwen3_, Col::kNeeds).endsWith(QString("@ %1").arg(1 << 30)));
  QCOMPARE(m->model(row(qwen3_)).memory.kv_bytes_per_token, uint64_t{4 * 2 * (96 + 96) * 2});
  QSignalSpy started(bridge_.get(), &EngineBridge::loadStarted);
  QVERIFY(!page_->load_row(row(qwen3_)));
  QVERIFY2(page_->status_text().contains("does not fit") && page_->status_text().contains("needs"),
           qPrintable(page_->status_text()));
  QVERIFY(page_->status_text().contains("TiB"));  // the numbers
  QVERIFY(!page_->load_row(row(gpt2_)));
  QVERIFY2(page_->status_text().contains("cannot run"), qPrintable(page_->status_text()));
  QCOMPARE(started.count(), 0);
  QVERIFY(!bridge_->loading());
  // Back to each model's default context: it fits again.
  page_->set_context(0);
  QCOMPARE(cell(qwen3_, Col::kVerdict), QString("fits"));
  QVERIFY(cell(qwen3_, Col::kNeeds).endsWith("@ 4096"));
}

void GuiModelsTest::add_folder_adds_rows_and_remove_folder_drops_them() {
  open_page();
  if (QTest::currentTestFailed()) return;
  const int before = page_->library_model()->rowCount();
  int scans = scans_->count();
  QVERIFY(page_->add_folder(q(extra_)));
  QVERIFY(wait_for_scan(scans));
  QCOMPARE(page_->library_model()->rowCount(), before + 1);
  QVERIFY(row(gemma3_) >= 0);
  QCOMPARE(cell(gemma3_, Col::kSource), QString("folder"));
  QCOMPARE(cell(gemma3_, Col::kFamily), QString("gemma3"));
  QCOMPARE(cell(gemma3_, Col::kRuns), QString("yes"));
  QVERIFY(user_model_folders() == std::vector<fs::path>{extra_});  // persisted
  QVERIFY(page_->folders() == std::vector<fs::path>{extra_});
  QVERIFY(!page_->add_folder(q(extra_)));  // listed once
  QVERIFY(!page_->add_folder(q(extra_ / "missing")));
  QVERIFY(page_->status_text().contains("missing"));

  scans = scans_->count();
  QVERIFY(page_->remove_folder(q(extra_)));
  QVERIFY(wait_for_scan(scans));
  QCOMPARE(row(gemma3_), -1);
  QCOMPARE(page_->library_model()->rowCount(), before);
  QVERIFY(user_model_folders().empty());
}

void GuiModelsTest::open_file_and_drop_list_files_from_anywhere() {
  open_page();
  if (QTest::currentTestFailed()) return;
  const int before = page_->library_model()->rowCount();
  QVERIFY(page_->open_file(q(phi3_)));
  QCOMPARE(page_->library_model()->rowCount(), before + 1);
  QCOMPARE(cell(phi3_, Col::kSource), QString("opened"));
  QCOMPARE(cell(phi3_, Col::kFamily), QString("phi3"));
  QCOMPARE(page_->selected_row(), row(phi3_));
  QVERIFY(page_->status_text().contains("Load runs it"));
  QVERIFY(!page_->open_file(q(notes_)));
  QVERIFY(page_->status_text().startsWith("Not opened"));

  // A .gguf file dropped on the page.
  QMimeData mime;
  mime.setUrls({QUrl::fromLocalFile(q(qwen2_))});
  QDragEnterEvent enter(QPoint(10, 10), Qt::CopyAction, &mime, Qt::LeftButton, Qt::NoModifier);
  QApplication::sendEvent(page_.get(), &enter);
  QVERIFY(enter.isAccepted());
  QDropEvent drop(QPointF(10, 10), Qt::CopyAction, &mime, Qt::LeftButton, Qt::NoModifier);
  QApplication::sendEvent(page_.get(), &drop);
  QVERIFY(row(qwen2_) >= 0);
  QCOMPARE(cell(qwen2_, Col::kFamily), QString("qwen2"));
  QCOMPARE(page_->selected_row(), row(qwen2_));

  // Opened files stay listed across a rescan (they are not in the folder list).
  const int scans = scans_->count();
  page_->rescan();
  QVERIFY(wait_for_scan(scans));
  QVERIFY(row(phi3_) >= 0);
  QVERIFY(row(qwen2_) >= 0);
  QCOMPARE(cell(phi3_, Col::kSource), QString("opened"));
  QVERIFY(user_model_folders().empty());
}

void GuiModelsTest::load_runs_a_synthetic_model_and_marks_its_row() {
  open_page();
  if (QTest::currentTestFailed()) return;
  const ModelLibraryModel* m = page_->library_model();
  QSignalSpy loaded(bridge_.get(), &EngineBridge::loaded);
  QSignalSpy failed(bridge_.get(), &EngineBridge::failed);
  QSignalSpy cancelled(bridge_.get(), &EngineBridge::loadCancelled);

  // A load cancelled from the page: the page says so, and the next load starts at once and wins.
  QVERIFY(page_->load_row(row(llama3_)));
  QVERIFY(bridge_->loading());
  QPushButton* cancel = nullptr;
  for (QPushButton* b : page_->findChildren<QPushButton*>())
    if (b->text() == "Cancel loading") cancel = b;
  QVERIFY(cancel);
  QVERIFY(cancel->isVisibleTo(page_.get()));
  cancel->click();
  QCOMPARE(cancelled.count(), 1);
  QVERIFY(page_->status_text().contains("cancelled"));
  QVERIFY(!cancel->isVisibleTo(page_.get()));

  page_->select_row(row(qwen3_));
  page_->load_selected();
  QVERIFY(bridge_->loading());
  QVERIFY(QTest::qWaitFor([&] { return loaded.count() + failed.count() > 0; }, kLoadTimeoutMs));
  QVERIFY2(failed.isEmpty(), failed.isEmpty() ? "" : qPrintable(failed.first().first().toString()));
  QCOMPARE(loaded.count(), 1);
  QCOMPARE(fs::weakly_canonical(bridge_->model()->file().name()), fs::weakly_canonical(qwen3_));
  QVERIFY(m->data(m->index(row(qwen3_), 0), ModelLibraryModel::kLoadedRole).toBool());
  QVERIFY(!m->data(m->index(row(llama3_), 0), ModelLibraryModel::kLoadedRole).toBool());
  QVERIFY(cell(qwen3_, Col::kName).startsWith(QString::fromUtf8("● ")));
  QVERIFY(page_->status_text().startsWith("Loaded qwen3-tiny.gguf"));
  // The cancelled load's result, when its reader ends, is dropped: qwen3 stays.
  QTest::qWait(1000);
  QCOMPARE(loaded.count(), 1);
  QCOMPARE(fs::weakly_canonical(bridge_->model()->file().name()), fs::weakly_canonical(qwen3_));

  // The loaded model stays marked across a rescan.
  const int scans = scans_->count();
  page_->rescan();
  QVERIFY(wait_for_scan(scans));
  QVERIFY(m->data(m->index(row(qwen3_), 0), ModelLibraryModel::kLoadedRole).toBool());
}

void GuiModelsTest::gemma_download_asks_for_the_terms_first() {
  // The page asks the application for the download by name.
  page_->set_downloads_enabled(true);
  QSignalSpy requested(page_.get(), &ModelsPage::downloadRequested);
  QPushButton* gemma = nullptr;
  for (QPushButton* b : page_->findChildren<QPushButton*>())
    if (b->text().contains("Gemma 3 270M")) gemma = b;
  QVERIFY(gemma);
  QVERIFY(gemma->isEnabled());  // this HOME holds no Gemma file
  gemma->click();
  QCOMPARE(requested.count(), 1);
  QCOMPARE(requested.first().first().toString(), QString("gemma3-270m"));
  QVERIFY(!gemma->isEnabled());  // until the application answers
  page_->download_finished(false,
                           "The Gemma Terms of Use were not accepted; nothing was downloaded.");
  QVERIFY(gemma->isEnabled());

  // The application's fetch: the terms, named with their link, must be accepted; Cancel fetches
  // nothing.
  QWidget window;
  app::ModelFetch fetch(&window);
  QSignalSpy finished(&fetch, &app::ModelFetch::finished);
  QString dialog_text;
  QStringList buttons;
  QTimer::singleShot(0, this, [&] {
    auto* box = qobject_cast<QMessageBox*>(QApplication::activeModalWidget());
    if (!box) return;
    dialog_text = box->text();
    for (QAbstractButton* b : box->buttons()) buttons << b->text().remove('&');
    box->button(QMessageBox::Cancel)->click();
  });
  fetch.request("gemma3-270m");
  QVERIFY(dialog_text.contains("Gemma Terms of Use"));
  QVERIFY(dialog_text.contains("https://ai.google.dev/gemma/terms"));
  QVERIFY2(buttons.contains("Accept") && buttons.contains("Cancel"), qPrintable(buttons.join(',')));
  QCOMPARE(finished.count(), 1);
  QCOMPARE(finished.first().at(0).toBool(), false);
  QVERIFY(finished.first().at(1).toString().contains("not accepted"));
  QVERIFY(!fetch.running());
  fetch.request("no-such-model");
  QCOMPARE(finished.count(), 2);
  QVERIFY(!fetch.running());
}

QTEST_MAIN(GuiModelsTest)
#include "test_gui_models.moc"
