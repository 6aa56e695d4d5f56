#include "ui/views/chat_page.h"

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
#include <QSplitter>
#include <QTextBrowser>
#include <QVBoxLayout>
#include <exception>
#include <optional>

#include <nlohmann/json.hpp>

#include "core/common/error.h"
#include "core/storage/registry.h"
#include "ui/models/conversation_list_model.h"
#include "ui/views/app_settings.h"
#include "ui/views/chat_settings_bar.h"

namespace tokenfab::ui {

namespace {

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

// One line of figures for an assistant message, from its stats_json. A field of another type
// than this build writes (a database edited by hand, or damaged) is left out, not thrown on.
QString stats_line(const std::string& stats_json) {
  const nlohmann::json j = nlohmann::json::parse(stats_json, nullptr, false);
  if (!j.is_object() || j.empty()) return {};
  const auto number = [&](const char* key) -> std::optional<double> {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_number()) return std::nullopt;
    return it->get<double>();
  };
  QStringList parts;
  if (const auto v = number("ttft_ms")) parts << QStringLiteral("TTFT %1 ms").arg(*v, 0, 'f', 0);
  if (const auto v = number("decode_tok_s")) parts << QStringLiteral("%1 tok/s").arg(*v, 0, 'f', 1);
  if (const auto it = j.find("tokens"); it != j.end() && it->is_number_integer())
    parts << QStringLiteral("%1 tokens").arg(it->get<int64_t>());
  if (const auto v = number("accept_per_step"))
    parts << QStringLiteral("ACCEPT/STEP %1").arg(*v, 0, 'f', 2);
  const auto draft = number("draft_ms_per_step");
  const auto verify = number("verify_ms_per_step");
  if (draft && verify)
    parts << QStringLiteral("draft %1 + verify %2 ms a step")
                 .arg(*draft, 0, 'f', 2)
                 .arg(*verify, 0, 'f', 2);
  if (const auto it = j.find("state");
      it != j.end() && it->is_string() && it->get<std::string>() != "finished") {
    // A saved reply still "generating" is one the app stopped running during (a crash, a kill):
    // the reply in flight itself is never shown from its saved row.
    const std::string state = it->get<std::string>();
    parts << (state == "generating" ? QStringLiteral("interrupted") : from_std(state));
  }
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

