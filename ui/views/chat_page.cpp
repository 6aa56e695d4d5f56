#include "ui/views/chat_page.h"

#include <QCheckBox>
#include <QComboBox>
#include <QDoubleSpinBox>
#include <QFileDialog>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QItemSelectionModel>
#include <QLabel>
#include <QLineEdit>
#include <QListView>
#include <QMessageBox>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QRandomGenerator>
#include <QScrollBar>
#include <QSpinBox>
#include <QSplitter>
#include <QTextBrowser>
#include <QVBoxLayout>
#include <exception>

#include <nlohmann/json.hpp>

#include "core/common/error.h"
#include "core/storage/registry.h"
#include "ui/models/conversation_list_model.h"
#include "ui/views/app_settings.h"

namespace tokenfab::ui {

namespace {

constexpr int kDefaultMaxTokens = 256;
constexpr double kDefaultTemperature = 0.7;

QString from_std(const std::string& s) {
  return QString::fromStdString(s);
}

MessageView message_view(const QString& role, const QString& content, const QString& stats = {}) {
  MessageView view;
  view.role = role;
  view.content = content;
  view.stats = stats;
  return view;
}

// One line of figures for an assistant message, from its stats_json.
QString stats_line(const std::string& stats_json) {
  const nlohmann::json j = nlohmann::json::parse(stats_json, nullptr, false);
  if (!j.is_object() || j.empty()) return {};
  QStringList parts;
  if (j.contains("ttft_ms"))
    parts << QStringLiteral("TTFT %1 ms").arg(j["ttft_ms"].get<double>(), 0, 'f', 0);
  if (j.contains("decode_tok_s"))
    parts << QStringLiteral("%1 tok/s").arg(j["decode_tok_s"].get<double>(), 0, 'f', 1);
  if (j.contains("tokens")) parts << QStringLiteral("%1 tokens").arg(j["tokens"].get<int64_t>());
  if (j.contains("accept_per_step"))
    parts << QStringLiteral("ACCEPT/STEP %1").arg(j["accept_per_step"].get<double>(), 0, 'f', 2);
  if (j.contains("state") && j["state"] != "finished")
    parts << from_std(j["state"].get<std::string>());
  return parts.join(QStringLiteral(" · "));
}

}  // namespace

ChatPage::ChatPage(QWidget* parent) : Page(parent) {
  try {
    db_ = Database::open_default();
    store_ = std::make_unique<Conversations>(*db_);
    model_ = std::make_unique<ConversationListModel>(*db_);
  } catch (const std::exception& e) {
    db_.reset();
    store_.reset();
    model_.reset();
    build_ui();
    show_status(QStringLiteral("The conversation database could not be opened: %1").arg(e.what()));
    return;
  }
  build_ui();
}

ChatPage::~ChatPage() {
  if (!active_) return;
  if (bridge_) bridge_->cancel(active_->id);
  try {
    save_reply(QStringLiteral("cancelled"), R"({"state":"cancelled"})");
  } catch (const std::exception&) {
    // Closing must not throw; the user message is already saved.
  }
}

void ChatPage::build_ui() {
  search_ = new QLineEdit;
  search_->setPlaceholderText(tr("Search conversations"));
  search_->setClearButtonEnabled(true);
  list_ = new QListView;
  list_->setEditTriggers(QAbstractItemView::EditKeyPressed | QAbstractItemView::DoubleClicked);
  new_button_ = new QPushButton(tr("New"));
  rename_button_ = new QPushButton(tr("Rename"));
  delete_button_ = new QPushButton(tr("Delete"));
  auto* buttons = new QHBoxLayout;
  buttons->addWidget(new_button_);
  buttons->addWidget(rename_button_);
  buttons->addWidget(delete_button_);
  auto* left = new QWidget;
  auto* left_layout = new QVBoxLayout(left);
  left_layout->setContentsMargins(0, 0, 0, 0);
  left_layout->addWidget(search_);
  left_layout->addWidget(list_, 1);
  left_layout->addLayout(buttons);

  max_tokens_ = new QSpinBox;
  max_tokens_->setRange(1, 8192);
  max_tokens_->setValue(kDefaultMaxTokens);
  temperature_ = new QDoubleSpinBox;
  temperature_->setRange(0.0, 2.0);
  temperature_->setSingleStep(0.1);
  temperature_->setDecimals(2);
  temperature_->setValue(kDefaultTemperature);
  temperature_->setToolTip(tr("0 is greedy"));
  const SamplingParams defaults;
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
  model_button_ = new QPushButton;
  model_button_->setToolTip(tr("The model this conversation uses (loaded when it sends)"));
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
      tr("Tokens the draft head proposed and the target accepted are shown in green"));
  auto* settings = new QHBoxLayout;
  settings->addWidget(new QLabel(tr("Max tokens")));
  settings->addWidget(max_tokens_);
  settings->addWidget(new QLabel(tr("Temperature")));
  settings->addWidget(temperature_);
  settings->addWidget(new QLabel(tr("Top-k")));
  settings->addWidget(top_k_);
  settings->addWidget(new QLabel(tr("Top-p")));
  settings->addWidget(top_p_);
  settings->addWidget(new QLabel(tr("Min-p")));
  settings->addWidget(min_p_);
  settings->addWidget(new QLabel(tr("Draft head")));
  settings->addWidget(head_);
  settings->addStretch(1);
  settings->addWidget(colour_drafted_);
  auto* engine_settings = new QHBoxLayout;
  engine_settings->addWidget(new QLabel(tr("Model")));
  engine_settings->addWidget(model_button_);
  engine_settings->addWidget(model_reset_);
  engine_settings->addWidget(new QLabel(tr("Devices")));
  engine_settings->addWidget(mode_);
  engine_settings->addStretch(1);

