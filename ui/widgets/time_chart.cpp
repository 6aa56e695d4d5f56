#include "ui/widgets/time_chart.h"

#include <QChart>
#include <QLineSeries>
#include <QValueAxis>
#include <algorithm>

namespace tokenfab::ui {

TimeChart::TimeChart(const QString& title, const QString& y_title, QWidget* parent)
    : QChartView(parent) {
  auto* chart = new QChart();
  chart->setTitle(title);
  chart->setAnimationOptions(QChart::NoAnimation);
  chart->legend()->setAlignment(Qt::AlignBottom);
  chart->setMargins(QMargins(4, 4, 4, 4));
  x_axis_ = new QValueAxis(chart);
  x_axis_->setTitleText("s");
  x_axis_->setLabelFormat("%.1f");
  y_axis_ = new QValueAxis(chart);
  y_axis_->setTitleText(y_title);
  y_axis_->setLabelFormat("%.3g");
  chart->addAxis(x_axis_, Qt::AlignBottom);
  chart->addAxis(y_axis_, Qt::AlignLeft);
  setChart(chart);  // the view owns the chart
  setRenderHint(QPainter::Antialiasing, false);
  setMinimumHeight(160);
  fit_axes(0, 60);
}

void TimeChart::ensure_series(const QString& key, const QString& label) {
  if (series_.count(key)) return;
  auto* series = new QLineSeries();
  series->setName(label);
  series->setUseOpenGL(false);
  chart()->addSeries(series);
  series->attachAxis(x_axis_);
  series->attachAxis(y_axis_);
  series_[key] = series;
}

void TimeChart::use_right_axis(const QString& key, const QString& title) {
  const auto it = series_.find(key);
  if (it == series_.end()) return;
  if (!right_axis_) {
    right_axis_ = new QValueAxis(chart());
    right_axis_->setLabelFormat("%.3g");
    chart()->addAxis(right_axis_, Qt::AlignRight);
  }
  right_axis_->setTitleText(title);
  if (on_right_.insert(key).second) {
    it->second->detachAxis(y_axis_);
    it->second->attachAxis(right_axis_);
  }
}

void TimeChart::remove_series(const QString& key) {
  const auto it = series_.find(key);
  if (it == series_.end()) return;
  on_right_.erase(key);
  chart()->removeSeries(it->second);
  delete it->second;
  series_.erase(it);
}

QStringList TimeChart::series_keys() const {
  QStringList keys;
  for (const auto& [key, series] : series_) keys << key;
  return keys;
}

void TimeChart::set_points(const QString& key, const QList<QPointF>& points) {
  const auto it = series_.find(key);
  if (it != series_.end()) it->second->replace(points);
}

int TimeChart::points(const QString& key) const {
  const auto it = series_.find(key);
  return it == series_.end() ? -1 : static_cast<int>(it->second->count());
}

void TimeChart::clear_points() {
  for (auto& [key, series] : series_) series->clear();
  fit_axes(0, 60);
}

void TimeChart::fit_axes(double x_min, double x_max) {
  x_axis_->setRange(x_min, std::max(x_max, x_min + 1.0));
  for (const bool right : {false, true}) {
    QValueAxis* axis = right ? right_axis_ : y_axis_;
    if (!axis) continue;
    double y_min = 0.0, y_max = 0.0;
    for (const auto& [key, series] : series_) {
      if (on_right_.count(key) != (right ? 1u : 0u)) continue;
      for (const QPointF& p : series->points()) {
        y_min = std::min(y_min, p.y());
        y_max = std::max(y_max, p.y());
      }
    }
    if (y_max <= y_min) y_max = y_min + 1.0;
    axis->setRange(y_min, y_max * 1.1);
  }
}

std::pair<double, double> TimeChart::x_range() const {
  return {x_axis_->min(), x_axis_->max()};
}

}  // namespace tokenfab::ui
