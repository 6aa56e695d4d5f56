#pragma once
// MainWindow: a sidebar of pages (Chat, Live, KV inspector, ...) over a stack of them, and a
// status bar with the model, the engine's mode, each device's role and the live output tok/s
// (from the bridge's snapshots), and the switch of the local OpenAI-compatible server.

#include <QMainWindow>
#include <QPointer>
#include <QString>
#include <vector>

#include "ui/bridge/engine_bridge.h"

class QLabel;
class QListWidget;
class QProgressBar;
class QPushButton;
class QStackedWidget;

namespace tokenfab::ui {

class ApiServerBridge;
class ApiServerControl;
class Page;

class MainWindow : public QMainWindow {
  Q_OBJECT

 public:
  explicit MainWindow(EngineBridge* bridge, QWidget* parent = nullptr);

  // Takes ownership; attaches the page to the bridge and lists it in the sidebar.
  void add_page(Page* page);
  // False when no page has that title.
  bool show_page(const QString& title);
  Page* page(const QString& title) const;  // nullptr when absent
  // Shows the API server's switch and address in the status bar.
  void set_api_server(ApiServerBridge* server);
  ApiServerControl* api_control() const { return api_control_; }

 protected:
  // Saves the window geometry and the page shown (AppSettings); the constructor restores the
  // geometry, and the app may show the saved page (saved_page()).
  void closeEvent(QCloseEvent* event) override;

 public:
  static QString saved_page();  // empty when none was saved

 private:
  void on_snapshot(const SnapshotPtr& snapshot);
  void on_loaded();
  void show_loading(bool loading);

  QPointer<EngineBridge> bridge_;
  std::vector<Page*> pages_;
  QListWidget* sidebar_ = nullptr;
  QStackedWidget* stack_ = nullptr;
  QLabel* model_label_ = nullptr;
  QLabel* mode_label_ = nullptr;
  QLabel* devices_label_ = nullptr;
  QLabel* rate_label_ = nullptr;
  QProgressBar* load_progress_ = nullptr;
  QPushButton* load_cancel_ = nullptr;
  ApiServerControl* api_control_ = nullptr;
};

}  // namespace tokenfab::ui