  messages_ = new QTextBrowser;
  messages_->setOpenExternalLinks(false);
  input_ = new QPlainTextEdit;
  input_->setPlaceholderText(tr("Message (Ctrl+Enter sends)"));
  input_->setMaximumHeight(90);
  send_button_ = new QPushButton(tr("Send"));
  send_button_->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_Return));
  stop_button_ = new QPushButton(tr("Stop"));
  auto* input_row = new QHBoxLayout;
  input_row->addWidget(input_, 1);
  auto* input_buttons = new QVBoxLayout;
  input_buttons->addWidget(send_button_);
  input_buttons->addWidget(stop_button_);
  input_row->addLayout(input_buttons);
  status_ = new QLabel;
  status_->setWordWrap(true);

  auto* right = new QWidget;
  auto* right_layout = new QVBoxLayout(right);
  right_layout->setContentsMargins(0, 0, 0, 0);
  right_layout->addLayout(settings);
  right_layout->addLayout(engine_settings);
  right_layout->addWidget(messages_, 1);
  right_layout->addLayout(input_row);
  right_layout->addWidget(status_);

  auto* splitter = new QSplitter;
  splitter->addWidget(left);
  splitter->addWidget(right);
  splitter->setStretchFactor(1, 1);
  splitter->setSizes({240, 760});
  auto* layout = new QVBoxLayout(this);
  layout->addWidget(splitter);

  connect(send_button_, &QPushButton::clicked, this, [this] {
    const QString text = input_->toPlainText().trimmed();
    if (text.isEmpty()) return;
    input_->clear();
    send_message(text);
  });
  connect(stop_button_, &QPushButton::clicked, this, &ChatPage::stop);
  connect(colour_drafted_, &QCheckBox::toggled, this, &ChatPage::render);
  connect(max_tokens_, &QSpinBox::valueChanged, this, &ChatPage::save_settings);
  connect(temperature_, &QDoubleSpinBox::valueChanged, this, &ChatPage::save_settings);
  connect(head_, &QComboBox::currentIndexChanged, this, &ChatPage::save_settings);
  connect(top_k_, &QSpinBox::valueChanged, this, &ChatPage::save_settings);
  connect(top_p_, &QDoubleSpinBox::valueChanged, this, &ChatPage::save_settings);
  connect(min_p_, &QDoubleSpinBox::valueChanged, this, &ChatPage::save_settings);
  connect(mode_, &QComboBox::currentIndexChanged, this, &ChatPage::save_settings);
  connect(model_button_, &QPushButton::clicked, this, &ChatPage::choose_model_file);
  connect(model_reset_, &QPushButton::clicked, this, [this] {
    set_model_choice(QString());
  });
  if (!model_) {
    left->setEnabled(false);
    right->setEnabled(false);
    return;
  }
  list_->setModel(model_.get());
  connect(search_, &QLineEdit::textChanged, this, [this](const QString& text) {
    model_->set_filter(text);
    if (const int row = model_->row_of(conversation_id_); row >= 0)
      list_->setCurrentIndex(model_->index(row));
  });
  connect(list_->selectionModel(), &QItemSelectionModel::currentChanged, this,
          [this](const QModelIndex& current) {
            if (current.isValid()) select_conversation(model_->id_at(current.row()));
          });
  connect(new_button_, &QPushButton::clicked, this,
          [this] { create_conversation(tr("New conversation")); });
  connect(rename_button_, &QPushButton::clicked, this, &ChatPage::rename_conversation);
  connect(delete_button_, &QPushButton::clicked, this, &ChatPage::delete_conversation);
  if (model_->rowCount() > 0) select_conversation(model_->id_at(0));
  update_buttons();
}

