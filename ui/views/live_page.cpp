#include "ui/views/live_page.h"

#include <QFileDialog>
#include <QGridLayout>
#include <QHBoxLayout>
#include <QMessageBox>
#include <QPixmap>
#include <QSaveFile>
#include <QTextStream>
#include <QVBoxLayout>
#include <algorithm>
#include <chrono>

#include "ui/widgets/bar_chart.h"
#include "ui/widgets/time_chart.h"

namespace tokenfab::ui {

namespace {

const QString kDash = QStringLiteral("—");

QString fixed(double v, int decimals) {
  return QString::number(v, 'f', decimals);
}
QString fixed(const std::optional<double>& v, int decimals) {
  return v ? fixed(*v, decimals) : kDash;
}
QString csv_cell(const std::optional<double>& v) {
  return v ? QString::number(*v, 'g', 8) : QString();
}

QLabel* big_number(const QString& name, QWidget* parent, QGridLayout* grid, int column) {
  auto* caption = new QLabel(name, parent);
  caption->setAlignment(Qt::AlignCenter);
  caption->setStyleSheet("color: #8a9099; font-weight: bold; letter-spacing: 2px;");
  auto* value = new QLabel(kDash, parent);
  value->setAlignment(Qt::AlignCenter);
  value->setStyleSheet("font-size: 34px; font-weight: bold;");
  value->setMinimumWidth(150);
  grid->addWidget(value, 0, column);
  grid->addWidget(caption, 1, column);
  return value;
}

}  // namespace

LivePage::LivePage(QWidget* parent) : Page(parent) {
  tps_chart_ = new TimeChart("Decode tokens/s (all requests)", "tok/s", this);
  tps_chart_->ensure_series("decode_tps", "decode tok/s");
  request_chart_ = new TimeChart("Decode tokens/s per running request", "tok/s", this);
  accept_length_chart_ =
      new BarChart("Accept length (completed requests)", "steps", "% of steps", std::nullopt, this);
  position_chart_ = new BarChart("Draft acceptance by position (completed requests)", "accepted",
                                 "% accepted", 100.0, this);
  accept_chart_ =
      new TimeChart("ACCEPT/STEP and verifying step time (completed requests)", "tok/step", this);
  accept_chart_->ensure_series("accept_per_step", "ACCEPT/STEP");
  // Where a verifying step's time goes, on an axis of its own: proposing its drafts, and the step.
  accept_chart_->ensure_series("draft_ms", "drafting, ms");
  accept_chart_->ensure_series("verify_ms", "verifying, ms");
  accept_chart_->use_right_axis("draft_ms", "ms");
  accept_chart_->use_right_axis("verify_ms", "ms");
  itl_chart_ = new TimeChart("Inter-token latency (completed requests)", "ms", this);
  itl_chart_->ensure_series("itl_p50", "ITL p50");
  itl_chart_->ensure_series("itl_p99", "ITL p99");
  ttft_chart_ = new TimeChart("Time to first token (completed requests)", "ms", this);
  ttft_chart_->ensure_series("ttft_p50", "TTFT p50");
  ttft_chart_->ensure_series("ttft_p99", "TTFT p99");
  kv_chart_ = new TimeChart("KV cache owned per device", "% blocks", this);
  transfer_chart_ = new TimeChart("KV transfer (transfers ended per interval)", "GB/s", this);
  transfer_chart_->ensure_series("transfer_gb_s", "GB/s over copy time");

  auto* charts = new QGridLayout();
  charts->addWidget(tps_chart_, 0, 0);
  charts->addWidget(request_chart_, 0, 1);
  charts->addWidget(accept_chart_, 0, 2);
  charts->addWidget(itl_chart_, 1, 0);
  charts->addWidget(kv_chart_, 1, 1);
  charts->addWidget(transfer_chart_, 1, 2);
  charts->addWidget(accept_length_chart_, 2, 0);
  charts->addWidget(position_chart_, 2, 1);
  charts->addWidget(ttft_chart_, 2, 2);

  auto* layout = new QVBoxLayout(this);
  layout->addWidget(make_hud());
  layout->addLayout(charts, 1);
  layout->addWidget(make_buttons());
}

QWidget* LivePage::make_hud() {
  auto* hud = new QWidget(this);
  auto* grid = new QGridLayout(hud);
  int column = 0;
  for (const char* name : {"DECODE TPS", "ACCEPT/STEP", "TOKENS", "TTFT p50"})
    hud_[name] = big_number(name, hud, grid, column++);
  hud_["TOKENS"]->setText("0");
  return hud;
}

QWidget* LivePage::make_buttons() {
  auto* bar = new QWidget(this);
  auto* row = new QHBoxLayout(bar);
  row->setContentsMargins(0, 0, 0, 0);
  pause_button_ = new QPushButton("Pause", bar);
  pause_button_->setCheckable(true);
  auto* reset_button = new QPushButton("Reset", bar);
  auto* csv_button = new QPushButton("Export CSV…", bar);
  auto* png_button = new QPushButton("Export PNG…", bar);
  connect(pause_button_, &QPushButton::toggled, this, &LivePage::set_paused);
  connect(reset_button, &QPushButton::clicked, this, &LivePage::reset);
  connect(csv_button, &QPushButton::clicked, this, &LivePage::choose_and_export_csv);
  connect(png_button, &QPushButton::clicked, this, &LivePage::choose_and_export_png);
  row->addWidget(pause_button_);
  row->addWidget(reset_button);
  row->addStretch(1);
  row->addWidget(csv_button);
  row->addWidget(png_button);
  return bar;
}

void LivePage::attach(EngineBridge* bridge) {
  connect(bridge, &EngineBridge::snapshotTaken, this, &LivePage::on_snapshot);
  connect(bridge, &EngineBridge::streamed, this, &LivePage::on_streamed);
}

void LivePage::on_streamed(const QVector<StreamUpdate>& updates) {
  for (const StreamUpdate& u : updates) tokens_seen_ += static_cast<int64_t>(u.tokens.size());
  if (!paused_) hud_["TOKENS"]->setText(QString::number(tokens_seen_));
}

void LivePage::on_snapshot(const SnapshotPtr& snapshot) {
  if (!snapshot || paused_) return;
  const EngineSnapshot& s = *snapshot;
  if (!origin_) origin_ = s.time;

  Sample sample;
  sample.t_s = std::chrono::duration<double>(s.time - *origin_).count();
  sample.decode_tok_s = s.output_rate.per_second;
  sample.accept_per_step = s.summary.accept_per_step;
  sample.draft_ms = s.summary.draft_ms_per_step;
  sample.verify_ms = s.summary.verify_ms_per_step;
  sample.itl_p50_ms = s.summary.itl_ms.p50;
  sample.itl_p99_ms = s.summary.itl_ms.p99;
  sample.ttft_p50_ms = s.summary.ttft_ms.p50;
  sample.ttft_p99_ms = s.summary.ttft_ms.p99;
  for (const DeviceSnapshot& d : s.devices) {
    if (d.kv.n_blocks <= 0) continue;
    sample.kv_used_pct[d.name] = 100.0 * d.kv.n_owned / d.kv.n_blocks;
    if (std::find(devices_.begin(), devices_.end(), d.name) == devices_.end())
      devices_.push_back(d.name);
  }
  const TransferTotals& now = s.summary.transfer;
  if (last_transfer_ && now.count > last_transfer_->count) {
    const double seconds = now.seconds - last_transfer_->seconds;
    if (seconds > 0) sample.transfer_gb_s = (now.bytes - last_transfer_->bytes) / seconds / 1e9;
  }
  last_transfer_ = now;
  for (const RequestInfo& r : s.requests) {
    const auto& first = r.entered[static_cast<size_t>(RequestState::kDecoding)];
    if (r.state != RequestState::kDecoding || !first || r.output.size() < 2) continue;
    const double elapsed = std::chrono::duration<double>(s.time - *first).count();
    if (elapsed > 0)
      sample.request_tok_s[r.id] = static_cast<double>(r.output.size() - 1) / elapsed;
  }

  samples_.push_back(std::move(sample));
  while (samples_.size() > kMaxSamples) samples_.pop_front();
  update_hud(&s);
  update_charts();
  update_bars(s.summary);
}

void LivePage::update_request_series() {
  std::map<RequestId, QList<QPointF>> lines;
  for (const Sample& x : samples_)
    for (const auto& [id, rate] : x.request_tok_s) lines[id].append({x.t_s, rate});
  while (lines.size() > static_cast<size_t>(kMaxRequestSeries)) lines.erase(lines.begin());
  for (const QString& key : request_chart_->series_keys())
    if (!lines.count(key.mid(4).toLongLong())) request_chart_->remove_series(key);
  for (const auto& [id, points] : lines) {
    const QString key = QStringLiteral("req:%1").arg(id);
    request_chart_->ensure_series(key, QStringLiteral("#%1").arg(id));
    request_chart_->set_points(key, points);
  }
}

namespace {
// a[i] − b[i] (b shorter or equal; counts only grow).
std::vector<int64_t> minus(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  std::vector<int64_t> out = a;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) out[i] -= b[i];
  return out;
}
}  // namespace

