#pragma once
// ChatSettingsBar: what one chat conversation runs with — max tokens, temperature, top-k, top-p,
// min-p, the draft head (none, auto or a registered head), context lookup drafts (greedy replies
// only), the model file and the device mode —
// stored with the conversation as a JSON object, plus the "colour drafted tokens" view toggle.
// changed() follows every change made through the widgets or the setters; load() emits nothing.

#include <QString>
#include <QWidget>
#include <string>
#include <utility>
#include <vector>

#include "core/serving/engine.h"

class QCheckBox;
class QComboBox;
class QDoubleSpinBox;
class QPushButton;
class QSpinBox;

namespace tokenfab::ui {

class ChatSettingsBar : public QWidget {
  Q_OBJECT

 public:
  static constexpr int kDefaultMaxTokens = 256;
  static constexpr double kDefaultTemperature = 0.7;

  explicit ChatSettingsBar(QWidget* parent = nullptr);

  // The settings as a JSON object text, and back (missing or unknown values take the defaults; a
  // head or mode the bar does not offer falls back to none / the engine's mode).
  std::string to_json() const;
  void load(const std::string& settings_json);

  int max_tokens() const;
  SamplingParams sampling() const;  // seed 0: the caller picks one
  bool colour_drafted() const;
  // Context lookup drafts asked for and possible: the box is ticked and the temperature is 0
  // (the box is disabled otherwise). The chat then sets GenerationRequest::lookup to kLookup.
  bool context_lookup() const;
  static constexpr int32_t kLookup = 3;

  // "none", "auto" or a registered head's name.
  QString head_choice() const;
  bool set_head_choice(const QString& choice);  // false when not offered
  // Offers these heads (name, label) after none and auto, keeping the choice shown when it is
  // still offered (none otherwise). Emits nothing.
  void set_heads(const std::vector<std::pair<QString, QString>>& heads);

  // The model file ("": whatever the engine has loaded) and the device mode ("": the engine's,
  // "colocated" or "disaggregated").
  QString model_choice() const { return model_path_; }
  void set_model_choice(const QString& path);
  QString mode_choice() const;
  bool set_mode_choice(const QString& mode);  // false when not offered
  // The engine configuration `mode` asks for, from `current`: colocated runs every device of
  // `current` as a full worker; disaggregated prefills on the first device and decodes on the
  // others (cpu:0 → cpu:1 when there is one device). "" keeps `current`.
  static EngineConfig config_for_mode(const EngineConfig& current, const QString& mode);

 signals:
  void changed();
  void colourToggled(bool on);

 private:
  void show_model(const QString& path);
  void choose_model_file();

  QSpinBox* max_tokens_ = nullptr;
  QDoubleSpinBox* temperature_ = nullptr;
  QSpinBox* top_k_ = nullptr;
  QDoubleSpinBox* top_p_ = nullptr;
  QDoubleSpinBox* min_p_ = nullptr;
  QComboBox* head_ = nullptr;
  QCheckBox* lookup_ = nullptr;
  QPushButton* model_button_ = nullptr;
  QPushButton* model_reset_ = nullptr;
  QComboBox* mode_ = nullptr;
  QCheckBox* colour_drafted_ = nullptr;
  QString model_path_;
};

}  // namespace tokenfab::ui