void ChatPage::attach(EngineBridge* bridge) {
  bridge_ = bridge;
  connect(bridge, &EngineBridge::streamed, this, &ChatPage::on_streamed);
  auto on_loaded = [this] {
    refresh_heads();
    template_.reset();
    try {
      template_ = ChatTemplate::from_gguf(bridge_->model()->file());
      show_status(QString());
    } catch (const std::exception& e) {
      show_status(QStringLiteral("This model has no usable chat template: %1").arg(e.what()));
    }
    update_buttons();
    if (!pending_message_.isEmpty()) {  // the conversation's model is in: send what waited
      const QString text = pending_message_;
      pending_message_.clear();
      if (template_) {
        send_message(text);
      } else if (input_->toPlainText().isEmpty()) {
        input_->setPlainText(text);  // not sendable with this model: keep it
      }
    }
  };
  connect(bridge, &EngineBridge::loaded, this, on_loaded);
  if (bridge->ready()) on_loaded();
  connect(bridge, &EngineBridge::failed, this, [this](const QString& message) {
    show_status(QStringLiteral("No model: %1").arg(message));
    if (!pending_message_.isEmpty() && input_->toPlainText().isEmpty())
      input_->setPlainText(pending_message_);  // the message that waited is not lost
    pending_message_.clear();
    update_buttons();
  });
  update_buttons();
}

void ChatPage::select_conversation(int64_t id) {
  if (!store_) return;
  conversation_id_ = id;
  shown_.clear();
  for (const MessageRecord& m : store_->messages(id)) {
    shown_.push_back(message_view(from_std(m.role), from_std(m.content), stats_line(m.stats_json)));
  }
  if (const int row = model_->row_of(id); row >= 0 && list_->currentIndex().row() != row)
    list_->setCurrentIndex(model_->index(row));
  load_settings();
  render();
  update_buttons();
}

void ChatPage::load_settings() {
  const auto record = store_->find(conversation_id_);
  nlohmann::json j = record ? nlohmann::json::parse(record->settings_json, nullptr, false)
                            : nlohmann::json::object();
  if (!j.is_object()) j = nlohmann::json::object();
  const QSignalBlocker block_max(max_tokens_);
  const QSignalBlocker block_temperature(temperature_);
  const QSignalBlocker block_head(head_);
  const QSignalBlocker block_top_k(top_k_), block_top_p(top_p_), block_min_p(min_p_);
  const QSignalBlocker block_mode(mode_);
  show_model(QString::fromStdString(j.value("model", std::string())));
  if (!set_mode_choice(QString::fromStdString(j.value("mode", std::string()))))
    set_mode_choice(QString());
  const SamplingParams defaults;
  max_tokens_->setValue(j.value("max_tokens", kDefaultMaxTokens));
  temperature_->setValue(j.value("temperature", kDefaultTemperature));
  top_k_->setValue(j.value("top_k", defaults.top_k));
  top_p_->setValue(j.value("top_p", static_cast<double>(defaults.top_p)));
  min_p_->setValue(j.value("min_p", static_cast<double>(defaults.min_p)));
  // A head that is no longer registered (or belongs to another model) falls back to none.
  if (!set_head_choice(QString::fromStdString(j.value("head", std::string("none")))))
    set_head_choice(QStringLiteral("none"));
}

