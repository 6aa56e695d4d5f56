#include "ui/views/app_settings.h"

#include "core/storage/database.h"

namespace tokenfab::ui {

QString settings_file() {
  return QString::fromStdString((user_data_dir() / "settings.ini").string());
}

void save_device_roles(const EngineConfig& config) {
  AppSettings s;
  s.setValue("engine/devices", QString::fromStdString(config.devices));
  s.setValue("engine/prefill", QString::fromStdString(config.prefill));
  s.setValue("engine/decode", QString::fromStdString(config.decode));
}

bool load_device_roles(EngineConfig& config) {
  AppSettings s;
  if (!s.contains("engine/devices")) return false;
  config.devices = s.value("engine/devices").toString().toStdString();
  config.prefill = s.value("engine/prefill").toString().toStdString();
  config.decode = s.value("engine/decode").toString().toStdString();
  return true;
}

}  // namespace tokenfab::ui
