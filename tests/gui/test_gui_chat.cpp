// The Chat page (ui/views/chat_page.h) on the offscreen platform with the real default model:
// a reply streams through the bridge with exactly the tokens the engine generated, is saved with
// its figures, the conversation list model passes QAbstractItemModelTester, and closing the
// window (or losing the bridge) mid-reply is clean and keeps what was generated.
// TOKENFAB_HOME points at a temporary directory before anything opens the database.

#include <QAbstractItemModelTester>
#include <QCheckBox>
#include <QLabel>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QRegularExpression>
#include <QStatusBar>
#include <QTextBrowser>
#include <QtTest>
#include <filesystem>
#include <memory>

#include <nlohmann/json.hpp>

#include "core/model/model_files.h"
#include "core/storage/conversations.h"
#include "core/storage/database.h"
#include "tests/common/default_model.h"
#include "ui/bridge/engine_bridge.h"
#include "ui/models/conversation_list_model.h"
#include "ui/views/app_settings.h"
#include "ui/views/chat_page.h"
#include "ui/views/chat_settings_bar.h"
#include "ui/views/main_window.h"

using namespace tokenfab;
using namespace tokenfab::ui;

namespace {

constexpr int kLoadTimeoutMs = 120'000;
constexpr int kReplyTimeoutMs = 300'000;

EngineConfig test_config() {
  EngineConfig config;
  config.threads = 2;
  return config;
}

}  // namespace

class GuiChatTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void page_constructs();
  void conversation_model_passes_tester();
  void reply_streams_and_is_saved();
  void head_choice_is_kept_per_conversation_and_defaults_from_settings();
  void model_and_device_mode_per_conversation();
  void context_lookup_is_saved_and_greedy_only();
  void drafted_reply_shows_draft_and_verify_time();
  void damaged_saved_fields_are_left_out();
  void long_reply_is_saved_as_it_streams();
  void unsent_message_stays_in_the_input();
  void long_conversation_leaves_oldest_messages_out_of_the_prompt();
  void cancelled_load_leaves_no_model_and_the_next_load_works();
  void closing_window_mid_reply_is_clean();
  void losing_bridge_mid_reply_is_clean();

 private:
  // A bridge with the default model loaded (QVERIFY inside: check QTest::currentTestFailed()).
  std::unique_ptr<EngineBridge> loaded_bridge(const EngineConfig& config = test_config());
  // A loaded bridge and a shown window with a chat page (QVERIFY inside, as loaded_bridge).
  struct ChatWindow {
    std::unique_ptr<EngineBridge> bridge;
    std::unique_ptr<MainWindow> window;  // destroyed first
    ChatPage* page = nullptr;            // owned by the window
  };
  ChatWindow open_chat(const EngineConfig& config = test_config());
  // Starts a long reply in `page` and waits until its first tokens arrived.
  void start_long_reply(EngineBridge& bridge, ChatPage& page);

  QTemporaryDir home_;
  QString model_path_;
};

void GuiChatTest::initTestCase() {
  TOKENFAB_DEFAULT_MODEL_WITH_HOME(model_path_, home_);
}

std::unique_ptr<EngineBridge> GuiChatTest::loaded_bridge(const EngineConfig& config) {
  auto bridge = std::make_unique<EngineBridge>();
  QSignalSpy loaded(bridge.get(), &EngineBridge::loaded);
  QSignalSpy failed(bridge.get(), &EngineBridge::failed);
  bridge->load(model_path_, config);
  [&] { QTRY_VERIFY_WITH_TIMEOUT(loaded.count() + failed.count() > 0, kLoadTimeoutMs); }();
  if (!failed.isEmpty()) qWarning() << "load failed:" << failed.first().first().toString();
  [&] { QVERIFY(bridge->ready()); }();
  return bridge;
}

void GuiChatTest::page_constructs() {
  ChatPage page;
  QCOMPARE(page.title(), QString("Chat"));
  QVERIFY(page.database() != nullptr);
  QVERIFY(page.conversation_model() != nullptr);
  QCOMPARE(std::filesystem::path(page.database()->path()).parent_path(),
           std::filesystem::path(home_.path().toStdString()));
  QVERIFY(!page.generating());
  page.send_message("no bridge yet");  // refused, not crashed
  QVERIFY(!page.generating());
}