std::string ChatPage::settings_json() const {
  return nlohmann::json{
      {"max_tokens", max_tokens_->value()}, {"temperature", temperature_->value()},
      {"top_k", top_k_->value()},           {"top_p", top_p_->value()},
      {"min_p", min_p_->value()},           {"head", head_choice().toStdString()},
      {"model", model_path_.toStdString()}, {"mode", mode_choice().toStdString()}}
      .dump();
}

void ChatPage::save_settings() {
  if (!store_ || conversation_id_ == 0) return;
  store_->set_settings(conversation_id_, settings_json());
}

QString ChatPage::head_choice() const {
  return head_->currentData().toString();
}

bool ChatPage::set_head_choice(const QString& choice) {
  const int index = head_->findData(choice);
  if (index < 0) return false;
  head_->setCurrentIndex(index);
  return true;
}

void ChatPage::set_model_choice(const QString& path) {
  show_model(path);
  save_settings();
}

void ChatPage::show_model(const QString& path) {
  model_path_ = path;
  model_button_->setText(path.isEmpty() ? tr("(the loaded model)") : QFileInfo(path).fileName());
  model_button_->setToolTip(path.isEmpty() ? tr("This conversation uses whatever model is loaded")
                                           : path);
  model_reset_->setEnabled(!path.isEmpty());
}

void ChatPage::choose_model_file() {
  const QString path = QFileDialog::getOpenFileName(this, tr("Model for this conversation"),
                                                    QFileInfo(model_path_).absolutePath(),
                                                    tr("GGUF models (*.gguf);;All files (*)"));
  if (path.isEmpty()) return;
  set_model_choice(path);
}

QString ChatPage::mode_choice() const {
  return mode_->currentData().toString();
}

bool ChatPage::set_mode_choice(const QString& mode) {
  const int index = mode_->findData(mode);
  if (index < 0) return false;
  mode_->setCurrentIndex(index);
  return true;
}

// The devices of `c` in order: colocated devices, or prefill devices then decode devices.
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

