#include "ui/views/models_page.h"

#include <QDragEnterEvent>
#include <QDropEvent>
#include <QFileDialog>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QInputDialog>
#include <QLabel>
#include <QListWidget>
#include <QMimeData>
#include <QProgressBar>
#include <QPushButton>
#include <QSortFilterProxyModel>
#include <QSpinBox>
#include <QTableView>
#include <QToolButton>
#include <QUrl>
#include <QVBoxLayout>
#include <algorithm>
#include <exception>

#include "core/model/model_files.h"
#include "ui/bridge/engine_bridge.h"
#include "ui/models/library_scan.h"
#include "ui/models/model_library_model.h"

namespace tokenfab::ui {

namespace fs = std::filesystem;

namespace {

constexpr int kMaxContext = 1 << 30;  // tokens; the spin box's limit

QString from_std(const std::string& s) {
  return QString::fromStdString(s);
}
QString from_path(const fs::path& p) {
  return QString::fromStdString(p.string());
}
fs::path to_path(const QString& s) {
  return fs::path(s.toStdString());
}

// The .gguf files among dropped URLs.
QStringList gguf_files(const QMimeData* mime) {
  QStringList files;
  if (!mime || !mime->hasUrls()) return files;
  for (const QUrl& url : mime->urls())
    if (url.isLocalFile() &&
        url.toLocalFile().endsWith(QStringLiteral(".gguf"), Qt::CaseInsensitive))
      files << url.toLocalFile();
  return files;
}

}  // namespace

ModelsPage::ModelsPage(QWidget* parent) : Page(parent) {
  setAcceptDrops(true);
  model_ = new ModelLibraryModel(this);
  proxy_ = new QSortFilterProxyModel(this);
  proxy_->setSourceModel(model_);
  proxy_->setSortRole(ModelLibraryModel::kSortRole);
  table_ = new QTableView;
  table_->setModel(proxy_);
  table_->setSelectionBehavior(QAbstractItemView::SelectRows);
  table_->setSelectionMode(QAbstractItemView::SingleSelection);
  table_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  table_->setAlternatingRowColors(true);
  table_->setWordWrap(false);
  table_->verticalHeader()->hide();
  table_->horizontalHeader()->setSortIndicator(-1, Qt::AscendingOrder);  // the library's order
  table_->setSortingEnabled(true);
  connect(table_->selectionModel(), &QItemSelectionModel::currentRowChanged, this,
          &ModelsPage::update_buttons);
  connect(table_, &QTableView::doubleClicked, this, &ModelsPage::load_selected);

  memory_label_ = new QLabel;
  memory_label_->setWordWrap(true);
  auto* layout = new QVBoxLayout(this);
  layout->addWidget(build_toolbar());
  layout->addWidget(table_, 1);
  layout->addWidget(memory_label_);
  layout->addWidget(build_skipped());
  layout->addWidget(build_load_bar());
  layout->addWidget(build_downloads());
  update_buttons();
}

ModelsPage::~ModelsPage() {
  join_scanner();
}

QWidget* ModelsPage::build_toolbar() {
  auto* bar = new QWidget;
  auto* row = new QHBoxLayout(bar);
  row->setContentsMargins(0, 0, 0, 0);
  rescan_button_ = new QPushButton(tr("Rescan"));
  auto* add_folder = new QPushButton(tr("Add folder…"));
  remove_folder_button_ = new QPushButton(tr("Remove folder…"));
  auto* open_file = new QPushButton(tr("Open file…"));
  open_file->setToolTip(tr("Describe a GGUF file anywhere (or drop one on this page)"));
  context_spin_ = new QSpinBox;
  context_spin_->setRange(0, kMaxContext);
  context_spin_->setSingleStep(1024);
  context_spin_->setSpecialValueText(tr("each model's (≤ %1)").arg(kDefaultLibraryContext));
  context_spin_->setSuffix(tr(" tokens"));
  context_spin_->setToolTip(tr("The context the KV cache is sized for in Needs and the verdict"));
  scan_busy_ = new QProgressBar;
  scan_busy_->setRange(0, 0);  // busy: a scan reports no fraction
  scan_busy_->setMaximumWidth(120);
  scan_label_ = new QLabel(tr("Scanning…"));
  row->addWidget(rescan_button_);
  row->addWidget(add_folder);
  row->addWidget(remove_folder_button_);
  row->addWidget(open_file);
  row->addSpacing(16);
  row->addWidget(new QLabel(tr("Context:")));
  row->addWidget(context_spin_);
  row->addStretch(1);
  row->addWidget(scan_label_);
  row->addWidget(scan_busy_);
  connect(rescan_button_, &QPushButton::clicked, this, &ModelsPage::rescan);
  connect(add_folder, &QPushButton::clicked, this, &ModelsPage::choose_folder_to_add);
  connect(remove_folder_button_, &QPushButton::clicked, this, &ModelsPage::choose_folder_to_remove);
  connect(open_file, &QPushButton::clicked, this, &ModelsPage::choose_file_to_open);
  connect(context_spin_, &QSpinBox::valueChanged, this, [this](int tokens) {
    model_->set_context(tokens);
    update_buttons();
  });
  return bar;
}

QWidget* ModelsPage::build_load_bar() {
  auto* bar = new QWidget;
  auto* row = new QHBoxLayout(bar);
  row->setContentsMargins(0, 0, 0, 0);
  load_button_ = new QPushButton(tr("Load"));
  cancel_button_ = new QPushButton(tr("Cancel loading"));
  load_busy_ = new QProgressBar;
  load_busy_->setRange(0, 0);  // busy: the load reports no fraction
  load_busy_->setMaximumWidth(160);
  status_label_ = new QLabel;
  status_label_->setWordWrap(true);
  status_label_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  row->addWidget(load_button_);
  row->addWidget(cancel_button_);
  row->addWidget(load_busy_);
  row->addWidget(status_label_, 1);
  connect(load_button_, &QPushButton::clicked, this, &ModelsPage::load_selected);
  connect(cancel_button_, &QPushButton::clicked, this, [this] {
    if (bridge_) bridge_->cancel_load();
  });
  return bar;
}

QWidget* ModelsPage::build_skipped() {
  auto* box = new QWidget;
  auto* column = new QVBoxLayout(box);
  column->setContentsMargins(0, 0, 0, 0);
  auto* row = new QHBoxLayout;
  skipped_label_ = new QLabel;
  skipped_toggle_ = new QToolButton;
  skipped_toggle_->setText(tr("Details"));
  skipped_toggle_->setCheckable(true);
  row->addWidget(skipped_label_);
  row->addWidget(skipped_toggle_);
  row->addStretch(1);
  skipped_list_ = new QListWidget;
  skipped_list_->setMaximumHeight(120);
  skipped_list_->hide();
  column->addLayout(row);
  column->addWidget(skipped_list_);
  connect(skipped_toggle_, &QToolButton::toggled, skipped_list_, &QWidget::setVisible);
  skipped_label_->hide();
  skipped_toggle_->hide();
  return box;
}

QWidget* ModelsPage::build_downloads() {
  downloads_ = new QWidget;
  auto* row = new QHBoxLayout(downloads_);
  row->setContentsMargins(0, 0, 0, 0);
  default_download_ = new QPushButton(tr("Download SmolLM2-135M-Instruct"));
  default_download_->setToolTip(tr("The default model (Apache-2.0), verified by SHA-256"));
  gemma_download_ = new QPushButton(tr("Download Gemma 3 270M…"));
  gemma_download_->setToolTip(
      tr("Gemma 3 270M Q4_K_M, under the Gemma Terms of Use (asked before the download)"));
  download_label_ = new QLabel;
  download_label_->setWordWrap(true);
  row->addWidget(default_download_);
  row->addWidget(gemma_download_);
  row->addWidget(download_label_, 1);
  connect(default_download_, &QPushButton::clicked, this,
          [this] { request_download(QString::fromLatin1(kDefaultModelName)); });
  connect(gemma_download_, &QPushButton::clicked, this,
          [this] { request_download(QString::fromLatin1(kGemmaModelName)); });
  downloads_->hide();  // until the application can fetch (set_downloads_enabled)
  return downloads_;
}

void ModelsPage::attach(EngineBridge* bridge) {
  bridge_ = bridge;
  connect(bridge, &EngineBridge::loadStarted, this, [this](const QString& path) {
    model_->set_loaded_path(QString());
    show_status(path.isEmpty() ? tr("Loading the default model…")
                               : tr("Loading %1…").arg(QFileInfo(path).fileName()));
    update_buttons();
  });
  connect(bridge, &EngineBridge::loaded, this, &ModelsPage::on_loaded);
  connect(bridge, &EngineBridge::failed, this, [this](const QString& message) {
    show_status(tr("No model loaded: %1").arg(message), true);
    update_buttons();
  });
  connect(bridge, &EngineBridge::loadCancelled, this, [this] {
    show_status(tr("Loading was cancelled: no model is loaded"));
    update_buttons();
  });
  if (bridge->ready()) on_loaded();
  update_buttons();
}

void ModelsPage::on_loaded() {
  mark_loaded();
  if (selected_row() < 0) select_row(model_->row_of(from_std(bridge_->model()->file().name())));
  table_->resizeColumnsToContents();  // its row is drawn bold now
  show_status(tr("Loaded %1").arg(QFileInfo(from_std(bridge_->model()->file().name())).fileName()));
  update_buttons();
}

void ModelsPage::mark_loaded() {
  if (!bridge_ || !bridge_->ready()) return;
  const QString file = from_std(bridge_->model()->file().name());
  // A model loaded from outside the library (--model PATH) is listed as opened, to be marked.
  if (model_->row_of(file) < 0 && scanned()) {
    try {
      list_opened(to_path(file));
    } catch (const std::exception&) {
      // Loaded, so readable; should its header fail now, the table simply does not mark it.
    }
  }
  model_->set_loaded_path(file);
}

int ModelsPage::list_opened(const fs::path& path) {
  const fs::path file = fs::absolute(path);
  ModelInfo info = describe_model(opened_model(file), 0, model_->places());
  if (std::none_of(opened_.begin(), opened_.end(),
                   [&](const fs::path& p) { return same_file(p, file); }))
    opened_.push_back(file);
  return model_->add_opened(std::move(info));
}

void ModelsPage::showEvent(QShowEvent* event) {
  Page::showEvent(event);
  if (!scanned() && !scanning_) rescan();
}

void ModelsPage::rescan() {
  if (scanning_) {
    scan_again_ = true;
    return;
  }
  join_scanner();  // the previous one has finished
  scanning_ = true;
  update_buttons();
  scanner_ = std::thread([this, opened = opened_] {
    auto result = std::make_shared<LibraryScan>(LibraryScan::run(opened));
    QMetaObject::invokeMethod(
        this, [this, result] { on_scanned(result); }, Qt::QueuedConnection);
  });
}

void ModelsPage::join_scanner() {
  if (scanner_.joinable()) scanner_.join();
}

void ModelsPage::on_scanned(const std::shared_ptr<LibraryScan>& result) {
  join_scanner();
  scanning_ = false;
  if (scan_again_) {  // asked during the scan: the folders or files may have changed
    scan_again_ = false;
    rescan();
    return;
  }
  const int selected = selected_row();
  const QString selected_path =
      selected >= 0
          ? model_->data(model_->index(selected, 0), ModelLibraryModel::kPathRole).toString()
          : QString();
  folders_ = result->folders;
  model_->set_models(std::move(result->library.models), opened_, result->places);
  ++scans_;
  mark_loaded();
  // The row selected before, else the loaded model's.
  const int loaded =
      bridge_ && bridge_->ready() ? model_->row_of(from_std(bridge_->model()->file().name())) : -1;
  select_row(selected_path.isEmpty() ? loaded : model_->row_of(selected_path));
  table_->resizeColumnsToContents();
  skipped_lines_.clear();
  skipped_list_->clear();
  for (const SkippedFile& s : result->library.skipped) {
    skipped_lines_ << QStringLiteral("%1: %2").arg(from_path(s.path), from_std(s.reason));
    skipped_list_->addItem(skipped_lines_.back());
  }
  skipped_label_->setText(
      tr("%n file(s) skipped", nullptr, static_cast<int>(skipped_lines_.size())));
  skipped_label_->setVisible(!skipped_lines_.isEmpty());
  skipped_toggle_->setVisible(!skipped_lines_.isEmpty());
  skipped_list_->setVisible(!skipped_lines_.isEmpty() && skipped_toggle_->isChecked());
  show_memory();
  if (!result->error.empty())
    show_status(tr("The library could not be read: %1").arg(from_std(result->error)), true);
  update_buttons();
  emit scanFinished();
}

void ModelsPage::show_memory() {
  QStringList places;
  for (const MemoryPlace& p : model_->places())
    places << tr("%1 %2 available of %3")
                  .arg(p.is_host ? tr("RAM") : from_std(p.name),
                       from_std(bytes_text(p.available_bytes)),
                       from_std(bytes_text(p.total_bytes)));
  memory_label_->setText(
      tr("%n model(s). This machine: %1. Needs is the weights + the KV cache (fp16) at the "
         "context; "
         "fits: a prefill/decode split fits, fits on one device only: one memory holds it.",
         nullptr, model_->rowCount())
          .arg(places.join(QStringLiteral(" · "))));
}

bool ModelsPage::add_folder(const QString& folder) {
  try {
    if (!add_model_folder(to_path(folder))) {
      show_status(tr("%1 is listed already").arg(folder));
      return false;
    }
  } catch (const std::exception& e) {
    show_status(tr("The folder was not added: %1").arg(from_std(e.what())), true);
    return false;
  }
  show_status(tr("Added %1").arg(folder));
  rescan();
  return true;
}

bool ModelsPage::remove_folder(const QString& folder) {
  try {
    if (!remove_model_folder(to_path(folder))) {
      show_status(tr("%1 is not one of your model folders").arg(folder), true);
      return false;
    }
  } catch (const std::exception& e) {
    show_status(tr("The folder was not removed: %1").arg(from_std(e.what())), true);
    return false;
  }
  show_status(tr("Removed %1").arg(folder));
  rescan();
  return true;
}

bool ModelsPage::open_file(const QString& path) {
  int row = -1;
  try {
    row = list_opened(to_path(path));
  } catch (const std::exception& e) {
    show_status(tr("Not opened: %1").arg(from_std(e.what())), true);
    return false;
  }
  select_row(row);
  const ModelInfo& m = model_->model(row);
  if (m.runnable)
    show_status(tr("Opened %1: Load runs it").arg(from_std(m.name)));
  else
    show_status(tr("Opened %1: Tokenfab cannot run it: %2")
                    .arg(from_std(m.name), from_std(m.not_runnable_because)),
                true);
  if (!scanned() && !scanning_) rescan();  // judged against this machine's memory once it is known
  update_buttons();
  return true;
}

bool ModelsPage::load_row(int row) {
  if (!bridge_ || row < 0 || row >= model_->rowCount()) return false;
  const ModelInfo& m = model_->model(row);
  const QString name = from_std(m.name);
  if (!m.runnable) {
    show_status(
        tr("Not loaded: Tokenfab cannot run %1: %2").arg(name, from_std(m.not_runnable_because)),
        true);
    return false;
  }
  if (m.fit.verdict == FitVerdict::kDoesNotFit) {
    show_status(tr("Not loaded: %1 does not fit in this machine's memory at %2 tokens: %3")
                    .arg(name)
                    .arg(m.memory.context)
                    .arg(from_std(m.fit.explanation)),
                true);
    return false;
  }
  bridge_->load(from_path(m.found.path), bridge_->config());
  return true;
}

void ModelsPage::load_selected() {
  load_row(selected_row());
}

void ModelsPage::select_row(int row) {
  if (row < 0 || row >= model_->rowCount()) return;
  const QModelIndex index = proxy_->mapFromSource(model_->index(row, 0));
  table_->setCurrentIndex(index);
  table_->selectRow(index.row());
  table_->scrollTo(index);
}

int ModelsPage::selected_row() const {
  const QModelIndex current = table_->currentIndex();
  return current.isValid() ? proxy_->mapToSource(current).row() : -1;
}

void ModelsPage::set_context(int tokens) {
  context_spin_->setValue(tokens);
}

QString ModelsPage::status_text() const {
  return status_label_->text();
}

void ModelsPage::show_status(const QString& text, bool error) {
  status_label_->setText(text);
  status_label_->setStyleSheet(error ? QStringLiteral("color: #c62828;") : QString());
}

void ModelsPage::update_buttons() {
  const bool loading = bridge_ && bridge_->loading();
  const int row = selected_row();
  const bool loaded =
      row >= 0 && model_->data(model_->index(row, 0), ModelLibraryModel::kLoadedRole).toBool();
  load_button_->setEnabled(bridge_ && row >= 0 && !loaded);
  cancel_button_->setVisible(loading);
  load_busy_->setVisible(loading);
  scan_busy_->setVisible(scanning_);
  scan_label_->setVisible(scanning_);
  remove_folder_button_->setEnabled(!folders_.empty());
  const bool idle = downloading_.isEmpty();
  const bool have_default = fs::exists(default_model_path());
  const bool have_gemma = fs::exists(gemma3_model_path());
  default_download_->setEnabled(idle && !have_default);
  default_download_->setText(have_default ? tr("SmolLM2-135M-Instruct is installed")
                                          : tr("Download SmolLM2-135M-Instruct"));
  gemma_download_->setEnabled(idle && !have_gemma);
  gemma_download_->setText(have_gemma ? tr("Gemma 3 270M is installed")
                                      : tr("Download Gemma 3 270M…"));
}

void ModelsPage::choose_folder_to_add() {
  const QString folder =
      QFileDialog::getExistingDirectory(this, tr("Add a folder of GGUF models"), QString());
  if (!folder.isEmpty()) add_folder(folder);
}

void ModelsPage::choose_folder_to_remove() {
  QStringList folders;
  for (const fs::path& f : folders_) folders << from_path(f);
  if (folders.isEmpty()) return;
  bool ok = false;
  const QString folder = QInputDialog::getItem(
      this, tr("Remove a model folder"), tr("Stop looking for models in:"), folders, 0, false, &ok);
  if (ok && !folder.isEmpty()) remove_folder(folder);
}

void ModelsPage::choose_file_to_open() {
  const QString file = QFileDialog::getOpenFileName(this, tr("Open a GGUF model"), QString(),
                                                    tr("GGUF models (*.gguf);;All files (*)"));
  if (!file.isEmpty()) open_file(file);
}

void ModelsPage::dragEnterEvent(QDragEnterEvent* event) {
  if (!gguf_files(event->mimeData()).isEmpty()) event->acceptProposedAction();
}

void ModelsPage::dropEvent(QDropEvent* event) {
  const QStringList files = gguf_files(event->mimeData());
  if (files.isEmpty()) return;
  event->acceptProposedAction();
  for (const QString& file : files) open_file(file);
}

void ModelsPage::set_downloads_enabled(bool enabled) {
  downloads_->setVisible(enabled);
}

void ModelsPage::request_download(const QString& name) {
  if (!downloading_.isEmpty()) return;
  downloading_ = name;
  download_label_->setStyleSheet(QString());
  download_label_->setText(tr("Downloading %1…").arg(name));
  update_buttons();
  emit downloadRequested(name);
}

void ModelsPage::download_finished(bool ok, const QString& path_or_message) {
  downloading_.clear();
  download_label_->setStyleSheet(ok ? QString() : QStringLiteral("color: #c62828;"));
  download_label_->setText(ok ? tr("Downloaded %1").arg(path_or_message) : path_or_message);
  update_buttons();
  if (ok) rescan();
}

}  // namespace tokenfab::ui