  settings_ = new ChatSettingsBar;

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
  right_layout->addWidget(settings_);
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
  connect(settings_, &ChatSettingsBar::colourToggled, this, &ChatPage::render);
  connect(settings_, &ChatSettingsBar::changed, this, &ChatPage::save_settings);
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
  // The choosers refer to the model the bridge is about to drop.
  connect(bridge, &EngineBridge::loadStarted, this, [this] { choosers_.clear(); });
  if (bridge->ready()) on_loaded();
  connect(bridge, &EngineBridge::loadCancelled, this, [this] {
    show_status(tr("No model: loading was cancelled"));
    if (!pending_message_.isEmpty() && input_->toPlainText().isEmpty())
      input_->setPlainText(pending_message_);  // the message that waited is not lost
    pending_message_.clear();
    update_buttons();
  });
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
    if (active_ && m.id == active_->message_id) continue;  // shown as it streams
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
  settings_->load(record ? record->settings_json : std::string("{}"));
}

void ChatPage::save_settings() {
  if (!store_ || conversation_id_ == 0) return;
  store_->set_settings(conversation_id_, settings_->to_json());
}

bool ChatPage::engine_ready_for(const QString& text) {
  const QString model = settings_->model_choice();
  const EngineConfig wanted =
      ChatSettingsBar::config_for_mode(bridge_->config(), settings_->mode_choice());
  const bool other_model =
      !model.isEmpty() &&
      QFileInfo(model).canonicalFilePath() !=
          QFileInfo(QString::fromStdString(bridge_->model()->file().name())).canonicalFilePath();
  if (other_model) {
    if (!QFileInfo::exists(model)) {
      show_status(tr("Not sent: this conversation's model %1 does not exist").arg(model));
      return false;
    }
    pending_message_ = text;
    show_status(tr("Loading %1 for this conversation…").arg(QFileInfo(model).fileName()));
    bridge_->load(model, wanted);
    update_buttons();
    return false;
  }
  if (wanted.disaggregated() != bridge_->config().disaggregated()) {
    try {
      bridge_->reconfigure(wanted);
    } catch (const std::exception& e) {
      show_status(QStringLiteral("Not sent: the engine could not switch to %1 mode: %2")
                      .arg(settings_->mode_choice(), QString::fromUtf8(e.what())));
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
  choosers_.clear();                               // a head of the same name may have been replaced
  std::vector<std::pair<QString, QString>> heads;  // name, label
  if (bridge_ && bridge_->ready()) {
    try {
      const std::string sha = model_sha256(*bridge_->model());
      const auto db = Database::open_default();
      for (const HeadRecord& h : Registry(*db).heads()) {
        if (h.base_model_sha256 != sha) continue;
        const QString name = from_std(h.name);
        heads.emplace_back(name, QStringLiteral("%1 (%2)").arg(name, from_std(h.domain)));
      }
    } catch (const std::exception& e) {
      show_status(QStringLiteral("Draft heads could not be listed: %1").arg(e.what()));
    }
  }
  settings_->set_heads(heads);
}

int64_t ChatPage::create_conversation(const QString& title) {
  if (!model_) return 0;
  const int64_t id = model_->create(title);
  // The settings shown now become the new conversation's, with the default head when one is set.
  const QString default_head = AppSettings().value(settings_keys::kDefaultHead).toString();
  if (!default_head.isEmpty()) {
    const QSignalBlocker block(settings_);  // not a change of the conversation shown before
    settings_->set_head_choice(default_head);
  }
  store_->set_settings(id, settings_->to_json());
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
  // A message that is not sent goes back to the input box (unless something new is typed there).
  const auto keep_unsent = [&] {
    if (input_->toPlainText().isEmpty()) input_->setPlainText(text);
  };
  if (active_) {
    show_status(tr("A reply is still being generated; Stop it first."));
    return keep_unsent();
  }
  if (!bridge_ || !bridge_->ready() || !template_) {
    show_status(tr("The model is not loaded yet."));
    return keep_unsent();
  }
  if (conversation_id_ == 0) create_conversation(text.simplified().left(48));
  if (!engine_ready_for(text)) return;
  std::vector<ChatMessage> history;
  for (const MessageView& m : shown_)
    history.push_back({m.role.toStdString(), m.content.toStdString()});
  history.push_back({"user", text.toStdString()});

  const Tokenizer& tokenizer = *bridge_->tokenizer();
  GenerationRequest request;
  request.max_tokens = settings_->max_tokens();
  const int64_t limit = bridge_->config().context_limit(bridge_->model()->hparams());
  const FittedPrompt fit =
      fit_chat_prompt(tokenizer, *template_, history, request.max_tokens, limit);
  request.prompt = fit.tokens;
  request.sampling = settings_->sampling();
  request.sampling.seed = QRandomGenerator::global()->generate64();
  RequestId id = 0;
  try {
    const QString choice = settings_->head_choice();
    auto& chooser = choosers_[choice];
    if (!chooser) {
      HeadOptions options;
      options.head = choice.toStdString();
      chooser = std::make_unique<HeadChooser>(options, *bridge_->model(), tokenizer);
    }
    HeadChoice picked = chooser->choose(request.prompt);
    request.head = std::move(picked.head);
    request.head_candidates = std::move(picked.candidates);
    // Each step's draft length from measured costs and acceptance, so a head never slows the
    // reply down on a machine where drafting does not pay.
    request.adaptive_draft = true;
    if (settings_->context_lookup()) request.lookup = ChatSettingsBar::kLookup;
    id = bridge_->submit(std::move(request));
  } catch (const std::exception& e) {
    show_status(QStringLiteral("Not sent: %1").arg(e.what()));
    return keep_unsent();
  }
  store_->add_message(
      {.conversation_id = conversation_id_, .role = "user", .content = text.toStdString()});
  shown_.push_back(message_view(QStringLiteral("user"), text));
  active_.emplace();
  active_->id = id;
  active_->conversation_id = conversation_id_;
  active_->view = message_view(QStringLiteral("assistant"), QString());
  active_->view.streaming = true;
  active_->saved = std::chrono::steady_clock::now();
  active_->detokenizer = std::make_unique<IncrementalDetokenizer>(tokenizer);
  if (fit.left_out > 0)
    active_->note = (fit.left_out == 1 ? tr("The oldest message was")
                                       : tr("The %1 oldest messages were").arg(fit.left_out)) +
                    tr(" left out of the prompt to fit the model's context of %1 tokens (the "
                       "conversation keeps it all).")
                        .arg(limit);
  show_status(active_->note.isEmpty() ? tr("Generating…")
                                      : tr("Generating… %1").arg(active_->note));
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
  save_partial_reply();
  if (active_->conversation_id == conversation_id_) render();
}

void ChatPage::save_partial_reply() {
  ActiveReply& reply = *active_;
  const auto now = std::chrono::steady_clock::now();
  // The first text is saved at once (a crash then leaves a reply to mark interrupted), the rest
  // about once a second.
  if (reply.view.content.isEmpty() ||
      (reply.message_id != 0 && now - reply.saved < std::chrono::milliseconds(kSaveEveryMs)))
    return;
  reply.saved = now;
  const std::string stats =
      nlohmann::json{{"state", "generating"}, {"tokens", reply.tokens}}.dump();
  try {
    if (reply.message_id == 0) {
      reply.message_id = store_->add_message({.conversation_id = reply.conversation_id,
                                              .role = "assistant",
                                              .content = reply.view.content.toStdString(),
                                              .stats_json = stats});
    } else {
      store_->update_message(reply.message_id, reply.view.content.toStdString(), stats);
    }
  } catch (const std::exception& e) {
    show_status(QStringLiteral("The reply so far could not be saved: %1").arg(e.what()));
  }
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
    // Per step that verified drafts: the time proposing them and the step's own.
    if (const int64_t steps = info.speculation.verify_steps; steps > 0) {
      stats["draft_ms_per_step"] = info.speculation.draft_s * 1e3 / static_cast<double>(steps);
      stats["verify_ms_per_step"] = info.speculation.verify_s * 1e3 / static_cast<double>(steps);
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
    show_status(active_->note);
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
  if (reply.message_id != 0) {
    store_->update_message(reply.message_id, reply.view.content.toStdString(), stats_json);
  } else {
    if (reply.view.content.isEmpty() && state == QLatin1String("failed")) return;
    store_->add_message({.conversation_id = reply.conversation_id,
                         .role = "assistant",
                         .content = reply.view.content.toStdString(),
                         .stats_json = stats_json});
  }
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
  const bool colour = settings_->colour_drafted();
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