void GuiChatTest::conversation_model_passes_tester() {
  auto db = Database::open_default();
  ConversationListModel model(*db);
  QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
  const int before = model.rowCount();
  const int64_t a = model.create("alpha rivers");
  const int64_t b = model.create("beta lakes");
  QCOMPARE(model.rowCount(), before + 2);
  QCOMPARE(model.id_at(0), b);  // newest first
  QVERIFY(model.rename(a, "alpha streams"));
  QCOMPARE(model.data(model.index(model.row_of(a))).toString(), QString("alpha streams"));
  QVERIFY(model.setData(model.index(model.row_of(b)), "beta ponds"));
  QVERIFY(!model.setData(model.index(model.row_of(b)), "   "));  // an empty title is refused
  QCOMPARE(model.data(model.index(model.row_of(b)), ConversationListModel::kIdRole).toLongLong(),
           b);
  model.set_filter("streams");
  QCOMPARE(model.rowCount(), 1);
  QCOMPARE(model.id_at(0), a);
  model.set_filter("");
  QVERIFY(model.remove(a));
  QVERIFY(!model.remove(a));
  QCOMPARE(model.row_of(a), -1);
  QVERIFY(model.remove(b));
  QCOMPARE(model.rowCount(), before);
}

// The draft-head picker offers none and auto (no head is registered in this home); the choice is
// saved with the conversation, and a new conversation starts with the default from the settings
// file, which lives in TOKENFAB_HOME.
void GuiChatTest::head_choice_is_kept_per_conversation_and_defaults_from_settings() {
  QCOMPARE(std::filesystem::path(settings_file().toStdString()).parent_path(),
           std::filesystem::path(home_.path().toStdString()));
  ChatPage page;
  const int64_t a = page.create_conversation("head a");
  QCOMPARE(page.head_choice(), QString("none"));
  QVERIFY(page.set_head_choice("auto"));
  QVERIFY(!page.set_head_choice("no-such-head"));
  QCOMPARE(page.head_choice(), QString("auto"));
  const int64_t b = page.create_conversation("head b");  // the shown settings carry over
  QVERIFY(page.set_head_choice("none"));
  page.select_conversation(a);
  QCOMPARE(page.head_choice(), QString("auto"));
  page.select_conversation(b);
  QCOMPARE(page.head_choice(), QString("none"));

  AppSettings().setValue(settings_keys::kDefaultHead, "auto");
  page.create_conversation("head c");
  QCOMPARE(page.head_choice(), QString("auto"));
  AppSettings().remove(settings_keys::kDefaultHead);
}

// A conversation set to disaggregated switches the engine's mode when it sends; one naming another
// model file (the same model copied under another name) loads it first, the message waiting for
// the load; each conversation keeps its choices.
void GuiChatTest::model_and_device_mode_per_conversation() {
  auto bridge = loaded_bridge();
  if (QTest::currentTestFailed()) return;
  MainWindow window(bridge.get());
  auto* page = new ChatPage;
  window.add_page(page);
  QSignalSpy ended(page, &ChatPage::replyEnded);
  const int64_t a = page->create_conversation("disaggregated chat");
  QVERIFY(page->set_mode_choice("disaggregated"));
  QVERIFY(!bridge->config().disaggregated());
  page->send_message("Say hello.");
  QVERIFY(bridge->config().disaggregated());
  QTRY_VERIFY_WITH_TIMEOUT(ended.count() == 1, kReplyTimeoutMs);
  QCOMPARE(ended.first().at(2).toString(), QString("finished"));

  const QString copy = home_.filePath("copy.gguf");
  QVERIFY(QFile::copy(model_path_, copy));
  const int64_t b = page->create_conversation("copied model");
  page->set_model_choice(copy);
  QVERIFY(page->set_mode_choice("colocated"));
  QSignalSpy loaded(bridge.get(), &EngineBridge::loaded);
  page->send_message("Say hello again.");
  QVERIFY(!page->generating());  // waiting for the load
  QTRY_VERIFY_WITH_TIMEOUT(ended.count() == 2, kLoadTimeoutMs + kReplyTimeoutMs);
  QCOMPARE(loaded.count(), 1);
  QCOMPARE(QFileInfo(QString::fromStdString(bridge->model()->file().name())).fileName(),
           QString("copy.gguf"));
  QVERIFY(!bridge->config().disaggregated());

  page->select_conversation(a);
  QCOMPARE(page->mode_choice(), QString("disaggregated"));
  QVERIFY(page->model_choice().isEmpty());
  page->select_conversation(b);
  QCOMPARE(page->model_choice(), copy);
  QCOMPARE(page->mode_choice(), QString("colocated"));
  // New conversations start from the shown settings: leave none naming the copy behind.
  QVERIFY(page->conversation_model()->remove(a));
  QVERIFY(page->conversation_model()->remove(b));
}

