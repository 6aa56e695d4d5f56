#include "screenshot.h"

#include <QApplication>
#include <QPixmap>
#include <cstdio>
#include <exception>
#include <optional>

#include "core/storage/conversations.h"
#include "core/tokenizer/chat_template.h"
#include "ui/models/conversation_list_model.h"
#include "ui/views/chat_page.h"
#include "ui/views/main_window.h"

namespace tokenfab::app {

namespace {

// Short, varied questions so that the streams differ (and the KV map shows several owners).
constexpr const char* kQuestions[] = {
    "Name three rivers in Europe.",       "What is a prime number?",
    "Give me a tip for writing clearly.", "Why is the sky blue?",
    "Describe a lighthouse at night.",    "How do bees make honey?",
    "What does a compiler do?",           "Suggest a name for a cat.",
};

}  // namespace

ScreenshotRun::ScreenshotRun(ui::MainWindow* window, ui::EngineBridge* bridge, QString view,
                             QString page_title, QString file, QObject* parent)
    : QObject(parent),
      window_(window),
      bridge_(bridge),
      view_(std::move(view)),
      page_title_(std::move(page_title)),
      file_(std::move(file)) {
  connect(bridge_, &ui::EngineBridge::loaded, this, &ScreenshotRun::start);
  connect(bridge_, &ui::EngineBridge::failed, this, [this](const QString& message) {
    fail(QStringLiteral("the model did not load: ") + message);
  });
  timeout_.setSingleShot(true);
  timeout_.setInterval(kTimeoutS * 1000);
  connect(&timeout_, &QTimer::timeout, this, [this] {
    fail(QStringLiteral("the %1 workload did not end within %2 s").arg(view_).arg(kTimeoutS));
  });
  timeout_.start();
}

void ScreenshotRun::start() {
  ui::Page* page = window_->page(page_title_);
  if (!page) return fail(QStringLiteral("this build has no %1 page").arg(view_));
  window_->show_page(page_title_);
  if (view_ == QLatin1String("chat"))
    start_chat(page);
  else
    start_requests();
}

void ScreenshotRun::start_chat(ui::Page* page) {
  auto* chat = qobject_cast<ui::ChatPage*>(page);
  if (!chat) return fail(QStringLiteral("the chat page is not a ChatPage"));
  if (!chat->database()) return fail(QStringLiteral("the conversation database did not open"));
  connect(chat, &ui::ChatPage::replyEnded, this, [this](qint64, int tokens, const QString& state) {
    if (state != QLatin1String("finished"))
      return fail(QStringLiteral("the reply ended %1").arg(state));
    std::fprintf(stderr, "tokenfab: reply finished (%d tokens)\n", tokens);
    grab_soon();
  });
  // A conversation of its own, deleted after the grab: the user's history stays as it was.
  conversation_id_ = chat->create_conversation(QStringLiteral("Write a haiku about rivers."));
  // Greedy, so that the screenshot is the same every time.
  Conversations(*chat->database())
      .set_settings(conversation_id_, R"({"max_tokens":128,"temperature":0})");
  chat->select_conversation(conversation_id_);
  chat->send_message(QStringLiteral("Write a haiku about rivers."));
  if (!chat->generating()) fail(QStringLiteral("the chat page did not send the message"));
}

void ScreenshotRun::start_requests() {
  connect(bridge_, &ui::EngineBridge::streamed, this, &ScreenshotRun::on_streamed);
  const Tokenizer& tokenizer = *bridge_->tokenizer();
  std::optional<ChatTemplate> chat_template;
  try {
    chat_template = ChatTemplate::from_gguf(bridge_->model()->file());
  } catch (const std::exception&) {
    // A model without a chat template gets the questions as plain text.
  }
  try {
    for (const char* question : kQuestions) {
      const std::string text =
          chat_template ? chat_template->apply({{"user", question}}, true) : std::string(question);
      GenerationRequest request;
      request.prompt = tokenizer.encode(text, tokenizer.add_bos_token(), true);
      request.max_tokens = 256;  // still streaming when the page is grabbed
      pending_.insert(bridge_->submit(std::move(request)));
    }
  } catch (const std::exception& e) {
    return fail(QStringLiteral("a request was refused: %1").arg(e.what()));
  }
  QTimer::singleShot(kStreamMs, this, &ScreenshotRun::grab_soon);
}

void ScreenshotRun::on_streamed(const QVector<ui::StreamUpdate>& updates) {
  for (const ui::StreamUpdate& u : updates) {
    if (!u.ended() || !pending_.count(u.id)) continue;
    if (u.state == RequestState::kFailed)
      return fail(QStringLiteral("request %1 failed: %2").arg(u.id).arg(u.error));
    pending_.erase(u.id);
    if (pending_.empty()) grab_soon();
  }
}

void ScreenshotRun::grab_soon() {
  if (grabbing_) return;
  grabbing_ = true;
  QTimer::singleShot(2 * 1000 / ui::EngineBridge::kSnapshotHz + 100, this, &ScreenshotRun::grab);
}

void ScreenshotRun::grab() {
  timeout_.stop();
  ui::Page* page = window_->page(page_title_);
  const QPixmap pixmap = page->grab();
  if (!pixmap.save(file_, "PNG")) return fail(QStringLiteral("could not write %1").arg(file_));
  std::fprintf(stderr, "tokenfab: wrote %s (%dx%d)\n", qPrintable(file_), pixmap.width(),
               pixmap.height());
  if (auto* chat = qobject_cast<ui::ChatPage*>(page); chat && conversation_id_ != 0)
    chat->conversation_model()->remove(conversation_id_);
  QApplication::exit(0);
}

void ScreenshotRun::fail(const QString& message) {
  timeout_.stop();
  std::fprintf(stderr, "tokenfab: --screenshot: %s\n", qPrintable(message));
  QApplication::exit(1);
}

}  // namespace tokenfab::app
