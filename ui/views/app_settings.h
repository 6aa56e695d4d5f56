#pragma once
// The desktop app's settings: an INI file next to the database in the user data directory
// (user_data_dir()/settings.ini), so TOKENFAB_HOME moves both. Keys the pages share are here.

#include <QSettings>
#include <QString>

#include "core/serving/engine.h"

namespace tokenfab::ui {

QString settings_file();

// Opens the settings file; write through it and let it go out of scope (it syncs then).
class AppSettings : public QSettings {
 public:
  AppSettings() : QSettings(settings_file(), QSettings::IniFormat) {}
};

// The device roles and mode last applied on the Devices page (devices, prefill, decode), kept so
// the next start uses them unless the command line says otherwise.
void save_device_roles(const EngineConfig& config);
// Fills config's devices / prefill / decode from the settings; false when none were saved.
bool load_device_roles(EngineConfig& config);

namespace settings_keys {
// The draft head new chat conversations start with: "none", "auto" or a registered head's name
// (set on the Draft heads page).
inline constexpr const char* kDefaultHead = "heads/default";
inline constexpr const char* kWindowGeometry = "window/geometry";
inline constexpr const char* kWindowPage = "window/page";  // the page shown at exit
}  // namespace settings_keys

}  // namespace tokenfab::ui