// Cancel while the model loads: loadCancelled at once, the status bar says so, and the loader's
// result, when it arrives, is dropped; a later load works.
// The "Copy from context" box is part of the saved settings, and asks for context lookup drafts
// only for greedy replies: at a temperature above 0 it is disabled and asks for nothing.
void GuiChatTest::context_lookup_is_saved_and_greedy_only() {
  ChatSettingsBar bar;
  QVERIFY(!bar.context_lookup());  // off by default
  bar.load(R"({"temperature": 0, "lookup": true})");
  QVERIFY(bar.context_lookup());
  const auto lookup_box = [](const ChatSettingsBar& b) -> QCheckBox* {
    for (QCheckBox* c : b.findChildren<QCheckBox*>())
      if (c->text() == "Copy from context") return c;
    return nullptr;
  };
  QSignalSpy changed(&bar, &ChatSettingsBar::changed);
  QCheckBox* box = lookup_box(bar);
  QVERIFY(box);
  QVERIFY(box->isEnabled());
  box->setChecked(false);
  QCOMPARE(changed.count(), 1);
  QCOMPARE(nlohmann::json::parse(bar.to_json()).at("lookup").get<bool>(), false);
  box->setChecked(true);
  ChatSettingsBar copy;
  copy.load(bar.to_json());
  QVERIFY(copy.context_lookup());
  // Sampling: the box stays ticked (the choice is kept) but is disabled and asks for nothing.
  copy.load(R"({"temperature": 0.7, "lookup": true})");
  QVERIFY(!copy.context_lookup());
  QVERIFY(!lookup_box(copy)->isEnabled());
  QCOMPARE(nlohmann::json::parse(copy.to_json()).at("lookup").get<bool>(), true);
}

void GuiChatTest::cancelled_load_leaves_no_model_and_the_next_load_works() {
  EngineBridge bridge;
  MainWindow window(&bridge);
  QSignalSpy started(&bridge, &EngineBridge::loadStarted);
  QSignalSpy cancelled(&bridge, &EngineBridge::loadCancelled);
  QSignalSpy loaded(&bridge, &EngineBridge::loaded);
  bridge.load(model_path_, test_config());
  QCOMPARE(started.count(), 1);
  QVERIFY(bridge.loading());
  bridge.cancel_load();
  QCOMPARE(cancelled.count(), 1);
  QVERIFY(!bridge.loading());
  QTest::qWait(3000);  // long enough for the loader to finish here; its result is dropped
  QCOMPARE(loaded.count(), 0);
  QVERIFY(!bridge.ready());
  bridge.load(model_path_, test_config());
  QTRY_VERIFY_WITH_TIMEOUT(loaded.count() == 1, kLoadTimeoutMs);
  QVERIFY(bridge.ready());
}