EngineConfig ChatPage::config_for_mode(const EngineConfig& current, const QString& mode) {
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

bool ChatPage::engine_ready_for(const QString& text) {
  const EngineConfig wanted = config_for_mode(bridge_->config(), mode_choice());
  const bool other_model =
      !model_path_.isEmpty() &&
      QFileInfo(model_path_).canonicalFilePath() !=
          QFileInfo(QString::fromStdString(bridge_->model()->file().name())).canonicalFilePath();
  if (other_model) {
    if (!QFileInfo::exists(model_path_)) {
      show_status(tr("Not sent: this conversation's model %1 does not exist").arg(model_path_));
      return false;
    }
    pending_message_ = text;
    show_status(tr("Loading %1 for this conversation…").arg(QFileInfo(model_path_).fileName()));
    bridge_->load(model_path_, wanted);
    update_buttons();
    return false;
  }
  if (wanted.disaggregated() != bridge_->config().disaggregated()) {
    try {
      bridge_->reconfigure(wanted);
    } catch (const std::exception& e) {
      show_status(QStringLiteral("Not sent: the engine could not switch to %1 mode: %2")
                      .arg(mode_choice(), QString::fromUtf8(e.what())));
      return false;
    }
  }
  return true;
}

void ChatPage::showEvent(QShowEvent* event) {
  refresh_heads();
  Page::showEvent(event);
}

void ChatPage::refresh_heads() {
  choosers_.clear();  // a head of the same name may have been replaced
  const QString shown = head_choice();
  const QSignalBlocker block(head_);
  while (head_->count() > 2) head_->removeItem(2);  // keep "none" and "auto"
  if (bridge_ && bridge_->ready()) {
    try {
      const std::string sha = model_sha256(*bridge_->model());
      const auto db = Database::open_default();
      for (const HeadRecord& h : Registry(*db).heads()) {
        if (h.base_model_sha256 != sha) continue;
        const QString name = from_std(h.name);
        head_->addItem(QStringLiteral("%1 (%2)").arg(name, from_std(h.domain)), name);
      }
    } catch (const std::exception& e) {
      show_status(QStringLiteral("Draft heads could not be listed: %1").arg(e.what()));
    }
  }
  if (!set_head_choice(shown)) set_head_choice(QStringLiteral("none"));
}

int64_t ChatPage::create_conversation(const QString& title) {
  if (!model_) return 0;
  const int64_t id = model_->create(title);
  // The settings shown now become the new conversation's, with the default head when one is set.
  const QString default_head = AppSettings().value(settings_keys::kDefaultHead).toString();
  if (!default_head.isEmpty()) {
    const QSignalBlocker block(head_);
    set_head_choice(default_head);
  }
  store_->set_settings(id, settings_json());
  select_conversation(id);
  return id;
}

void ChatPage::rename_conversation() {
  const int row = model_->row_of(conversation_id_);
  if (row >= 0) list_->edit(model_->index(row));
}

void ChatPage::delete_conversation() {
  if (conversation_id_ == 0) return;
  const auto record = store_->find(conversation_id_);
  if (!record) return;
  if (QMessageBox::question(
          this, tr("Delete conversation"),
          tr("Delete \"%1\" and all its messages?").arg(from_std(record->title))) !=
      QMessageBox::Yes)
    return;
  if (active_ && active_->conversation_id == conversation_id_) stop();
  model_->remove(conversation_id_);
  conversation_id_ = 0;
  shown_.clear();
  if (model_->rowCount() > 0) {
    select_conversation(model_->id_at(0));
  } else {
    render();
    update_buttons();
  }
}

void ChatPage::send_message(const QString& text) {
  if (!store_) return;
  if (active_) {
    show_status(tr("A reply is still being generated; Stop it first."));
    return;
  }
  if (!bridge_ || !bridge_->ready() || !template_) {
    show_status(tr("The model is not loaded yet."));
    return;
  }
  if (conversation_id_ == 0) create_conversation(text.simplified().left(48));
  if (!engine_ready_for(text)) return;
  std::vector<ChatMessage> history;
  for (const MessageView& m : shown_)
    history.push_back({m.role.toStdString(), m.content.toStdString()});
  history.push_back({"user", text.toStdString()});

  GenerationRequest request;
  const Tokenizer& tokenizer = *bridge_->tokenizer();
  request.prompt =
      tokenizer.encode(template_->apply(history, true), tokenizer.add_bos_token(), true);
  request.max_tokens = max_tokens_->value();
  request.sampling = SamplingParams{};
  request.sampling.temperature = static_cast<float>(temperature_->value());
  request.sampling.top_k = top_k_->value();
  request.sampling.top_p = static_cast<float>(top_p_->value());
  request.sampling.min_p = static_cast<float>(min_p_->value());
  request.sampling.seed = QRandomGenerator::global()->generate64();
  RequestId id = 0;
  try {
    const QString choice = head_choice();
    auto& chooser = choosers_[choice];
    if (!chooser) {
      HeadOptions options;
      options.head = choice.toStdString();
      chooser = std::make_unique<HeadChooser>(options, *bridge_->model(), tokenizer);
    }
    request.head = chooser->choose(request.prompt);
    id = bridge_->submit(std::move(request));
  } catch (const std::exception& e) {
    show_status(QStringLiteral("Not sent: %1").arg(e.what()));
    return;
  }
  store_->add_message(
      {.conversation_id = conversation_id_, .role = "user", .content = text.toStdString()});
  shown_.push_back(message_view(QStringLiteral("user"), text));
  active_.emplace();
  active_->id = id;
  active_->conversation_id = conversation_id_;
  active_->view = message_view(QStringLiteral("assistant"), QString());
  active_->view.streaming = true;
  active_->detokenizer = std::make_unique<IncrementalDetokenizer>(tokenizer);
  show_status(tr("Generating…"));
  render();
  update_buttons();
}

void ChatPage::stop() {
  if (active_ && bridge_) bridge_->cancel(active_->id);
}

void ChatPage::on_streamed(const QVector<StreamUpdate>& updates) {
  if (!active_ || !bridge_) return;
  for (const StreamUpdate& u : updates) {
    if (u.id != active_->id) continue;
    // Detokenized here token by token (not from u.text) so each character knows whether its
    // token was drafted.
    const Tokenizer& tokenizer = *bridge_->tokenizer();
    for (size_t i = 0; i < u.tokens.size(); ++i) {
      ++active_->tokens;
      const bool drafted = i < u.drafted.size() && u.drafted[i];
      active_->drafted_tokens += drafted ? 1 : 0;
      if (tokenizer.is_end_of_generation(u.tokens[i])) continue;
      const QString piece = QString::fromStdString(active_->detokenizer->push(u.tokens[i]));
      active_->view.content += piece;
      active_->view.drafted.insert(active_->view.drafted.end(), piece.size(), drafted);
    }
    if (u.ended()) {
      finish_reply(u);
      return;
    }
  }
  if (active_->conversation_id == conversation_id_) render();
}

void ChatPage::finish_reply(const StreamUpdate& last) {
  const QString tail = QString::fromStdString(active_->detokenizer->flush());
  active_->view.content += tail;
  active_->view.drafted.insert(active_->view.drafted.end(), tail.size(), false);
  nlohmann::json stats = {{"state", request_state_name(last.state)},
                          {"tokens", active_->tokens},
                          {"drafted_tokens", active_->drafted_tokens}};
  try {
    // No engine while the bridge replaces it (its last events are drained then).
    const Engine* engine = bridge_ ? bridge_->engine() : nullptr;
    if (!engine) throw Error("no engine");
    const RequestInfo info = engine->request(active_->id);
    stats["prompt_tokens"] = info.n_prompt;
    stats["cached_prompt_tokens"] = info.cached_prompt_tokens;
    stats["device"] = info.decode_device.empty() ? info.prefill_device : info.decode_device;
    if (!info.head.empty()) stats["head"] = info.head;
    if (info.metrics) {
      if (info.metrics->ttft_s) stats["ttft_ms"] = *info.metrics->ttft_s * 1e3;
      if (info.metrics->tpot_s && *info.metrics->tpot_s > 0)
        stats["decode_tok_s"] = 1.0 / *info.metrics->tpot_s;
      if (const auto accept = info.metrics->accept_per_step()) stats["accept_per_step"] = *accept;
      stats["steps"] = info.metrics->tokens_per_step.size();
    }
  } catch (const std::exception&) {
    // The engine was replaced meanwhile: the streamed figures are all there is.
  }
  const RequestId id = active_->id;
  const int tokens = active_->tokens;
  const QString state = QString::fromLatin1(request_state_name(last.state));
  if (last.state == RequestState::kFailed)
    show_status(QStringLiteral("The reply failed: %1").arg(last.error));
  else
    show_status(QString());
  try {
    save_reply(state, stats.dump());
  } catch (const std::exception& e) {
    show_status(QStringLiteral("The reply could not be saved: %1").arg(e.what()));
  }
  active_.reset();
  render();
  update_buttons();
  emit replyEnded(static_cast<qint64>(id), tokens, state);
}

void ChatPage::save_reply(const QString& state, const std::string& stats_json) {
  ActiveReply& reply = *active_;
  reply.view.streaming = false;
  reply.view.stats = stats_line(stats_json);
  if (reply.view.content.isEmpty() && state == QLatin1String("failed")) return;
  store_->add_message({.conversation_id = reply.conversation_id,
                       .role = "assistant",
                       .content = reply.view.content.toStdString(),
                       .stats_json = stats_json});
  if (reply.conversation_id == conversation_id_) shown_.push_back(reply.view);
  if (model_) {
    const int64_t current = conversation_id_;
    model_->reload();  // the conversation moved to the top
    if (const int row = model_->row_of(current); row >= 0) {
      const QSignalBlocker block(list_->selectionModel());
      list_->setCurrentIndex(model_->index(row));
    }
  }
}

void ChatPage::render() {
  QScrollBar* bar = messages_->verticalScrollBar();
  const bool at_bottom = bar->value() >= bar->maximum() - 4;
  const int old_value = bar->value();
  QString html;
  const bool colour = colour_drafted_->isChecked();
  for (const MessageView& m : shown_) html += message_html(m, colour);
  if (active_ && active_->conversation_id == conversation_id_)
    html += message_html(active_->view, colour);
  messages_->setHtml(html);
  bar->setValue(at_bottom ? bar->maximum() : old_value);
}

void ChatPage::update_buttons() {
  const bool have_db = store_ != nullptr;
  const bool ready = bridge_ && bridge_->ready() && template_.has_value();
  send_button_->setEnabled(have_db && ready && !active_);
  stop_button_->setEnabled(active_.has_value());
  rename_button_->setEnabled(have_db && conversation_id_ != 0);
  delete_button_->setEnabled(have_db && conversation_id_ != 0);
}

void ChatPage::show_status(const QString& text) {
  status_->setText(text);
}

}  // namespace tokenfab::ui
