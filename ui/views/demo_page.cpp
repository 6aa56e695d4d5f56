#include "ui/views/demo_page.h"

#include <QComboBox>
#include <QFrame>
#include <QGridLayout>
#include <QHBoxLayout>
#include <QPlainTextEdit>
#include <QScrollArea>
#include <QScrollBar>
#include <QSpinBox>
#include <QTextCursor>
#include <QVBoxLayout>
#include <algorithm>
#include <exception>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/metrics/percentiles.h"
#include "core/serving/prompt_sets.h"
#include "core/storage/database.h"
#include "core/storage/runs.h"
#include "core/tokenizer/chat_template.h"

namespace tokenfab::ui {

namespace {

const QString kDash = QStringLiteral("—");
constexpr const char* kDefaultSet = "chat_turns";
// Long documents get an instruction in front, as serve-bench's long prompts do.
constexpr const char* kDocumentsLead = "Summarize the following document in three sentences.\n\n";

QString fixed(const std::optional<double>& v, int decimals, const QString& unit = {}) {
  return v ? QString::number(*v, 'f', decimals) + unit : kDash;
}

double seconds_between(MetricsTime from, MetricsTime to) {
  return std::chrono::duration<double>(to - from).count();
}

QString first_line(const std::string& entry) {
  QString line = QString::fromStdString(entry.substr(0, entry.find('\n'))).simplified();
  return line.size() > 70 ? line.left(69) + QStringLiteral("…") : line;
}

nlohmann::json optional_json(const std::optional<double>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
nlohmann::json DemoSummary::to_json() const {
  nlohmann::json completions = nlohmann::json::array();
  for (const auto& c : completion_s) completions.push_back(optional_json(c));
  return {{"agents", agents},
          {"prompt_set", prompt_set.toStdString()},
          {"max_tokens", max_tokens},
          {"stopped", stopped},
          {"finished", finished},
          {"cancelled", cancelled},
          {"failed", failed},
          {"output_tokens", tokens},
          {"wall_s", wall_s},
          {"throughput_tok_s", optional_json(tok_s)},
          {"peak_decode_tok_s", optional_json(peak_decode_tok_s)},
          {"completion_p50_s", optional_json(completion_p50_s)},
          {"completion_max_s", optional_json(completion_max_s)},
          {"completion_s", completions},
          {"agent_tokens", agent_tokens},
          {"event_loop_ms",
           {{"interval_ms", EventLoopProbe::kIntervalMs},
            {"samples", event_loop.samples},
            {"p50", optional_json(event_loop.p50_ms)},
            {"p99", optional_json(event_loop.p99_ms)},
            {"max", optional_json(event_loop.max_ms)},
            {"max_at_s", optional_json(event_loop.max_at_s)}}}};
}

// ---------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------
DemoPage::DemoPage(QWidget* parent) : Page(parent) {
  auto* scroll = new QScrollArea(this);
  scroll->setWidgetResizable(true);
  scroll->setFrameShape(QFrame::NoFrame);
  scroll->setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  grid_host_ = new QWidget(scroll);
  grid_ = new QGridLayout(grid_host_);
  grid_->setSpacing(6);
  grid_->setContentsMargins(0, 0, 0, 0);
  scroll->setWidget(grid_host_);

  status_ = new QLabel(this);
  status_->setWordWrap(true);
  detail_ = new QLabel(this);
  detail_->setStyleSheet("color: #5a6270;");

  auto* layout = new QVBoxLayout(this);
  layout->addWidget(make_controls());
  layout->addWidget(make_hud());
  layout->addWidget(detail_);
  layout->addWidget(status_);
  layout->addWidget(scroll, 1);
  update_hud();
  update_buttons();
}

DemoPage::~DemoPage() {
  if (!running_ || !bridge_) return;
  for (const DemoAgent& a : agents_)
    if (!request_ended(a.state)) bridge_->cancel(a.id);
}

QWidget* DemoPage::make_controls() {
  auto* bar = new QWidget(this);
  auto* row = new QHBoxLayout(bar);
  row->setContentsMargins(0, 0, 0, 0);
  agents_spin_ = new QSpinBox(bar);
  agents_spin_->setRange(1, kMaxAgents);
  agents_spin_->setValue(16);
  set_combo_ = new QComboBox(bar);
  for (const std::string& name : builtin_prompt_set_names())
    set_combo_->addItem(QString::fromStdString(name));
  set_combo_->setCurrentText(kDefaultSet);
  tokens_spin_ = new QSpinBox(bar);
  tokens_spin_->setRange(1, 4096);
  tokens_spin_->setValue(128);
  start_button_ = new QPushButton(tr("Start"), bar);
  stop_button_ = new QPushButton(tr("Stop"), bar);
  connect(start_button_, &QPushButton::clicked, this, [this] {
    start(agents_spin_->value(), set_combo_->currentText(), tokens_spin_->value());
  });
  connect(stop_button_, &QPushButton::clicked, this, &DemoPage::stop);
  row->addWidget(new QLabel(tr("Agents"), bar));
  row->addWidget(agents_spin_);
  row->addWidget(new QLabel(tr("Prompt set"), bar));
  row->addWidget(set_combo_);
  row->addWidget(new QLabel(tr("Max tokens per agent"), bar));
  row->addWidget(tokens_spin_);
  row->addStretch(1);
  row->addWidget(start_button_);
  row->addWidget(stop_button_);
  return bar;
}

QWidget* DemoPage::make_hud() {
  auto* hud = new QWidget(this);
  auto* grid = new QGridLayout(hud);
  grid->setContentsMargins(0, 4, 0, 4);
  int column = 0;
  for (const char* name :
       {"DECODE TPS", "RUN TPS", "TOKENS", "ELAPSED", "AGENTS DONE", "EVENT LOOP p99"}) {
    const bool main = column == 0;
    auto* value = new QLabel(kDash, hud);
    value->setAlignment(Qt::AlignCenter);
    value->setStyleSheet(main ? "font-size: 56px; font-weight: bold; color: #1d5fbf;"
                              : "font-size: 28px; font-weight: bold;");
    value->setMinimumWidth(main ? 220 : 130);
    auto* caption = new QLabel(name, hud);
    caption->setAlignment(Qt::AlignCenter);
    caption->setStyleSheet("color: #8a9099; font-weight: bold; letter-spacing: 2px;");
    grid->addWidget(value, 0, column, main ? Qt::AlignCenter : Qt::AlignBottom | Qt::AlignHCenter);
    grid->addWidget(caption, 1, column);
    grid->setColumnStretch(column, main ? 2 : 1);
    hud_[name] = value;
    ++column;
  }
  return hud;
}

void DemoPage::attach(EngineBridge* bridge) {
  bridge_ = bridge;
  connect(bridge, &EngineBridge::streamed, this, &DemoPage::on_streamed);
  connect(bridge, &EngineBridge::snapshotTaken, this, &DemoPage::on_snapshot);
  connect(bridge, &EngineBridge::loaded, this, &DemoPage::update_buttons);
  connect(bridge, &EngineBridge::failed, this, [this](const QString& message) {
    show_status(tr("No model: %1").arg(message));
    update_buttons();
  });
  update_buttons();
}

std::vector<std::vector<TokenId>> DemoPage::make_prompts(int agents, const std::string& set_name,
                                                         std::vector<QString>& titles) {
  const PromptSet& set = builtin_prompt_set(set_name);  // throws Error for an unknown name
  const Tokenizer& tokenizer = *bridge_->tokenizer();
  std::optional<ChatTemplate> chat_template;
  try {
    chat_template = ChatTemplate::from_gguf(bridge_->model()->file());
  } catch (const std::exception&) {
    // A model without a chat template gets the prompts as plain text.
  }
  const std::string lead = set_name == "documents" ? kDocumentsLead : "";
  std::vector<std::vector<TokenId>> prompts;
  for (int i = 0; i < agents; ++i) {
    const std::string& entry = set.entries[static_cast<size_t>(i) % set.entries.size()];
    const std::string user = lead + entry;
    const std::string text = chat_template ? chat_template->apply({{"user", user}}, true) : user;
    prompts.push_back(tokenizer.encode(text, tokenizer.add_bos_token(), true));
    titles.push_back(first_line(entry));
  }
  return prompts;
}

void DemoPage::build_tiles(int n) {
  for (DemoTile* tile : tiles_) delete tile;
  tiles_.clear();
  for (int i = 0; i < n; ++i) {
    auto* tile = new DemoTile(i + 1, agents_[static_cast<size_t>(i)].title, grid_host_);
    grid_->addWidget(tile, i / kColumns, i % kColumns);
    tiles_.push_back(tile);
  }
  for (int c = 0; c < kColumns; ++c) grid_->setColumnStretch(c, 1);
}

bool DemoPage::start(int agents, const QString& prompt_set, int max_tokens) {
  if (running_) {
    show_status(tr("A run is going; stop it first."));
    return false;
  }
  if (!bridge_ || !bridge_->ready()) {
    show_status(tr("No model is loaded yet."));
    return false;
  }
  agents = std::clamp(agents, 1, kMaxAgents);
  agents_spin_->setValue(agents);  // the controls show the run, however it was started
  set_combo_->setCurrentText(prompt_set);
  tokens_spin_->setValue(max_tokens);
  std::vector<QString> titles;
  std::vector<std::vector<TokenId>> prompts;
  try {
    prompts = make_prompts(agents, prompt_set.toStdString(), titles);
  } catch (const std::exception& e) {
    show_status(tr("Could not build the prompts: %1").arg(e.what()));
    return false;
  }

  agents_.assign(static_cast<size_t>(agents), DemoAgent{});
  index_of_.clear();
  tokens_ = 0;
  ended_ = 0;
  stopped_ = false;
  decode_tok_s_.reset();
  peak_decode_tok_s_.reset();
  prompt_set_ = prompt_set;
  max_tokens_ = max_tokens;
  for (size_t i = 0; i < agents_.size(); ++i) agents_[i].title = titles[i];
  build_tiles(agents);

  submitted_ = MetricsClock::now();
  elapsed_.start();
  probe_.start();
  running_ = true;
  bool refused = false;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest request(std::move(prompts[i]), max_tokens);
    try {
      agents_[i].id = bridge_->submit(std::move(request));
      index_of_[agents_[i].id] = i;
    } catch (const std::exception& e) {
      // Agents not submitted end at once as failed; those submitted are cancelled.
      show_status(tr("Agent %1 was refused: %2").arg(i + 1).arg(e.what()));
      for (size_t j = i; j < agents_.size(); ++j) {
        agents_[j].state = RequestState::kFailed;
        agents_[j].error = QString::fromUtf8(e.what());
        tiles_[j]->show_figures(agents_[j], std::nullopt);
        ++ended_;
      }
      refused = true;
      stop();
      break;
    }
  }
  if (!refused) show_status(tr("%1 agents submitted.").arg(agents));
  update_hud();
  update_buttons();
  if (ended_ == static_cast<int>(agents_.size())) finish_run();
  return !refused;
}

void DemoPage::stop() {
  if (!running_) return;
  stopped_ = true;
  for (const DemoAgent& a : agents_)
    if (a.id != 0 && !request_ended(a.state)) bridge_->cancel(a.id);
  update_buttons();
}

void DemoPage::on_streamed(const QVector<StreamUpdate>& updates) {
  if (!running_) return;
  for (const StreamUpdate& u : updates) {
    const auto it = index_of_.find(u.id);
    if (it == index_of_.end()) continue;
    const size_t i = it->second;
    DemoAgent& agent = agents_[i];
    if (request_ended(agent.state)) continue;
    DemoTile* tile = tiles_[i];
    const auto n = static_cast<int64_t>(u.tokens.size());
    if (n > 0) {
      if (!tile->first_token.isValid())
        tile->first_token.start();
      else
        tile->tokens_after_first += n;
    }
    agent.tokens += n;
    tokens_ += n;
    agent.state = u.state;
    agent.error = u.error;
    tile->append(u.text);
    if (u.ended()) on_agent_ended(i);
    std::optional<double> live;
    if (tile->first_token.isValid() && tile->first_token.elapsed() > 0)
      live = tile->tokens_after_first * 1000.0 / tile->first_token.elapsed();
    tile->show_figures(agent, live);
  }
  update_hud();
  if (running_ && ended_ == static_cast<int>(agents_.size())) finish_run();
}

// The engine's own timestamps for the agent's end and its decode rate.
void DemoPage::on_agent_ended(size_t index) {
  ++ended_;
  DemoAgent& agent = agents_[index];
  Engine* engine = bridge_ ? bridge_->engine() : nullptr;
  if (!engine) return;
  try {
    const RequestInfo info = engine->request(agent.id);
    const auto& end = info.entered[static_cast<size_t>(info.state)];
    if (info.state == RequestState::kFinished && end)
      agent.completion_s = seconds_between(submitted_, *end);
    if (info.metrics && info.metrics->tpot_s && *info.metrics->tpot_s > 0)
      agent.decode_tok_s = 1.0 / *info.metrics->tpot_s;
  } catch (const std::exception&) {
    // The engine was replaced meanwhile: the agent keeps the figures it streamed.
  }
}

void DemoPage::on_snapshot(const SnapshotPtr& snapshot) {
  if (!running_ || !snapshot) return;
  decode_tok_s_ = snapshot->output_rate.per_second;
  if (!peak_decode_tok_s_ || *decode_tok_s_ > *peak_decode_tok_s_)
    peak_decode_tok_s_ = decode_tok_s_;
  update_hud();
}

void DemoPage::finish_run() {
  running_ = false;
  probe_.stop();

  DemoSummary s;
  s.agents = static_cast<int>(agents_.size());
  s.prompt_set = prompt_set_;
  s.max_tokens = max_tokens_;
  s.stopped = stopped_;
  s.tokens = tokens_;
  std::vector<double> completions;
  for (const DemoAgent& a : agents_) {
    s.finished += a.state == RequestState::kFinished;
    s.cancelled += a.state == RequestState::kCancelled;
    s.failed += a.state == RequestState::kFailed;
    s.completion_s.push_back(a.completion_s);
    s.agent_tokens.push_back(a.tokens);
    if (a.completion_s) completions.push_back(*a.completion_s);
  }
  // Wall time: the last finished agent's end on the engine clock; the GUI's clock when no agent
  // finished (all cancelled or failed).
  s.wall_s = completions.empty() ? elapsed_.elapsed() / 1000.0
                                 : *std::max_element(completions.begin(), completions.end());
  if (s.wall_s > 0) s.tok_s = s.tokens / s.wall_s;
  s.peak_decode_tok_s = peak_decode_tok_s_;
  if (!completions.empty()) {
    std::sort(completions.begin(), completions.end());
    s.completion_p50_s = percentile_of_sorted(completions, 50);
    s.completion_max_s = completions.back();
  }
  s.event_loop = summarize_latency(probe_.lateness_ms());
  if (s.event_loop.samples > 0) s.event_loop.max_at_s = probe_.worst_at_s();
  summary_ = s;

  update_hud();
  update_buttons();
  show_status(tr("%1 of %2 agents finished%3.")
                  .arg(s.finished)
                  .arg(s.agents)
                  .arg(s.stopped ? tr(" (stopped)") : QString()));
  record_run();
  emit finished(summary_);
}

void DemoPage::record_run() {
  if (!bridge_ || !bridge_->model()) return;
  try {
    RunRecord run;
    run.kind = "demo";
    run.title = QStringLiteral("demo %1 agents × %2 tokens (%3)")
                    .arg(summary_.agents)
                    .arg(summary_.max_tokens)
                    .arg(summary_.prompt_set)
                    .toStdString();
    run.model = std::filesystem::path(bridge_->model()->file().name()).filename().string();
    const EngineConfig& c = bridge_->config();
    run.config_json = nlohmann::json{{"agents", summary_.agents},
                                     {"prompt_set", summary_.prompt_set.toStdString()},
                                     {"max_tokens", summary_.max_tokens},
                                     {"mode", c.disaggregated() ? "disaggregated" : "colocated"},
                                     {"devices", c.devices},
                                     {"prefill", c.prefill},
                                     {"decode", c.decode},
                                     {"threads", c.total_threads()}}
                          .dump();
    run.summary_json = summary_.to_json().dump();
    const auto db = Database::open_default();
    RunStore(*db).add(run);
  } catch (const std::exception& e) {
    show_status(status_text() + tr(" Not recorded in History: %1").arg(e.what()));
  }
}

void DemoPage::update_hud() {
  const bool ended = !running_ && !agents_.empty();
  const double elapsed_s = ended                ? summary_.wall_s
                           : elapsed_.isValid() ? elapsed_.elapsed() / 1e3
                                                : 0.0;
  std::optional<double> run_tps;
  if (ended)
    run_tps = summary_.tok_s;
  else if (elapsed_s > 0)
    run_tps = tokens_ / elapsed_s;
  const LatencySummary loop = ended ? summary_.event_loop : summarize_latency(probe_.lateness_ms());

  hud_["DECODE TPS"]->setText(fixed(decode_tok_s_, 0));
  hud_["RUN TPS"]->setText(fixed(run_tps, 0));
  hud_["TOKENS"]->setText(QString::number(tokens_));
  hud_["ELAPSED"]->setText(agents_.empty() ? kDash : QString::number(elapsed_s, 'f', 2) + " s");
  hud_["AGENTS DONE"]->setText(
      agents_.empty() ? kDash : QStringLiteral("%1/%2").arg(ended_).arg(agents_.size()));
  hud_["EVENT LOOP p99"]->setText(fixed(loop.p99_ms, 1, " ms"));

  QString detail = tr("Event loop (%1 ms timer, %2 samples): p50 %3 · p99 %4 · max %5")
                       .arg(EventLoopProbe::kIntervalMs)
                       .arg(loop.samples)
                       .arg(fixed(loop.p50_ms, 2, " ms"), fixed(loop.p99_ms, 2, " ms"),
                            fixed(loop.max_ms, 2, " ms"));
  if (loop.max_at_s) detail += tr(" at %1 s").arg(*loop.max_at_s, 0, 'f', 2);
  if (ended) {
    detail +=
        tr("   ·   completion p50 %1 · max %2   ·   peak DECODE TPS %3")
            .arg(fixed(summary_.completion_p50_s, 2, " s"),
                 fixed(summary_.completion_max_s, 2, " s"), fixed(summary_.peak_decode_tok_s, 0));
  }
  detail_->setText(detail);
}

void DemoPage::update_buttons() {
  const bool ready = bridge_ && bridge_->ready();
  start_button_->setEnabled(ready && !running_);
  stop_button_->setEnabled(running_ && !stopped_);
  agents_spin_->setEnabled(!running_);
  set_combo_->setEnabled(!running_);
  tokens_spin_->setEnabled(!running_);
}

QString DemoPage::hud_text(const QString& name) const {
  const auto it = hud_.find(name);
  return it == hud_.end() ? QString() : it->second->text();
}

QString DemoPage::status_text() const {
  return status_->text();
}

void DemoPage::show_status(const QString& text) {
  status_->setText(text);
}

}  // namespace tokenfab::ui
