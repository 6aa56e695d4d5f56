#pragma once
// TimeChart: a Qt Charts line chart of a few series against time (seconds), built for live data
// the way the Qt Charts oscilloscope example does it — animations off, each series' points
// swapped in with replace() (one repaint per update, no per-point signals), axes set from the
// data. Series are keyed by a short stable name ("decode_tps", "kv:cpu:0") and labelled for the
// legend.

#include <QChartView>
#include <QList>
#include <QPointF>
#include <QString>
#include <QStringList>
#include <map>
#include <set>
#include <utility>

class QLineSeries;
class QValueAxis;

namespace tokenfab::ui {

class TimeChart : public QChartView {
  Q_OBJECT

 public:
  // `y_title` names the unit ("tok/s", "ms", "%").
  TimeChart(const QString& title, const QString& y_title, QWidget* parent = nullptr);

  // Adds the series when it is new; a no-op otherwise.
  void ensure_series(const QString& key, const QString& label);
  bool has_series(const QString& key) const { return series_.count(key) != 0; }
  // Moves `key`'s series (which ensure_series made) onto a second y axis on the right, titled
  // `title` and fitted to the series on it alone: for a quantity of another scale beside the
  // others (ACCEPT/STEP beside a loss). A no-op for an unknown key.
  void use_right_axis(const QString& key, const QString& title);
  // Removes the series when it exists.
  void remove_series(const QString& key);
  // Keys of the series, in key order.
  QStringList series_keys() const;
  // Replaces the points of `key` (which ensure_series made).
  void set_points(const QString& key, const QList<QPointF>& points);
  int points(const QString& key) const;  // -1 when the series does not exist
  // Empties every series and resets the axes.
  void clear_points();
  // x range [x_min, x_max] seconds; each y axis from 0 (or its data's minimum, when negative) to
  // a little above the largest point of its series (1 when there are none).
  void fit_axes(double x_min, double x_max);
  std::pair<double, double> x_range() const;  // the x axis' (min, max)

 private:
  std::map<QString, QLineSeries*> series_;
  QValueAxis* x_axis_ = nullptr;
  QValueAxis* y_axis_ = nullptr;
  QValueAxis* right_axis_ = nullptr;  // made by the first use_right_axis
  std::set<QString> on_right_;
};

}  // namespace tokenfab::ui