void LivePage::update_bars(const ServingSummary& summary) {
  last_counts_ = {summary.steps_by_tokens, summary.draft_proposed_at, summary.draft_accepted_at};
  const std::vector<int64_t> by_tokens = minus(summary.steps_by_tokens, bars_base_.steps_by_tokens);
  const std::vector<int64_t> proposed = minus(summary.draft_proposed_at, bars_base_.proposed_at);
  const std::vector<int64_t> accepted = minus(summary.draft_accepted_at, bars_base_.accepted_at);
  QStringList lengths;
  QList<qreal> shares;
  int64_t steps = 0;
  for (int64_t n : by_tokens) steps += n;
  for (size_t n = 1; n < by_tokens.size() && steps > 0; ++n) {
    lengths << QString::number(n);
    shares << 100.0 * static_cast<double>(by_tokens[n]) / static_cast<double>(steps);
  }
  accept_length_chart_->set_bars(lengths, shares);
  QStringList positions;
  QList<qreal> rates;
  for (size_t k = 0; k < proposed.size(); ++k) {
    if (proposed[k] <= 0) break;
    const int64_t a = k < accepted.size() ? accepted[k] : 0;
    positions << QStringLiteral("+%1").arg(k + 1);
    rates << 100.0 * static_cast<double>(a) / static_cast<double>(proposed[k]);
  }
  position_chart_->set_bars(positions, rates);
}

