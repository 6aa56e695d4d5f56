#pragma once
// ModelsPage: the model library (core/model/model_library.h) as a sortable table
// (ModelLibraryModel) — every GGUF file in Tokenfab's cache, the folders the user added, LM
// Studio's, GPT4All's and Ollama's folders — with what each needs in memory at a chosen context
// against this machine's RAM and each GPU, and the verdict. The scan (headers only, and the GPU
// enumeration) runs on a thread of its own with a busy indicator; its result arrives queued on the
// GUI thread. Files the scan skipped are listed with the reason under a Details button.
//
// Add folder… / Remove folder edit the user's folder list (core/model/model_folders.h) and rescan.
// Open file… and dropping a .gguf file on the page describe that file and list it ("opened");
// Load loads the selected model through the EngineBridge (refusing, with the numbers, a model
// Tokenfab cannot run or that does not fit at the chosen context; the bridge itself refuses what
// does not fit the host), with a busy bar and Cancel while it loads. The loaded model's row is
// marked. The download buttons ask the application (downloadRequested) to fetch the default model
// or Gemma 3 270M; it answers with download_finished(), and a success rescans.

#include <QPointer>
#include <QString>
#include <QStringList>
#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include "core/model/model_library.h"
#include "ui/views/page.h"

class QLabel;
class QListWidget;
class QProgressBar;
class QPushButton;
class QSortFilterProxyModel;
class QSpinBox;
class QTableView;
class QToolButton;

namespace tokenfab::ui {

class ModelLibraryModel;
struct LibraryScan;

class ModelsPage : public Page {
  Q_OBJECT

 public:
  // `tokenfab-cli fetch` names of the models the download buttons fetch.
  static constexpr const char* kDefaultModelName = "smollm2-135m";
  static constexpr const char* kGemmaModelName = "gemma3-270m";

  explicit ModelsPage(QWidget* parent = nullptr);
  ~ModelsPage() override;  // waits for a scan in flight (it reads headers only)

  QString title() const override { return QStringLiteral("Models"); }
  void attach(EngineBridge* bridge) override;

  // Scans the library again off the GUI thread; scanFinished() follows. Asked during a scan, one
  // more scan runs after it (its result replaces the first's). The first showing scans.
  void rescan();
  bool scanning() const { return scanning_; }
  bool scanned() const { return scans_ > 0; }  // a scan has finished
  // Adds / removes a folder of the user's list (persisted) and rescans; false with the reason in
  // status_text().
  bool add_folder(const QString& folder);
  bool remove_folder(const QString& folder);
  // Describes a GGUF file (anywhere), lists it with the source "opened" and selects it; kept
  // across rescans (not in the folder list). False with the reason in status_text().
  bool open_file(const QString& path);
  // Loads the library model's `row` (ModelLibraryModel's row, not the sorted view's); false with
  // the reason in status_text() when refused.
  bool load_row(int row);
  void load_selected();
  void select_row(int row);      // ModelLibraryModel's row
  int selected_row() const;      // ModelLibraryModel's row, -1 when none
  void set_context(int tokens);  // 0: each model's default, min(context length, 4096)

  ModelLibraryModel* library_model() const { return model_; }
  QTableView* table() const { return table_; }
  QString status_text() const;
  // The skipped files, "PATH: REASON" each, as the scan reported them.
  QStringList skipped_lines() const { return skipped_lines_; }
  // The user's model folders as the last scan read them.
  const std::vector<std::filesystem::path>& folders() const { return folders_; }

  // Shows the download buttons (the application can run `tokenfab-cli fetch`).
  void set_downloads_enabled(bool enabled);
  // The application's answer to downloadRequested(): ok with the file's path, or why not.
  void download_finished(bool ok, const QString& path_or_message);

 signals:
  void scanFinished();
  // `name`: kDefaultModelName or kGemmaModelName; the application asks for a license where one
  // must be accepted, then fetches.
  void downloadRequested(const QString& name);

 protected:
  void showEvent(QShowEvent* event) override;
  void dragEnterEvent(QDragEnterEvent* event) override;
  void dropEvent(QDropEvent* event) override;

 private:
  QWidget* build_toolbar();
  QWidget* build_load_bar();
  QWidget* build_skipped();
  QWidget* build_downloads();
  void on_scanned(const std::shared_ptr<LibraryScan>& result);
  void on_loaded();
  void mark_loaded();  // marks the loaded model's row, listing it as opened when absent
  // Describes `path` and lists it as opened (or refreshes its row); returns its row. Throws Error
  // for a file that is not a readable GGUF.
  int list_opened(const std::filesystem::path& path);
  void choose_folder_to_add();
  void choose_folder_to_remove();
  void choose_file_to_open();
  void request_download(const QString& name);
  void show_status(const QString& text, bool error = false);
  void show_memory();
  void update_buttons();
  void join_scanner();

  QPointer<EngineBridge> bridge_;
  ModelLibraryModel* model_ = nullptr;
  QSortFilterProxyModel* proxy_ = nullptr;
  QTableView* table_ = nullptr;
  QSpinBox* context_spin_ = nullptr;
  QProgressBar* scan_busy_ = nullptr;
  QLabel* scan_label_ = nullptr;
  QLabel* memory_label_ = nullptr;
  QPushButton* rescan_button_ = nullptr;
  QPushButton* remove_folder_button_ = nullptr;
  QPushButton* load_button_ = nullptr;
  QPushButton* cancel_button_ = nullptr;
  QProgressBar* load_busy_ = nullptr;
  QLabel* status_label_ = nullptr;
  QLabel* skipped_label_ = nullptr;
  QToolButton* skipped_toggle_ = nullptr;
  QListWidget* skipped_list_ = nullptr;
  QWidget* downloads_ = nullptr;
  QPushButton* default_download_ = nullptr;
  QPushButton* gemma_download_ = nullptr;
  QLabel* download_label_ = nullptr;

  std::thread scanner_;
  bool scanning_ = false;
  bool scan_again_ = false;
  int scans_ = 0;
  std::vector<std::filesystem::path> opened_;   // files the user opened, kept across scans
  std::vector<std::filesystem::path> folders_;  // the user's folders, from the last scan
  QStringList skipped_lines_;
  QString downloading_;  // the name being fetched; empty when none
};

}  // namespace tokenfab::ui
