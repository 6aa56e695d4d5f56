#pragma once
// First run without the embedded default model: ModelFetch asks whether to download it, then runs
// `tokenfab-cli fetch` (the same verified download as the command line, from the binary next to
// this one) in a child process behind a progress dialog that shows what the download reports and
// can be cancelled. Nothing half-written is left: the fetch itself stores the file only once its
// SHA-256 is verified.

#include <QObject>
#include <QPointer>
#include <QProcess>
#include <QString>

class QProgressDialog;
class QWidget;

namespace tokenfab::app {

class ModelFetch : public QObject {
  Q_OBJECT

 public:
  explicit ModelFetch(QWidget* parent_window);
  ~ModelFetch() override;  // kills a download still running

  // Asks first; false when the user declines. Otherwise starts the download and returns true;
  // finished() follows.
  bool ask_and_start();
  void start();
  // The command line run: the tokenfab-cli next to this executable.
  static QString cli_path();

 signals:
  // ok: the model is in place (path); otherwise `message` says why (cancelled, failed, …).
  void finished(bool ok, const QString& path_or_message);

 private:
  void on_output();
  void on_finished(int exit_code, QProcess::ExitStatus status);

  QPointer<QWidget> window_;
  QProcess process_;
  QProgressDialog* dialog_ = nullptr;
  QString last_line_, stdout_;
  bool cancelled_ = false;
};

}  // namespace tokenfab::app
