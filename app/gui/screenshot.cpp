#include "screenshot.h"

#include <QApplication>
#include <QPixmap>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/metrics/percentiles.h"
#include "core/storage/conversations.h"
#include "core/storage/runs.h"
#include "core/tokenizer/chat_template.h"
#include "ui/models/conversation_list_model.h"
#include "ui/models/model_library_model.h"
#include "ui/views/chat_page.h"
#include "ui/views/demo_page.h"
#include "ui/views/devices_page.h"
#include "ui/views/history_page.h"
#include "ui/views/main_window.h"
#include "ui/views/models_page.h"

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
  else if (view_ == QLatin1String("demo"))
    start_demo(page);
  else if (view_ == QLatin1String("history"))
    start_history(page);
  else if (view_ == QLatin1String("devices"))
    start_devices(page);
  else if (view_ == QLatin1String("models"))
    start_models(page);
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

void ScreenshotRun::start_demo(ui::Page* page) {
  auto* demo = qobject_cast<ui::DemoPage*>(page);
  if (!demo) return fail(QStringLiteral("the demo page is not a DemoPage"));
  connect(demo, &ui::DemoPage::finished, this, [this](const ui::DemoSummary& s) {
    if (s.finished != s.agents)
      return fail(QStringLiteral("%1 of %2 agents finished").arg(s.finished).arg(s.agents));
    std::fprintf(stderr, "tokenfab: demo finished: %s\n", s.to_json().dump().c_str());
    grab_soon();
  });
  if (!demo->start(kDemoAgents, QStringLiteral("chat_turns"), kDemoTokens))
    fail(QStringLiteral("the demo did not start: %1").arg(demo->status_text()));
}

void ScreenshotRun::start_devices(ui::Page* page) {
  auto* devices = qobject_cast<ui::DevicesPage*>(page);
  if (!devices) return fail(QStringLiteral("the devices page is not a DevicesPage"));
  // The roofline's limits measured while no request runs, as a user who opens the page first
  // gets them; then the steps to set against them.
  if (devices->limits_settled()) return start_requests();
  connect(devices, &ui::DevicesPage::limitsMeasured, this, [this, devices] {
    if (devices->limits_settled()) start_requests();
  });
}

void ScreenshotRun::start_models(ui::Page* page) {
  auto* models = qobject_cast<ui::ModelsPage*>(page);
  if (!models) return fail(QStringLiteral("the models page is not a ModelsPage"));
  // The library as the page shows it once shown: the first scan (showing the page started it).
  const auto grab_scanned = [this, models] {
    std::fprintf(stderr, "tokenfab: models page: %d models, %d skipped\n",
                 models->library_model()->rowCount(),
                 static_cast<int>(models->skipped_lines().size()));
    grab_soon();
  };
  if (models->scanned() && !models->scanning()) return grab_scanned();
  connect(models, &ui::ModelsPage::scanFinished, this, grab_scanned);
}

