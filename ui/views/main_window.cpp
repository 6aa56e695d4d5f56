#include "ui/views/main_window.h"

#include <QFileInfo>
#include <QHBoxLayout>
#include <QLabel>
#include <QListWidget>
#include <QProgressBar>
#include <QPushButton>
#include <QStackedWidget>
#include <QStatusBar>

#include "ui/views/api_server_control.h"
#include "ui/views/app_settings.h"
#include "ui/views/page.h"

namespace tokenfab::ui {

MainWindow::MainWindow(EngineBridge* bridge, QWidget* parent)
    : QMainWindow(parent), bridge_(bridge) {
  setWindowTitle(QStringLiteral("Tokenfab"));
  sidebar_ = new QListWidget;
  sidebar_->setFixedWidth(150);
  sidebar_->setSpacing(2);
  stack_ = new QStackedWidget;
  auto* central = new QWidget;
  auto* layout = new QHBoxLayout(central);
  layout->setContentsMargins(4, 4, 4, 4);
  layout->addWidget(sidebar_);
  layout->addWidget(stack_, 1);
  setCentralWidget(central);
  connect(sidebar_, &QListWidget::currentRowChanged, stack_, &QStackedWidget::setCurrentIndex);

  model_label_ = new QLabel(tr("Loading model…"));
  mode_label_ = new QLabel;
  devices_label_ = new QLabel;
  rate_label_ = new QLabel;
  statusBar()->addWidget(model_label_);
  statusBar()->addWidget(mode_label_);
  statusBar()->addWidget(devices_label_, 1);
  statusBar()->addPermanentWidget(rate_label_);
  // While a model loads: a busy bar (the load reports no fraction) and Cancel.
  load_progress_ = new QProgressBar;
  load_progress_->setRange(0, 0);
  load_progress_->setMaximumWidth(160);
  load_cancel_ = new QPushButton(tr("Cancel"));
  statusBar()->addWidget(load_progress_);
  statusBar()->addWidget(load_cancel_);
  show_loading(bridge && bridge->loading());
  connect(load_cancel_, &QPushButton::clicked, bridge, &EngineBridge::cancel_load);

  connect(bridge, &EngineBridge::loadStarted, this, [this](const QString& path) {
    model_label_->setText(path.isEmpty() ? tr("Loading the default model…")
                                         : tr("Loading %1…").arg(QFileInfo(path).fileName()));
    show_loading(true);
  });
  connect(bridge, &EngineBridge::loaded, this, &MainWindow::on_loaded);
  connect(bridge, &EngineBridge::failed, this, [this](const QString&) {
    model_label_->setText(tr("No model loaded"));
    show_loading(false);
  });
  connect(bridge, &EngineBridge::loadCancelled, this, [this] {
    model_label_->setText(tr("No model loaded (loading was cancelled)"));
    show_loading(false);
  });
  connect(bridge, &EngineBridge::snapshotTaken, this, &MainWindow::on_snapshot);
  if (bridge->ready()) on_loaded();  // a window made after the load
  resize(1200, 800);
  restoreGeometry(AppSettings().value(settings_keys::kWindowGeometry).toByteArray());
}

void MainWindow::closeEvent(QCloseEvent* event) {
  AppSettings settings;
  settings.setValue(settings_keys::kWindowGeometry, saveGeometry());
  const int row = sidebar_->currentRow();
  if (row >= 0 && row < static_cast<int>(pages_.size()))
    settings.setValue(settings_keys::kWindowPage, pages_[static_cast<size_t>(row)]->title());
  QMainWindow::closeEvent(event);
}

QString MainWindow::saved_page() {
  return AppSettings().value(settings_keys::kWindowPage).toString();
}

void MainWindow::add_page(Page* page) {
  pages_.push_back(page);
  stack_->addWidget(page);  // the stack owns it
  sidebar_->addItem(page->title());
  if (bridge_) page->attach(bridge_);
  if (sidebar_->currentRow() < 0) sidebar_->setCurrentRow(0);
}

void MainWindow::set_api_server(ApiServerBridge* server) {
  if (api_control_ != nullptr || server == nullptr) return;
  api_control_ = new ApiServerControl(server);
  statusBar()->insertPermanentWidget(0, api_control_);
}

bool MainWindow::show_page(const QString& title) {
  for (size_t i = 0; i < pages_.size(); ++i) {
    if (pages_[i]->title().compare(title, Qt::CaseInsensitive) == 0) {
      sidebar_->setCurrentRow(static_cast<int>(i));
      return true;
    }
  }
  return false;
}

Page* MainWindow::page(const QString& title) const {
  for (Page* p : pages_)
    if (p->title().compare(title, Qt::CaseInsensitive) == 0) return p;
  return nullptr;
}

void MainWindow::show_loading(bool loading) {
  load_progress_->setVisible(loading);
  load_cancel_->setVisible(loading);
}

void MainWindow::on_loaded() {
  show_loading(false);
  const QString file = QString::fromStdString(bridge_->model()->file().name());
  model_label_->setText(QFileInfo(file).fileName());
  model_label_->setToolTip(file);
}

void MainWindow::on_snapshot(const SnapshotPtr& snapshot) {
  if (!snapshot) return;
  mode_label_->setText(QString::fromStdString(snapshot->mode));
  QStringList devices;
  for (const DeviceSnapshot& d : snapshot->devices)
    devices << QStringLiteral("%1: %2").arg(QString::fromStdString(d.name),
                                            QString::fromStdString(d.role));
  devices_label_->setText(devices.join(QStringLiteral(" · ")));
  rate_label_->setText(QStringLiteral("%1 tok/s").arg(snapshot->output_rate.per_second, 0, 'f', 1));
}

}  // namespace tokenfab::ui
