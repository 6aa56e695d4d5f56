#pragma once
// Page: one entry of the main window's sidebar (Chat, Live, KV inspector, Draft heads, Devices,
// Demo, History). A page receives the bridge once and connects to what it shows; it never calls
// into core except through the bridge and the engine facade.

#include <QString>
#include <QWidget>

namespace tokenfab::ui {

class EngineBridge;

class Page : public QWidget {
  Q_OBJECT

 public:
  using QWidget::QWidget;
  virtual QString title() const = 0;
  // Connects the page to the bridge's signals; called once, before the page is shown.
  virtual void attach(EngineBridge* bridge) = 0;
};

}  // namespace tokenfab::ui