void ScreenshotRun::start_requests() {
  if (requests_started_) return;
  requests_started_ = true;
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

void ScreenshotRun::start_history(ui::Page* page) {
  if (!qobject_cast<ui::HistoryPage*>(page))
    return fail(QStringLiteral("the history page is not a HistoryPage"));
  try {
    const auto db = Database::open_default();
    if (RunStore(*db).list({}, 2).size() >= 2) return show_history();
  } catch (const std::exception& e) {
    return fail(QStringLiteral("the run history could not be read: %1").arg(e.what()));
  }
  connect(bridge_, &ui::EngineBridge::streamed, this, &ScreenshotRun::on_history_streamed);
  start_history_batch();
}

void ScreenshotRun::start_history_batch() {
  const int n = kHistoryBatches[history_batches_.size()];
  const Tokenizer& tokenizer = *bridge_->tokenizer();
  std::optional<ChatTemplate> chat_template;
  try {
    chat_template = ChatTemplate::from_gguf(bridge_->model()->file());
  } catch (const std::exception&) {
    // A model without a chat template gets the questions as plain text.
  }
  std::vector<RequestId> batch;
  try {
    for (int i = 0; i < n; ++i) {
      const char* question = kQuestions[i % std::size(kQuestions)];
      const std::string text =
          chat_template ? chat_template->apply({{"user", question}}, true) : std::string(question);
      GenerationRequest request;
      request.prompt = tokenizer.encode(text, tokenizer.add_bos_token(), true);
      request.max_tokens = kHistoryTokens;
      request.stop_at_end_of_generation = false;  // every request generates kHistoryTokens
      batch.push_back(bridge_->submit(std::move(request)));
      history_pending_.insert(batch.back());
    }
  } catch (const std::exception& e) {
    return fail(QStringLiteral("a request was refused: %1").arg(e.what()));
  }
  history_batches_.push_back(std::move(batch));
}

void ScreenshotRun::on_history_streamed(const QVector<ui::StreamUpdate>& updates) {
  for (const ui::StreamUpdate& u : updates) {
    if (!u.ended() || !history_pending_.erase(u.id)) continue;
    if (u.state != RequestState::kFinished)
      return fail(QStringLiteral("request %1 ended without finishing: %2").arg(u.id).arg(u.error));
    if (!history_pending_.empty()) continue;
    record_history_batch();
    if (history_batches_.size() < std::size(kHistoryBatches))
      start_history_batch();
    else
      show_history();
  }
}

void ScreenshotRun::record_history_batch() {
  const std::vector<RequestId>& batch = history_batches_.back();
  std::vector<double> ttft_ms, itl_ms, e2e_ms;
  int64_t tokens = 0;
  std::optional<MetricsTime> first_submit, last_end;
  for (RequestId id : batch) {
    const RequestInfo info = bridge_->engine()->request(id);
    const auto& submitted = info.entered[static_cast<size_t>(RequestState::kQueued)];
    const auto& finished = info.entered[static_cast<size_t>(RequestState::kFinished)];
    if (submitted && (!first_submit || *submitted < *first_submit)) first_submit = submitted;
    if (finished && (!last_end || *finished > *last_end)) last_end = finished;
    if (!info.metrics) continue;
    tokens += info.metrics->output_tokens;
    if (info.metrics->ttft_s) ttft_ms.push_back(*info.metrics->ttft_s * 1e3);
    if (info.metrics->e2e_s) e2e_ms.push_back(*info.metrics->e2e_s * 1e3);
    for (double gap : info.metrics->itl_s) itl_ms.push_back(gap * 1e3);
  }
  const auto percentiles = [](std::vector<double> values) {
    const PercentileSummary p = summarize_percentiles(std::move(values));
    const auto value = [](const std::optional<double>& v) {
      return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
    };
    return nlohmann::json{{"p50", value(p.p50)}, {"p99", value(p.p99)}};
  };
  nlohmann::json summary = {{"requests", batch.size()},
                            {"output_tokens", tokens},
                            {"ttft_ms", percentiles(ttft_ms)},
                            {"itl_ms", percentiles(itl_ms)},
                            {"e2e_ms", percentiles(e2e_ms)}};
  if (first_submit && last_end && *last_end > *first_submit) {
    const double seconds = std::chrono::duration<double>(*last_end - *first_submit).count();
    summary["duration_s"] = seconds;
    summary["throughput_tok_s"] = static_cast<double>(tokens) / seconds;
  }
  const EngineConfig& config = bridge_->config();
  RunRecord run;
  run.kind = "screenshot-workload";
  run.title = "screenshot workload " + std::to_string(batch.size()) + " req x " +
              std::to_string(kHistoryTokens) + " tok";
  run.model = std::filesystem::path(bridge_->model()->file().name()).filename().string();
  run.config_json = nlohmann::json{{"requests", batch.size()},  {"max_tokens", kHistoryTokens},
                                   {"devices", config.devices}, {"prefill", config.prefill},
                                   {"decode", config.decode},   {"threads", config.total_threads()}}
                        .dump();
  run.summary_json = summary.dump();
  try {
    const auto db = Database::open_default();
    RunStore(*db).add(run);
  } catch (const std::exception& e) {
    return fail(QStringLiteral("the run could not be recorded: %1").arg(e.what()));
  }
  std::fprintf(stderr, "tokenfab: recorded %s: %s\n", run.title.c_str(), run.summary_json.c_str());
}

void ScreenshotRun::show_history() {
  auto* history = qobject_cast<ui::HistoryPage*>(window_->page(page_title_));
  history->refresh();
  if (!history->error().isEmpty()) return fail(history->error());
  history->select_rows({0, 1});  // newest first: the two latest runs
  grab_soon();
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
