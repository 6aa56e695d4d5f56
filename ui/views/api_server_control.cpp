#include "ui/views/api_server_control.h"

#include <QDialog>
#include <QDialogButtonBox>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QMenu>
#include <QSpinBox>
#include <QToolButton>

#include "ui/bridge/api_server_bridge.h"

namespace tokenfab::ui {

ApiServerControl::ApiServerControl(ApiServerBridge* server, QWidget* parent)
    : QWidget(parent), server_(server) {
  button_ = new QToolButton;
  button_->setPopupMode(QToolButton::InstantPopup);
  button_->setAutoRaise(true);
  button_->setToolTip(
      tr("The local OpenAI-compatible server on this engine (/v1/chat/completions, "
         "/v1/completions, /metrics, …)"));
  auto* menu = new QMenu(button_);
  toggle_ = menu->addAction(tr("Serve the OpenAI API"));
  toggle_->setCheckable(true);
  menu->addAction(tr("Server settings…"), this, &ApiServerControl::edit_settings);
  button_->setMenu(menu);
  status_ = new QLabel;
  status_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  auto* layout = new QHBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  layout->addWidget(button_);
  layout->addWidget(status_);
  connect(toggle_, &QAction::toggled, this, &ApiServerControl::set_enabled);
  connect(server_, &ApiServerBridge::stateChanged, this, &ApiServerControl::refresh);
  refresh();
}

void ApiServerControl::set_enabled(bool on) {
  if (on == server_->running()) return;
  if (on)
    server_->start(ApiServerSettings::load());
  else
    server_->stop();
  refresh();
}

void ApiServerControl::edit_settings() {
  const ApiServerSettings current = ApiServerSettings::load();
  QDialog dialog(this);
  dialog.setWindowTitle(tr("OpenAI-compatible server"));
  auto* host = new QLineEdit(current.host);
  auto* port = new QSpinBox;
  port->setRange(0, 65535);
  port->setValue(current.port);
  port->setSpecialValueText(tr("any free port"));
  auto* key = new QLineEdit(current.api_key);
  key->setEchoMode(QLineEdit::PasswordEchoOnEdit);
  key->setPlaceholderText(tr("none (needed for any address but loopback)"));
  auto* form = new QFormLayout(&dialog);
  form->addRow(tr("Address"), host);
  form->addRow(tr("Port"), port);
  form->addRow(tr("API key"), key);
  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel);
  form->addRow(buttons);
  connect(buttons, &QDialogButtonBox::accepted, &dialog, &QDialog::accept);
  connect(buttons, &QDialogButtonBox::rejected, &dialog, &QDialog::reject);
  if (dialog.exec() != QDialog::Accepted) return;
  ApiServerSettings s = current;
  s.host = host->text().trimmed();
  s.port = port->value();
  s.api_key = key->text();
  if (server_->running() || s.enabled) {
    server_->start(s);  // saves them when it starts
  } else {
    s.save();
  }
  refresh();
}

void ApiServerControl::refresh() {
  const bool running = server_->running();
  toggle_->blockSignals(true);
  toggle_->setChecked(running);
  toggle_->blockSignals(false);
  button_->setText(running ? tr("API on") : tr("API off"));
  if (running)
    status_->setText(server_->address());
  else if (!server_->error().isEmpty())
    status_->setText(tr("API: %1").arg(server_->error()));
  else
    status_->clear();
  status_->setToolTip(running ? tr("OpenAI base URL: %1/v1").arg(server_->address()) : QString());
}

}  // namespace tokenfab::ui
