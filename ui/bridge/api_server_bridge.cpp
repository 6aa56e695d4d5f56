#include "ui/bridge/api_server_bridge.h"

#include <QFileInfo>
#include <filesystem>

#include "core/common/error.h"
#include "core/common/log.h"
#include "ui/bridge/engine_bridge.h"
#include "ui/views/app_settings.h"

namespace tokenfab::ui {

namespace {
constexpr const char* kEnabled = "api/enabled";
constexpr const char* kHost = "api/host";
constexpr const char* kPort = "api/port";
constexpr const char* kKey = "api/key";
}  // namespace

ApiServerSettings ApiServerSettings::load() {
  AppSettings s;
  ApiServerSettings out;
  out.enabled = s.value(kEnabled, false).toBool();
  out.host = s.value(kHost, out.host).toString();
  out.port = s.value(kPort, out.port).toInt();
  out.api_key = s.value(kKey).toString();
  return out;
}

void ApiServerSettings::save() const {
  AppSettings s;
  s.setValue(kEnabled, enabled);
  s.setValue(kHost, host);
  s.setValue(kPort, port);
  s.setValue(kKey, api_key);
}

ApiServerBridge::ApiServerBridge(EngineBridge* engine, QObject* parent)
    : QObject(parent), engine_(engine) {
  // Direct connections: the server lets go of an engine before the bridge destroys it.
  connect(engine_, &EngineBridge::engineStopping, this, &ApiServerBridge::detach_engine,
          Qt::DirectConnection);
  connect(engine_, &EngineBridge::engineStarted, this, &ApiServerBridge::attach_engine,
          Qt::DirectConnection);
}

ApiServerBridge::~ApiServerBridge() {
  stop(true);
}

bool ApiServerBridge::start(const ApiServerSettings& settings) {
  stop(true);
  error_.clear();
  api::ApiServerConfig config;
  config.host = settings.host.toStdString();
  config.port = settings.port;
  config.api_key = settings.api_key.toStdString();
  try {
    auto server = std::make_unique<api::ApiServer>(config);
    const int port = server->bind();
    server_ = std::move(server);
    const bool v6 = settings.host.contains(QLatin1Char(':'));
    address_ = QStringLiteral("http://%1:%2")
                   .arg(v6 ? QStringLiteral("[%1]").arg(settings.host) : settings.host)
                   .arg(port);
  } catch (const std::exception& e) {
    error_ = QString::fromStdString(e.what());
    emit stateChanged();
    return false;
  }
  api::ApiServer* server = server_.get();
  listener_ = std::thread([server] {
    try {
      server->serve();
    } catch (const std::exception& e) {
      logger("api")->error("the app's API server stopped: {}", e.what());
    }
  });
  attach_engine();
  ApiServerSettings saved = settings;
  saved.enabled = true;
  saved.save();
  logger("api")->info("the app serves the OpenAI API on {}", address_.toStdString());
  emit stateChanged();
  return true;
}

void ApiServerBridge::stop(bool keep_enabled) {
  if (!server_) return;
  server_->stop();
  if (listener_.joinable()) listener_.join();
  server_->detach();
  server_.reset();
  address_.clear();
  if (!keep_enabled) {
    ApiServerSettings s = ApiServerSettings::load();
    s.enabled = false;
    s.save();
  }
  emit stateChanged();
}

void ApiServerBridge::attach_engine() {
  if (!server_ || !engine_->ready()) return;
  const LlamaModel& model = *engine_->model();
  const std::string id = std::filesystem::path(model.file().name()).stem().string();
  try {
    server_->attach(*engine_->engine(), model, *engine_->tokenizer(), id,
                    engine_->config().context_limit(model.hparams()));
  } catch (const std::exception& e) {  // the server's head cannot be resolved (none is set here)
    error_ = QString::fromStdString(e.what());
    emit stateChanged();
  }
}

void ApiServerBridge::detach_engine() {
  if (server_) server_->detach();
}

}  // namespace tokenfab::ui
