#include "ui/widgets/bar_chart.h"

#include <QBarCategoryAxis>
#include <QBarSeries>
#include <QBarSet>
#include <QChart>
#include <QValueAxis>
#include <algorithm>

namespace tokenfab::ui {

BarChart::BarChart(const QString& title, const QString& bar_label, const QString& y_title,
                   std::optional<double> y_max, QWidget* parent)
    : QChartView(parent), y_max_(y_max) {
  auto* chart = new QChart();
  chart->setTitle(title);
  chart->setAnimationOptions(QChart::NoAnimation);
  chart->legend()->setVisible(false);
  chart->setMargins(QMargins(4, 4, 4, 4));
  set_ = new QBarSet(bar_label);
  series_ = new QBarSeries();
  series_->append(set_);
  chart->addSeries(series_);
  x_axis_ = new QBarCategoryAxis(chart);
  y_axis_ = new QValueAxis(chart);
  y_axis_->setTitleText(y_title);
  y_axis_->setLabelFormat("%.3g");
  chart->addAxis(x_axis_, Qt::AlignBottom);
  chart->addAxis(y_axis_, Qt::AlignLeft);
  series_->attachAxis(x_axis_);
  series_->attachAxis(y_axis_);
  setChart(chart);  // the view owns the chart
  setRenderHint(QPainter::Antialiasing, false);
  setMinimumHeight(160);
  y_axis_->setRange(0, y_max_.value_or(1.0));
}

void BarChart::set_bars(const QStringList& categories, const QList<qreal>& values) {
  if (categories != categories_) {
    x_axis_->clear();
    x_axis_->append(categories);
    categories_ = categories;
  }
  set_->remove(0, set_->count());
  set_->append(values);
  double top = 0.0;
  for (qreal v : values) top = std::max(top, static_cast<double>(v));
  y_axis_->setRange(0, y_max_.value_or(top > 0 ? top * 1.1 : 1.0));
}

int BarChart::bars() const { return set_->count(); }

QList<qreal> BarChart::values() const {
  QList<qreal> out;
  for (int i = 0; i < set_->count(); ++i) out << set_->at(i);
  return out;
}

}  // namespace tokenfab::ui