void GuiChatTest::reply_streams_and_is_saved() {
  ChatWindow chat = open_chat();
  if (QTest::currentTestFailed()) return;
  EngineBridge* bridge = chat.bridge.get();
  ChatPage* page = chat.page;

  int streamed_tokens = 0;
  int streamed_updates = 0;
  QString streamed_text;
  RequestId watched = 0;  // set right after send: updates come from the GUI-thread timer, later
  connect(bridge, &EngineBridge::streamed, this, [&](const QVector<StreamUpdate>& updates) {
    for (const StreamUpdate& u : updates) {
      if (u.id != watched) continue;
      streamed_tokens += static_cast<int>(u.tokens.size());
      streamed_text += u.text;
      ++streamed_updates;
    }
  });
  QSignalSpy ended(page, &ChatPage::replyEnded);
  const QString question = "Write a haiku about rivers.";
  page->send_message(question);
  QVERIFY(page->generating());
  const RequestId id = page->active_request();
  watched = id;
  const int64_t conversation = page->current_conversation();
  QVERIFY(conversation != 0);
  QVERIFY(ended.wait(kReplyTimeoutMs) || !ended.isEmpty());
  QCOMPARE(ended.first().at(0).toLongLong(), static_cast<qint64>(id));
  QCOMPARE(ended.first().at(2).toString(), QString("finished"));

  const RequestInfo info = bridge->engine()->request(id);
  QVERIFY(!info.output.empty());
  QCOMPARE(ended.first().at(1).toInt(), static_cast<int>(info.output.size()));
  QCOMPARE(streamed_tokens, static_cast<int>(info.output.size()));
  QVERIFY(streamed_updates >= 1);
  QVERIFY(!page->generating());

  // Saved: reload the conversation from the database.
  auto db = Database::open_default();
  Conversations store(*db);
  const auto messages = store.messages(conversation);
  QCOMPARE(messages.size(), size_t(2));
  QCOMPARE(messages[0].role, std::string("user"));
  QCOMPARE(QString::fromStdString(messages[0].content), question);
  QCOMPARE(messages[1].role, std::string("assistant"));
  QVERIFY(!messages[1].content.empty());
  QCOMPARE(QString::fromStdString(messages[1].content), streamed_text);
  const auto stats = nlohmann::json::parse(messages[1].stats_json);
  QCOMPARE(stats.at("tokens").get<int64_t>(), static_cast<int64_t>(info.output.size()));
  QCOMPARE(stats.at("state").get<std::string>(), std::string("finished"));
  QVERIFY(stats.at("ttft_ms").get<double>() > 0);
  QCOMPARE(stats.at("accept_per_step").get<double>(), *info.metrics->accept_per_step());

  // The status bar names the model and each device's role, from the bridge's snapshots.
  QTRY_VERIFY_WITH_TIMEOUT(bridge->last_snapshot() != nullptr, 5'000);
  QTest::qWait(2 * 1000 / EngineBridge::kSnapshotHz);
  QStringList status;
  for (const QLabel* label : chat.window->statusBar()->findChildren<QLabel*>())
    status << label->text();
  const QString shown = status.join(" | ");
  QVERIFY2(shown.contains("SmolLM2-135M-Instruct"), qPrintable(shown));
  QVERIFY2(shown.contains("cpu:0: colocated"), qPrintable(shown));
  QVERIFY2(shown.contains("tok/s"), qPrintable(shown));

  // A second turn goes into the same conversation, with the first as history.
  ended.clear();
  page->send_message("Another one, please.");
  QVERIFY(ended.wait(kReplyTimeoutMs) || !ended.isEmpty());
  QCOMPARE(store.messages(conversation).size(), size_t(4));
  const RequestInfo second =
      bridge->engine()->request(static_cast<RequestId>(ended.first().at(0).toLongLong()));
  QVERIFY(second.n_prompt > info.n_prompt);  // the history is in the prompt
  QVERIFY(second.cached_prompt_tokens > 0);  // ... and came from the prefix cache
}

// A greedy reply with context lookup drafts (a conversation saved with "Copy from context"): its
// saved figures and its stats line give the time per verifying step, proposing (0 for copied
// drafts) and verifying, from the request's totals.
void GuiChatTest::drafted_reply_shows_draft_and_verify_time() {
  ChatWindow chat = open_chat();
  if (QTest::currentTestFailed()) return;
  EngineBridge* bridge = chat.bridge.get();
  ChatPage* page = chat.page;
  QVERIFY(page->database() != nullptr);
  Conversations store(*page->database());
  const int64_t conversation =
      store.create("counting", R"({"temperature": 0, "lookup": true, "max_tokens": 96})");
  page->select_conversation(conversation);
  QSignalSpy ended(page, &ChatPage::replyEnded);
  page->send_message("Count from 1 to 40, one number per line.");
  QVERIFY(page->generating());
  const RequestId id = page->active_request();
  QVERIFY(ended.wait(kReplyTimeoutMs) || !ended.isEmpty());
  QCOMPARE(ended.first().at(2).toString(), QString("finished"));
  const RequestInfo info = bridge->engine()->request(id);
  QVERIFY2(info.speculation.verify_steps > 0, "the reply verified no copied drafts");

  const auto messages = store.messages(conversation);
  QCOMPARE(messages.size(), size_t(2));
  const auto stats = nlohmann::json::parse(messages[1].stats_json);
  const auto steps = static_cast<double>(info.speculation.verify_steps);
  QCOMPARE(stats.at("draft_ms_per_step").get<double>(), 0.0);  // copied, not proposed by a head
  QCOMPARE(stats.at("verify_ms_per_step").get<double>(), info.speculation.verify_s * 1e3 / steps);
  QVERIFY(stats.at("verify_ms_per_step").get<double>() > 0.0);
  auto* shown = page->findChild<QTextBrowser*>();
  QVERIFY(shown != nullptr);
  const QString expected = QStringLiteral("draft 0.00 + verify %1 ms a step")
                               .arg(stats.at("verify_ms_per_step").get<double>(), 0, 'f', 2);
  QVERIFY2(shown->toPlainText().contains(expected), qPrintable(shown->toPlainText()));
}

// A conversation whose saved settings and figures have other types than this build writes (a
// database edited by hand, or damaged) still opens: each such field falls back or is left out,
// and the rest is shown (a type error from the JSON library would have ended the app).
void GuiChatTest::damaged_saved_fields_are_left_out() {
  ChatSettingsBar bar;
  bar.load(R"({"max_tokens": "many", "temperature": [1], "head": 5, "lookup": "yes", "top_k": 3})");
  QCOMPARE(bar.max_tokens(), ChatSettingsBar().max_tokens());
  QVERIFY(!bar.context_lookup());
  QCOMPARE(nlohmann::json::parse(bar.to_json()).at("top_k").get<int>(), 3);

  ChatPage page;
  QVERIFY(page.database() != nullptr);
  Conversations store(*page.database());
  const int64_t conversation = store.create("damaged", R"({"max_tokens": {"a": 1}, "head": []})");
  MessageRecord question;
  question.conversation_id = conversation;
  question.role = "user";
  question.content = "How fast?";
  store.add_message(question);
  MessageRecord answer = question;
  answer.role = "assistant";
  answer.content = "Quite.";
  answer.stats_json = R"({"ttft_ms": "fast", "tokens": "12", "decode_tok_s": 88.5, "state": 7,)"
                      R"( "draft_ms_per_step": 0.5, "verify_ms_per_step": null})";
  store.add_message(answer);
  page.select_conversation(conversation);
  QCOMPARE(page.head_choice(), QString("none"));
  auto* shown = page.findChild<QTextBrowser*>();
  QVERIFY(shown != nullptr);
  const QString text = shown->toPlainText();
  QVERIFY2(text.contains("Quite.") && text.contains("88.5 tok/s"), qPrintable(text));
  QVERIFY2(!text.contains("TTFT") && !text.contains("tokens") && !text.contains("verify"),
           qPrintable(text));
}

// A reply longer than ChatPage::kSaveEveryMs is in the database before it ends (state
// "generating", a prefix of the reply); reopening the conversation meanwhile shows it once; at
// its end the same row holds the whole reply. A saved reply left "generating" (the app stopped
// during it) shows as interrupted.
void GuiChatTest::long_reply_is_saved_as_it_streams() {
  ChatWindow chat = open_chat();
  if (QTest::currentTestFailed()) return;
  ChatPage* page = chat.page;
  const int64_t conversation = page->create_conversation("saved as it streams");
  Conversations store(*page->database());
  store.set_settings(conversation, R"({"max_tokens": 600, "temperature": 0})");
  page->select_conversation(conversation);
  QSignalSpy ended(page, &ChatPage::replyEnded);
  page->send_message("Write a long story about a lighthouse keeper and the sea.");
  QVERIFY(page->generating());

  const auto assistant_rows = [&] {
    std::vector<MessageRecord> rows;
    for (const MessageRecord& m : store.messages(conversation))
      if (m.role == "assistant") rows.push_back(m);
    return rows;
  };
  QTRY_VERIFY_WITH_TIMEOUT(!assistant_rows().empty() || !page->generating(), kReplyTimeoutMs);
  QVERIFY2(page->generating(), "the reply ended before its first save; it is too short a test");
  const MessageRecord partial = assistant_rows().front();
  QCOMPARE(nlohmann::json::parse(partial.stats_json).at("state").get<std::string>(),
           std::string("generating"));
  QVERIFY(!partial.content.empty());

  page->select_conversation(conversation);  // reopened mid-reply: the partial row is not shown
  const QString opening = QString::fromStdString(partial.content).left(24);
  const QString shown = page->findChild<QTextBrowser*>()->toPlainText();
  QCOMPARE(shown.count(opening), 1);

  QVERIFY(ended.wait(kReplyTimeoutMs) || !ended.isEmpty());
  const auto rows = assistant_rows();
  QCOMPARE(rows.size(), size_t(1));
  QCOMPARE(rows[0].id, partial.id);
  QCOMPARE(nlohmann::json::parse(rows[0].stats_json).at("state").get<std::string>(),
           std::string("finished"));
  QVERIFY(rows[0].content.starts_with(partial.content));
  QVERIFY(rows[0].content.size() > partial.content.size());

  MessageRecord left = rows[0];
  left.content = "Half a sto";
  left.stats_json = R"({"state": "generating", "tokens": 4})";
  store.add_message(left);
  page->select_conversation(conversation);
  const QString reopened = page->findChild<QTextBrowser*>()->toPlainText();
  QVERIFY2(reopened.contains("Half a sto") && reopened.contains("interrupted"),
           qPrintable(reopened));
}

// A message the engine refuses (longer than the model's context) is not lost: it goes back to
// the input box, the status says why, and nothing is saved for it.
void GuiChatTest::unsent_message_stays_in_the_input() {
  ChatWindow chat = open_chat();
  if (QTest::currentTestFailed()) return;
  ChatPage* page = chat.page;
  const int64_t conversation = page->create_conversation("too long");
  QString text;
  for (int i = 0; i < 10'000; ++i) text += QStringLiteral("lighthouse ");
  text = text.trimmed();
  auto* input = page->findChild<QPlainTextEdit*>();
  QVERIFY(input != nullptr);
  input->setPlainText(text);
  QPushButton* send = nullptr;
  for (QPushButton* b : page->findChildren<QPushButton*>())
    if (b->text() == "Send") send = b;
  QVERIFY(send != nullptr);
  send->click();
  QVERIFY(!page->generating());
  QCOMPARE(input->toPlainText(), text);
  bool said = false;
  for (const QLabel* label : page->findChildren<QLabel*>())
    said = said || (label->text().contains("Not sent") && label->text().contains("context"));
  QVERIFY(said);
  QVERIFY(Conversations(*page->database()).messages(conversation).empty());
}

// A conversation longer than the context: the oldest messages are left out of the prompt (an
// even number: the prompt still opens with a user turn), prompt and max tokens fit the limit,
// the status says how many were left out, and the conversation keeps every message.
void GuiChatTest::long_conversation_leaves_oldest_messages_out_of_the_prompt() {
  constexpr int kLimit = 512, kMaxTokens = 16, kTurns = 12;
  EngineConfig config = test_config();
  config.max_context = kLimit;
  ChatWindow chat = open_chat(config);
  if (QTest::currentTestFailed()) return;
  ChatPage* page = chat.page;
  const int64_t conversation = page->create_conversation("long");
  Conversations store(*page->database());
  store.set_settings(
      conversation,
      QStringLiteral(R"({"max_tokens": %1, "temperature": 0})").arg(kMaxTokens).toStdString());
  for (int i = 0; i < kTurns; ++i) {
    store.add_message({.conversation_id = conversation,
                       .role = "user",
                       .content = "Tell me about lighthouse number " + std::to_string(i) + "."});
    store.add_message({.conversation_id = conversation,
                       .role = "assistant",
                       .content = "Lighthouse " + std::to_string(i) +
                                  " stands on a rocky point above a cold harbour. Its keeper "
                                  "climbs one hundred and twelve steps each evening to light "
                                  "the lamp, and writes the weather in a book by the window."});
  }
  page->select_conversation(conversation);
  QSignalSpy ended(page, &ChatPage::replyEnded);
  page->send_message("And which one is the tallest?");
  QVERIFY(page->generating());
  const RequestInfo info = chat.bridge->engine()->request(page->active_request());
  QVERIFY2(info.n_prompt + kMaxTokens <= kLimit, qPrintable(QString::number(info.n_prompt)));
  QString status;
  for (const QLabel* label : page->findChildren<QLabel*>())
    if (label->text().contains("left out of the prompt")) status = label->text();
  const QRegularExpressionMatch match =
      QRegularExpression(R"(The (\d+) oldest messages were left out)").match(status);
  QVERIFY2(match.hasMatch(), qPrintable(status));
  const int left_out = match.captured(1).toInt();
  QVERIFY(left_out > 0 && left_out < 2 * kTurns && left_out % 2 == 0);
  QVERIFY(ended.wait(kReplyTimeoutMs) || !ended.isEmpty());
  QCOMPARE(ended.first().at(2).toString(), QString("finished"));
  QCOMPARE(store.messages(conversation).size(), size_t(2 * kTurns + 2));
  bool still_said = false;  // the note outlasts the reply
  for (const QLabel* label : page->findChildren<QLabel*>())
    still_said = still_said || label->text().startsWith(match.captured(0));
  QVERIFY(still_said);
}

GuiChatTest::ChatWindow GuiChatTest::open_chat(const EngineConfig& config) {
  ChatWindow chat;
  chat.bridge = loaded_bridge(config);
  if (QTest::currentTestFailed()) return chat;
  chat.window = std::make_unique<MainWindow>(chat.bridge.get());
  chat.page = new ChatPage;
  chat.window->add_page(chat.page);
  chat.window->show();
  return chat;
}

void GuiChatTest::start_long_reply(EngineBridge& bridge, ChatPage& page) {
  QSignalSpy streamed(&bridge, &EngineBridge::streamed);
  page.create_conversation("closing test");
  page.send_message("Write a long story about a lighthouse keeper and the sea.");
  QVERIFY(page.generating());
  QVERIFY(streamed.wait(kReplyTimeoutMs));
  QVERIFY(page.generating());
}

void GuiChatTest::closing_window_mid_reply_is_clean() {
  auto bridge = loaded_bridge();
  if (QTest::currentTestFailed()) return;
  auto window = std::make_unique<MainWindow>(bridge.get());
  auto* page = new ChatPage;
  window->add_page(page);
  window->show();
  start_long_reply(*bridge, *page);
  if (QTest::currentTestFailed()) return;
  const int64_t conversation = page->current_conversation();
  const RequestId id = page->active_request();
  window.reset();  // mid-reply: the page cancels it and saves what it has
  QTRY_VERIFY_WITH_TIMEOUT(request_ended(bridge->engine()->request(id).state), 10'000);
  bridge.reset();

  auto db = Database::open_default();
  const auto messages = Conversations(*db).messages(conversation);
  QCOMPARE(messages.size(), size_t(2));
  QCOMPARE(messages[1].role, std::string("assistant"));
  QCOMPARE(nlohmann::json::parse(messages[1].stats_json).at("state").get<std::string>(),
           std::string("cancelled"));
}

void GuiChatTest::losing_bridge_mid_reply_is_clean() {
  auto bridge = loaded_bridge();
  if (QTest::currentTestFailed()) return;
  MainWindow window(bridge.get());
  auto* page = new ChatPage;
  window.add_page(page);
  window.show();
  start_long_reply(*bridge, *page);
  if (QTest::currentTestFailed()) return;
  bridge.reset();  // the engine goes first: its workers stop, the page keeps working
  QTest::qWait(100);
  QVERIFY(page->generating());  // no end event came: the page still holds the partial reply
  page->send_message("refused, no engine");
  // The window (and the page, saving its partial reply) goes at scope exit.
}

QTEST_MAIN(GuiChatTest)
#include "test_gui_chat.moc"
