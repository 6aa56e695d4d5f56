#pragma once
// The status bar's switch for the local OpenAI-compatible server (ApiServerBridge): a button
// showing "API off" or the address it serves, with a menu to turn it on or off and a settings
// dialog (host, port, API key). A failure to start (a port in use, a non-loopback host without a
// key) is shown beside it, in words.

#include <QWidget>

class QAction;
class QLabel;
class QToolButton;

namespace tokenfab::ui {

class ApiServerBridge;
struct ApiServerSettings;

class ApiServerControl : public QWidget {
  Q_OBJECT

 public:
  explicit ApiServerControl(ApiServerBridge* server, QWidget* parent = nullptr);

  QToolButton* button() const { return button_; }
  QAction* toggle_action() const { return toggle_; }
  QLabel* status_label() const { return status_; }
  // Opens the settings dialog; on OK the server (re)starts with them.
  void edit_settings();

 private:
  void refresh();
  void set_enabled(bool on);

  ApiServerBridge* server_;
  QToolButton* button_ = nullptr;
  QAction* toggle_ = nullptr;
  QLabel* status_ = nullptr;
};

}  // namespace tokenfab::ui
