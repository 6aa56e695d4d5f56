#pragma once
// BarChart: one set of bars over named categories (an accept-length histogram, acceptance per
// draft position), replaced wholesale on each update with animations off, the y axis fitted to
// the data (or fixed to a range such as 0–100 %).

#include <QChartView>
#include <QList>
#include <QStringList>
#include <optional>

class QBarSeries;
class QBarSet;
class QBarCategoryAxis;
class QValueAxis;

namespace tokenfab::ui {

class BarChart : public QChartView {
 public:
  // `y_max`: a fixed top for the y axis (e.g. 100 for percentages); fitted to the data otherwise.
  BarChart(const QString& title, const QString& bar_label, const QString& y_title,
           std::optional<double> y_max = std::nullopt, QWidget* parent = nullptr);

  // Replaces the bars: values[i] is the height of categories[i] (the lists have equal length).
  void set_bars(const QStringList& categories, const QList<qreal>& values);
  int bars() const;  // bars shown now
  QList<qreal> values() const;
  QStringList categories() const { return categories_; }

 private:
  QBarSeries* series_ = nullptr;
  QBarSet* set_ = nullptr;
  QBarCategoryAxis* x_axis_ = nullptr;
  QValueAxis* y_axis_ = nullptr;
  QStringList categories_;
  std::optional<double> y_max_;
};

}  // namespace tokenfab::ui