QList<qreal> LivePage::bars(const QString& chart) const {
  if (chart == "accept_length") return accept_length_chart_->values();
  if (chart == "position_acceptance") return position_chart_->values();
  return {};
}

void LivePage::update_hud(const EngineSnapshot* s) {
  hud_["TOKENS"]->setText(QString::number(tokens_seen_));
  if (!s) {
    for (const char* name : {"DECODE TPS", "ACCEPT/STEP", "TTFT p50"}) hud_[name]->setText(kDash);
    return;
  }
  hud_["DECODE TPS"]->setText(fixed(s->output_rate.per_second, 1));
  hud_["ACCEPT/STEP"]->setText(fixed(s->summary.accept_per_step, 2));
  hud_["TTFT p50"]->setText(s->summary.ttft_ms.p50 ? fixed(*s->summary.ttft_ms.p50, 0) + " ms"
                                                   : kDash);
}

void LivePage::update_charts() {
  QList<QPointF> tps, accept, draft_ms, verify_ms, p50, p99, ttft50, ttft99, gb_s;
  std::map<std::string, QList<QPointF>> kv;
  for (const Sample& x : samples_) {
    tps.append({x.t_s, x.decode_tok_s});
    if (x.accept_per_step) accept.append({x.t_s, *x.accept_per_step});
    if (x.draft_ms) draft_ms.append({x.t_s, *x.draft_ms});
    if (x.verify_ms) verify_ms.append({x.t_s, *x.verify_ms});
    if (x.itl_p50_ms) p50.append({x.t_s, *x.itl_p50_ms});
    if (x.itl_p99_ms) p99.append({x.t_s, *x.itl_p99_ms});
    if (x.ttft_p50_ms) ttft50.append({x.t_s, *x.ttft_p50_ms});
    if (x.ttft_p99_ms) ttft99.append({x.t_s, *x.ttft_p99_ms});
    if (x.transfer_gb_s) gb_s.append({x.t_s, *x.transfer_gb_s});
    for (const auto& [device, pct] : x.kv_used_pct) kv[device].append({x.t_s, pct});
  }
  tps_chart_->set_points("decode_tps", tps);
  update_request_series();
  accept_chart_->set_points("accept_per_step", accept);
  accept_chart_->set_points("draft_ms", draft_ms);
  accept_chart_->set_points("verify_ms", verify_ms);
  itl_chart_->set_points("itl_p50", p50);
  itl_chart_->set_points("itl_p99", p99);
  ttft_chart_->set_points("ttft_p50", ttft50);
  ttft_chart_->set_points("ttft_p99", ttft99);
  transfer_chart_->set_points("transfer_gb_s", gb_s);
  for (const auto& [device, points] : kv) {
    const QString key = "kv:" + QString::fromStdString(device);
    kv_chart_->ensure_series(key, QString::fromStdString(device));
    kv_chart_->set_points(key, points);
  }
  const double x_max = samples_.empty() ? 60.0 : samples_.back().t_s;
  const double x_min = samples_.empty() ? 0.0 : samples_.front().t_s;
  for (TimeChart* chart : {tps_chart_, request_chart_, accept_chart_, itl_chart_, ttft_chart_,
                           kv_chart_, transfer_chart_})
    chart->fit_axes(x_min, x_max);
}

