#include "ui/views/chat_settings_bar.h"

#include <QCheckBox>
#include <QComboBox>
#include <QDoubleSpinBox>
#include <QFileDialog>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QLabel>
#include <QPushButton>
#include <QSignalBlocker>
#include <QSpinBox>
#include <QStringList>
#include <QVBoxLayout>

#include <nlohmann/json.hpp>

namespace tokenfab::ui {

ChatSettingsBar::ChatSettingsBar(QWidget* parent) : QWidget(parent) {
  const SamplingParams defaults;
  max_tokens_ = new QSpinBox;
  max_tokens_->setRange(1, 8192);
  max_tokens_->setValue(kDefaultMaxTokens);
  temperature_ = new QDoubleSpinBox;
  temperature_->setRange(0.0, 2.0);
  temperature_->setSingleStep(0.1);
  temperature_->setDecimals(2);
  temperature_->setValue(kDefaultTemperature);
  temperature_->setToolTip(tr("0 is greedy"));
  top_k_ = new QSpinBox;
  top_k_->setRange(0, 1000);
  top_k_->setValue(defaults.top_k);
  top_k_->setToolTip(tr("Sample among the k likeliest tokens (0: all)"));
  top_p_ = new QDoubleSpinBox;
  top_p_->setRange(0.01, 1.0);
  top_p_->setSingleStep(0.05);
  top_p_->setValue(defaults.top_p);
  top_p_->setToolTip(
      tr("Sample among the likeliest tokens whose probabilities add up to p (1: all)"));
  min_p_ = new QDoubleSpinBox;
  min_p_->setRange(0.0, 1.0);
  min_p_->setSingleStep(0.01);
  min_p_->setValue(defaults.min_p);
  min_p_->setToolTip(tr("Drop tokens less likely than min-p × the likeliest one (0: none)"));
  head_ = new QComboBox;
  head_->setToolTip(
      tr("Speculative decoding: a draft head trained for this model proposes tokens the model "
         "verifies (greedy output is unchanged). auto picks, per message, the head with the best "
         "recorded ACCEPT/STEP on the message's domain."));
  head_->addItem(tr("No draft head"), QStringLiteral("none"));
  head_->addItem(tr("auto"), QStringLiteral("auto"));
  lookup_ = new QCheckBox(tr("Copy from context"));
  lookup_->setToolTip(
      tr("Greedy replies (temperature 0): also draft the tokens that followed an earlier "
         "occurrence of the reply's last few tokens, with or without a draft head. The reply is "
         "unchanged; repeated names, lines and phrases come out several tokens per step."));
  model_button_ = new QPushButton;
  model_reset_ = new QPushButton(tr("Use the loaded model"));
  mode_ = new QComboBox;
  mode_->addItem(tr("The engine's mode"), QString());
  mode_->addItem(tr("Colocated"), QStringLiteral("colocated"));
  mode_->addItem(tr("Disaggregated"), QStringLiteral("disaggregated"));
  mode_->setToolTip(
      tr("Colocated: every device prefills and decodes. Disaggregated: the first device "
         "prefills, the others decode, the KV cache moving between them."));
  show_model(QString());
  colour_drafted_ = new QCheckBox(tr("Colour drafted tokens"));
  colour_drafted_->setToolTip(
      tr("Drafted tokens (proposed by the draft head or copied from the context) that the "
         "target accepted are shown in green"));

  auto* sampling_row = new QHBoxLayout;
  const std::pair<const char*, QWidget*> labelled[] = {
      {"Max tokens", max_tokens_}, {"Temperature", temperature_},
      {"Top-k", top_k_},           {"Top-p", top_p_},
      {"Min-p", min_p_},           {"Draft head", head_}};
  for (const auto& [label, widget] : labelled) {
    sampling_row->addWidget(new QLabel(tr(label)));
    sampling_row->addWidget(widget);
  }
  sampling_row->addWidget(lookup_);
  sampling_row->addStretch(1);
  sampling_row->addWidget(colour_drafted_);
  auto* engine_row = new QHBoxLayout;
  engine_row->addWidget(new QLabel(tr("Model")));
  engine_row->addWidget(model_button_);
  engine_row->addWidget(model_reset_);
  engine_row->addWidget(new QLabel(tr("Devices")));
  engine_row->addWidget(mode_);
  engine_row->addStretch(1);
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  layout->addLayout(sampling_row);
  layout->addLayout(engine_row);

  for (QSpinBox* box : {max_tokens_, top_k_})
    connect(box, &QSpinBox::valueChanged, this, &ChatSettingsBar::changed);
  for (QDoubleSpinBox* box : {temperature_, top_p_, min_p_})
    connect(box, &QDoubleSpinBox::valueChanged, this, &ChatSettingsBar::changed);
  for (QComboBox* box : {head_, mode_})
    connect(box, &QComboBox::currentIndexChanged, this, &ChatSettingsBar::changed);
  connect(model_button_, &QPushButton::clicked, this, &ChatSettingsBar::choose_model_file);
  connect(model_reset_, &QPushButton::clicked, this, [this] { set_model_choice(QString()); });
  connect(colour_drafted_, &QCheckBox::toggled, this, &ChatSettingsBar::colourToggled);
  connect(lookup_, &QCheckBox::toggled, this, &ChatSettingsBar::changed);
  const auto greedy_only = [this] { lookup_->setEnabled(temperature_->value() == 0.0); };
  connect(temperature_, &QDoubleSpinBox::valueChanged, this, greedy_only);
  greedy_only();
}

std::string ChatSettingsBar::to_json() const {
  return nlohmann::json{
      {"max_tokens", max_tokens_->value()}, {"temperature", temperature_->value()},
      {"top_k", top_k_->value()},           {"top_p", top_p_->value()},
      {"min_p", min_p_->value()},           {"head", head_choice().toStdString()},
      {"lookup", lookup_->isChecked()},     {"model", model_path_.toStdString()},
      {"mode", mode_choice().toStdString()}}
      .dump();
}

namespace {
// A saved setting, or `fallback` when it is absent or of another type (a database edited by hand
// or damaged loses that setting, not the conversation).
template <typename T>
T field(const nlohmann::json& j, const char* key, T fallback) {
  try {
    return j.value(key, fallback);
  } catch (const nlohmann::json::exception&) {
    return fallback;
  }
}
}  // namespace

void ChatSettingsBar::load(const std::string& settings_json) {
  nlohmann::json j = nlohmann::json::parse(settings_json, nullptr, false);
  if (!j.is_object()) j = nlohmann::json::object();
  const QSignalBlocker block(this);  // loading is not a change to save
  const SamplingParams defaults;
  max_tokens_->setValue(field(j, "max_tokens", kDefaultMaxTokens));
  temperature_->setValue(field(j, "temperature", kDefaultTemperature));
  top_k_->setValue(field(j, "top_k", defaults.top_k));
  top_p_->setValue(field(j, "top_p", static_cast<double>(defaults.top_p)));
  min_p_->setValue(field(j, "min_p", static_cast<double>(defaults.min_p)));
  lookup_->setChecked(field(j, "lookup", false));
  // A head that is no longer registered (or belongs to another model) falls back to none.
  if (!set_head_choice(QString::fromStdString(field(j, "head", std::string("none")))))
    set_head_choice(QStringLiteral("none"));
  show_model(QString::fromStdString(field(j, "model", std::string())));
  if (!set_mode_choice(QString::fromStdString(field(j, "mode", std::string()))))
    set_mode_choice(QString());
}

int ChatSettingsBar::max_tokens() const {
  return max_tokens_->value();
}

SamplingParams ChatSettingsBar::sampling() const {
  SamplingParams p;
  p.temperature = static_cast<float>(temperature_->value());
  p.top_k = top_k_->value();
  p.top_p = static_cast<float>(top_p_->value());
  p.min_p = static_cast<float>(min_p_->value());
  return p;
}

bool ChatSettingsBar::context_lookup() const {
  return lookup_->isChecked() && temperature_->value() == 0.0;
}

bool ChatSettingsBar::colour_drafted() const {
  return colour_drafted_->isChecked();
}

QString ChatSettingsBar::head_choice() const {
  return head_->currentData().toString();
}

// Shows the item whose data is `data`; false when the combo has none.
static bool select_by_data(QComboBox* combo, const QString& data) {
  const int index = combo->findData(data);
  if (index < 0) return false;
  combo->setCurrentIndex(index);
  return true;
}

bool ChatSettingsBar::set_head_choice(const QString& choice) {
  return select_by_data(head_, choice);
}

void ChatSettingsBar::set_heads(const std::vector<std::pair<QString, QString>>& heads) {
  const QString shown = head_choice();
  const QSignalBlocker block(head_);
  while (head_->count() > 2) head_->removeItem(2);  // keep "none" and "auto"
  for (const auto& [name, label] : heads) head_->addItem(label, name);
  if (!set_head_choice(shown)) set_head_choice(QStringLiteral("none"));
}

void ChatSettingsBar::set_model_choice(const QString& path) {
  show_model(path);
  emit changed();
}

void ChatSettingsBar::show_model(const QString& path) {
  model_path_ = path;
  model_button_->setText(path.isEmpty() ? tr("(the loaded model)") : QFileInfo(path).fileName());
  model_button_->setToolTip(path.isEmpty() ? tr("This conversation uses whatever model is loaded")
                                           : path);
  model_reset_->setEnabled(!path.isEmpty());
}

void ChatSettingsBar::choose_model_file() {
  const QString path = QFileDialog::getOpenFileName(this, tr("Model for this conversation"),
                                                    QFileInfo(model_path_).absolutePath(),
                                                    tr("GGUF models (*.gguf);;All files (*)"));
  if (!path.isEmpty()) set_model_choice(path);
}

QString ChatSettingsBar::mode_choice() const {
  return mode_->currentData().toString();
}

bool ChatSettingsBar::set_mode_choice(const QString& mode) {
  return select_by_data(mode_, mode);
}

// The devices of `c` in order: the colocated ones, or the prefill devices then the decode ones.
static QStringList devices_of(const EngineConfig& c) {
  QStringList devices;
  const std::vector<std::string> lists = c.disaggregated()
                                             ? std::vector<std::string>{c.prefill, c.decode}
                                             : std::vector<std::string>{c.devices};
  for (const std::string& list : lists)
    for (const QString& d : QString::fromStdString(list).split(',', Qt::SkipEmptyParts))
      if (!devices.contains(d.trimmed())) devices << d.trimmed();
  return devices;
}

EngineConfig ChatSettingsBar::config_for_mode(const EngineConfig& current, const QString& mode) {
  EngineConfig config = current;
  QStringList devices = devices_of(current);
  if (mode == QStringLiteral("colocated") && current.disaggregated()) {
    config.devices = devices.join(',').toStdString();
    config.prefill.clear();
    config.decode.clear();
    config.long_prefill.clear();
  } else if (mode == QStringLiteral("disaggregated") && !current.disaggregated()) {
    if (devices.size() < 2) devices = {QStringLiteral("cpu:0"), QStringLiteral("cpu:1")};
    config.prefill = devices.first().toStdString();
    config.decode = devices.mid(1).join(',').toStdString();
  }
  return config;
}

}  // namespace tokenfab::ui
