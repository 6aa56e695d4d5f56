#pragma once
// ChatPage: conversations persisted in SQLite (create, rename, delete, search), the reply
// streaming as the engine emits it, Stop, sampling settings, the draft head (none, auto or a
// registered head of the loaded model), the model and the device mode per conversation (a
// conversation that names another model or mode loads it / reconfigures the engine when it
// sends; until then the engine keeps what it runs), and under each
// assistant message the figures the engine measured for it (TTFT, tok/s, tokens, ACCEPT/STEP).
// The prompt is the whole conversation in the model's chat template; the engine's prefix cache
// makes earlier turns cheap; a conversation longer than the model's context leaves its oldest
// messages out of the prompt (never out of the conversation) and says so. A reply is saved as
// it streams (about once a second, from its first second on), so a crash or a killed app loses
// at most the last second of it; such a reply shows as interrupted when the conversation is
// opened again.

#include <QPointer>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "core/storage/conversations.h"
#include "core/tokenizer/chat_template.h"
#include "core/training/head_selection.h"
#include "ui/bridge/engine_bridge.h"
#include "ui/views/chat_settings_bar.h"
#include "ui/views/message_html.h"
#include "ui/views/page.h"

class QLabel;
class QLineEdit;
class QListView;
class QPlainTextEdit;
class QPushButton;
class QTextBrowser;

namespace tokenfab::ui {

class ConversationListModel;

class ChatPage : public Page {
  Q_OBJECT

 public:
  explicit ChatPage(QWidget* parent = nullptr);
  ~ChatPage() override;  // cancels a reply in flight and saves what it produced

  QString title() const override { return QStringLiteral("Chat"); }
  void attach(EngineBridge* bridge) override;

  // What Send does with the input box (also for --screenshot and tests): appends the user message
  // to the current conversation (a new one when none is selected) and starts the reply.
  void send_message(const QString& text);
  void stop();  // cancels the reply in flight
  // Creates a conversation with the settings shown now and selects it; returns its id.
  int64_t create_conversation(const QString& title);
  void select_conversation(int64_t id);

  bool generating() const { return active_.has_value(); }
  RequestId active_request() const { return active_ ? active_->id : 0; }
  int64_t current_conversation() const { return conversation_id_; }
  ConversationListModel* conversation_model() const { return model_.get(); }
  Database* database() const { return db_.get(); }
  // The conversation's settings (ChatSettingsBar): head "none" / "auto" / a registered head's
  // name, model file ("": the loaded one), device mode ("", "colocated", "disaggregated"); each
  // setter shows the value and saves it with the conversation (false: not offered).
  QString head_choice() const { return settings_->head_choice(); }
  bool set_head_choice(const QString& choice) { return settings_->set_head_choice(choice); }
  QString model_choice() const { return settings_->model_choice(); }
  void set_model_choice(const QString& path) { settings_->set_model_choice(path); }
  QString mode_choice() const { return settings_->mode_choice(); }
  bool set_mode_choice(const QString& mode) { return settings_->set_mode_choice(mode); }
  // Reloads the picker's heads from the registry (those made for the loaded model).
  void refresh_heads();

 protected:
  void showEvent(QShowEvent* event) override;  // heads may have been trained or deleted meanwhile

 signals:
  // The reply ended (finished, cancelled or failed); `tokens` counts every token streamed for it.
  void replyEnded(qint64 request_id, int tokens, const QString& state);

 private:
  static constexpr int kSaveEveryMs = 1000;  // a streaming reply's saves

  struct ActiveReply {
    RequestId id = 0;
    int64_t conversation_id = 0;
    int64_t message_id = 0;  // its row once first saved while streaming; 0 before
    QString note;            // what the status keeps saying about it (messages left out)
    std::chrono::steady_clock::time_point saved;  // the send, then the last save
    MessageView view;
    int tokens = 0;
    int drafted_tokens = 0;
    std::unique_ptr<IncrementalDetokenizer> detokenizer;
  };

  void build_ui();
  void on_streamed(const QVector<StreamUpdate>& updates);
  void finish_reply(const StreamUpdate& last);
  void save_reply(const QString& state, const std::string& stats_json);
  // Writes the reply so far (state "generating") when kSaveEveryMs have passed since the last save.
  void save_partial_reply();
  void render();
  void load_settings();
  void save_settings();
  // Loads the conversation's model or switches the engine's mode when they differ from what runs;
  // true when the message can be sent now (false: it waits for the load, or failed).
  bool engine_ready_for(const QString& text);
  void rename_conversation();
  void delete_conversation();
  void update_buttons();
  void show_status(const QString& text);

  QPointer<EngineBridge> bridge_;
  std::unique_ptr<Database> db_;
  std::unique_ptr<Conversations> store_;
  std::unique_ptr<ConversationListModel> model_;
  std::optional<ChatTemplate> template_;
  int64_t conversation_id_ = 0;
  std::vector<MessageView> shown_;  // the current conversation's saved messages
  std::optional<ActiveReply> active_;
  // One chooser per head choice, made on first use (auto fits its classifier then); cleared when
  // another model loads.
  std::map<QString, std::unique_ptr<HeadChooser>> choosers_;

  QLineEdit* search_ = nullptr;
  QListView* list_ = nullptr;
  QPushButton* new_button_ = nullptr;
  QPushButton* rename_button_ = nullptr;
  QPushButton* delete_button_ = nullptr;
  ChatSettingsBar* settings_ = nullptr;
  // A message waiting for the conversation's model to load (sent on loaded(); put back in the
  // input box if the load fails, so nothing is lost).
  QString pending_message_;
  QTextBrowser* messages_ = nullptr;
  QPlainTextEdit* input_ = nullptr;
  QPushButton* send_button_ = nullptr;
  QPushButton* stop_button_ = nullptr;
  QLabel* status_ = nullptr;
};

}  // namespace tokenfab::ui