int LivePage::points(const QString& series) const {
  for (const TimeChart* chart : {tps_chart_, request_chart_, accept_chart_, itl_chart_, ttft_chart_,
                                 kv_chart_, transfer_chart_})
    if (chart->has_series(series)) return chart->points(series);
  return -1;
}

QString LivePage::hud_text(const QString& name) const {
  const auto it = hud_.find(name);
  return it == hud_.end() ? QString() : it->second->text();
}

void LivePage::set_paused(bool paused) {
  paused_ = paused;
  if (pause_button_->isChecked() != paused) pause_button_->setChecked(paused);
  pause_button_->setText(paused ? "Resume" : "Pause");
  if (!paused) hud_["TOKENS"]->setText(QString::number(tokens_seen_));
}

void LivePage::reset() {
  samples_.clear();
  devices_.clear();
  origin_.reset();
  last_transfer_.reset();
  tokens_seen_ = 0;
  for (TimeChart* chart :
       {tps_chart_, accept_chart_, itl_chart_, ttft_chart_, kv_chart_, transfer_chart_})
    chart->clear_points();
  for (const QString& key : request_chart_->series_keys()) request_chart_->remove_series(key);
  // The bars count from here on: what the engine had counted so far becomes the baseline.
  bars_base_ = last_counts_;
  accept_length_chart_->set_bars({}, {});
  position_chart_->set_bars({}, {});
  update_hud(nullptr);
}

bool LivePage::export_csv(const QString& path) const {
  QSaveFile file(path);  // written to a temporary name, renamed on commit
  if (!file.open(QIODevice::WriteOnly | QIODevice::Text)) return false;
  QTextStream out(&file);
  out << "t_s,decode_tok_s,accept_per_step,draft_ms_per_step,verify_ms_per_step,itl_p50_ms,"
         "itl_p99_ms,ttft_p50_ms,ttft_p99_ms,transfer_gb_s";
  for (const std::string& device : devices_)
    out << ",kv_owned_pct:" << QString::fromStdString(device);
  out << "\n";
  for (const Sample& x : samples_) {
    out << QString::number(x.t_s, 'f', 3) << ',' << QString::number(x.decode_tok_s, 'g', 8) << ','
        << csv_cell(x.accept_per_step) << ',' << csv_cell(x.draft_ms) << ','
        << csv_cell(x.verify_ms) << ',' << csv_cell(x.itl_p50_ms) << ',' << csv_cell(x.itl_p99_ms)
        << ',' << csv_cell(x.ttft_p50_ms) << ',' << csv_cell(x.ttft_p99_ms) << ','
        << csv_cell(x.transfer_gb_s);
    for (const std::string& device : devices_) {
      const auto it = x.kv_used_pct.find(device);
      out << ',' << (it == x.kv_used_pct.end() ? QString() : QString::number(it->second, 'g', 6));
    }
    out << "\n";
  }
  out.flush();
  return out.status() == QTextStream::Ok && file.commit();
}

bool LivePage::export_png(const QString& path) {
  QSaveFile file(path);
  if (!file.open(QIODevice::WriteOnly)) return false;
  return grab().save(&file, "PNG") && file.commit();
}

void LivePage::choose_and_export_csv() {
  const QString path = QFileDialog::getSaveFileName(this, "Export the live window as CSV",
                                                    "tokenfab-live.csv", "CSV files (*.csv)");
  if (!path.isEmpty() && !export_csv(path))
    QMessageBox::warning(this, "Export CSV", QString("Could not write %1.").arg(path));
}

void LivePage::choose_and_export_png() {
  const QString path = QFileDialog::getSaveFileName(this, "Export the live page as PNG",
                                                    "tokenfab-live.png", "PNG images (*.png)");
  if (!path.isEmpty() && !export_png(path))
    QMessageBox::warning(this, "Export PNG", QString("Could not write %1.").arg(path));
}

}  // namespace tokenfab::ui
