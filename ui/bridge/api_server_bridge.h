#pragma once
// ApiServerBridge: the app's switch for the local OpenAI-compatible server (core/api): the same
// server `tokenfab-cli serve` runs, on the app's own engine. Requests from the API go through the
// bridge's Engine like the Chat page's, so the Live page and the KV inspector show them.
//
// The server follows the engine: when the bridge stops its engine (a reload, a reconfiguration,
// the app closing) the server detaches from it first — its requests in flight are cancelled and
// it answers 503 until the next engine starts, which it then serves. Its settings (host, port, an
// API key, whether it runs) are kept in AppSettings; the app starts it at launch when it ran at
// the last exit.
//
// Threads: start(), stop() and the engine's changes on the GUI thread; the server listens on a
// thread of its own, its handlers on httplib's pool.

#include <QObject>
#include <QString>
#include <memory>
#include <thread>

#include "core/api/api_server.h"

namespace tokenfab::ui {

class EngineBridge;

struct ApiServerSettings {
  QString host = QStringLiteral("127.0.0.1");
  int port = 8080;  // 0: any free port
  QString api_key;  // empty: none (loopback only)
  bool enabled = false;

  static ApiServerSettings load();  // from AppSettings
  void save() const;
};

class ApiServerBridge : public QObject {
  Q_OBJECT

 public:
  explicit ApiServerBridge(EngineBridge* engine, QObject* parent = nullptr);
  ~ApiServerBridge() override;  // stops the server

  // Starts the server with `settings` (saved, enabled, when it starts); false with error() set
  // when it cannot (a refused host, a port in use). Restarts a running server.
  bool start(const ApiServerSettings& settings);
  // Stops the server (saved as disabled unless `keep_enabled`: the app closing).
  void stop(bool keep_enabled = false);
  bool running() const { return server_ != nullptr; }
  // "http://127.0.0.1:8080" while running; empty otherwise.
  QString address() const { return address_; }
  QString error() const { return error_; }

 signals:
  void stateChanged();  // started, stopped or failed

 private:
  void attach_engine();
  void detach_engine();

  EngineBridge* engine_;
  std::unique_ptr<api::ApiServer> server_;
  std::thread listener_;
  QString address_, error_;
};

}  // namespace tokenfab::ui
