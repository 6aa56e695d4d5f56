#pragma once
// Downloads a model Tokenfab knows by name — the embedded default (first run without it: ModelFetch
// asks whether to download it) or Gemma 3 270M (the Models page) — by running `tokenfab-cli fetch
// [NAME] [--accept-license]` (the same verified download as the command line, from the binary next
// to this one) in a child process behind a progress dialog that shows what the download reports
// and can be cancelled. A model whose license must be accepted (Gemma's) is fetched only after the
// user accepts it in a dialog naming the terms and their link. Nothing half-written is left: the
// fetch itself stores the file only once its SHA-256 is verified.

#include <QObject>
#include <QPointer>
#include <QProcess>
#include <QString>

class QProgressDialog;
class QWidget;

namespace tokenfab::app {

// A model `tokenfab-cli fetch` knows (tools/fetch_model.py's list).
struct FetchableModel {
  const char* name;  // the fetch name: smollm2-135m, gemma3-270m
  const char* title;
  const char* license;
  const char* license_url;
  bool license_must_be_accepted;
};

class ModelFetch : public QObject {
  Q_OBJECT

 public:
  explicit ModelFetch(QWidget* parent_window);
  ~ModelFetch() override;  // kills a download still running

  // The model fetched under `name`; nullptr for a name fetch does not know.
  static const FetchableModel* find(const QString& name);

  // The default model, first run: asks first; false when the user declines. Otherwise starts the
  // download and returns true; finished() follows.
  bool ask_and_start();
  // `name`'s download: where its license must be accepted, asks first (Accept / Cancel); then
  // starts it. finished() follows in every case (a declined license, an unknown name included).
  void request(const QString& name);
  // Runs `tokenfab-cli fetch [NAME] [--accept-license]` (empty name: the default model); while a
  // download runs, finished(false, …) says so at once.
  void start(const QString& name = QString(), bool accept_license = false);
  bool running() const { return process_.state() != QProcess::NotRunning; }
  // The command line run: the tokenfab-cli next to this executable.
  static QString cli_path();

 signals:
  // ok: the model is in place (path); otherwise `message` says why (cancelled, failed, …).
  void finished(bool ok, const QString& path_or_message);

 private:
  // The license dialog: names the terms with their link; true when the user accepts them.
  bool accept_license(const FetchableModel& model);
  void on_output();
  void on_finished(int exit_code, QProcess::ExitStatus status);

  QPointer<QWidget> window_;
  QProcess process_;
  QProgressDialog* dialog_ = nullptr;
  QString last_line_, stdout_;
  bool cancelled_ = false;
};

}  // namespace tokenfab::app
