#include "ui/models/run_table_model.h"

#include <QDateTime>
#include <cmath>
#include <limits>
#include <map>

#include <nlohmann/json.hpp>

namespace tokenfab::ui {

namespace {

constexpr int kFirstFigure = RunTableModel::kTokPerS;
constexpr int kFigureCount = RunTableModel::kColumnCount - kFirstFigure;

// For each figure column, the flattened summary keys that fill it, first found wins.
const std::vector<std::vector<QString>>& figure_keys() {
  static const std::vector<std::vector<QString>> keys = {
      {"throughput_tok_s", "decode_tok_s"},
      {"ttft_ms.p50"},
      {"itl_ms.p50"},
      {"itl_ms.p99"},
      {"accept_per_step"},
      {"speedup"},
  };
  return keys;
}

const QStringList kHeaders = {"Time",        "Kind",          "Title",        "Model",
                              "Tok/s",       "TTFT p50 (ms)", "ITL p50 (ms)", "ITL p99 (ms)",
                              "ACCEPT/STEP", "Speedup"};

void flatten_into(const nlohmann::ordered_json& value, const QString& key,
                  std::vector<std::pair<QString, QVariant>>& out) {
  const QString prefix = key.isEmpty() ? key : key + QLatin1Char('.');
  if (value.is_object()) {
    for (const auto& [name, child] : value.items())
      flatten_into(child, prefix + QString::fromStdString(name), out);
  } else if (value.is_array()) {
    for (size_t i = 0; i < value.size(); ++i)
      flatten_into(value[i], prefix + QString::number(i), out);
  } else if (value.is_number()) {
    out.emplace_back(key, value.get<double>());
  } else if (value.is_boolean()) {
    out.emplace_back(key, value.get<bool>());
  } else if (value.is_string()) {
    out.emplace_back(key, QString::fromStdString(value.get<std::string>()));
  } else {
    out.emplace_back(key, QVariant());
  }
}

QString format_figure(double v) {
  if (std::isnan(v)) return {};
  const double magnitude = std::fabs(v);
  return QString::number(v, 'f', magnitude >= 100 ? 1 : (magnitude >= 1 ? 2 : 3));
}

}  // namespace

std::vector<std::pair<QString, QVariant>> flatten_json(const std::string& json_text) {
  std::vector<std::pair<QString, QVariant>> out;
  // ordered_json keeps the document's key order (the writer's grouping of related figures).
  const nlohmann::ordered_json parsed = nlohmann::ordered_json::parse(json_text, nullptr, false);
  if (parsed.is_discarded() || !parsed.is_object()) return out;
  flatten_into(parsed, {}, out);
  return out;
}

void RunTableModel::set_runs(std::vector<RunRecord> runs) {
  beginResetModel();
  runs_ = std::move(runs);
  figures_.assign(runs_.size(), std::vector<double>(kFigureCount, std::nan("")));
  for (size_t row = 0; row < runs_.size(); ++row) {
    std::map<QString, double> numbers;
    for (const auto& [key, value] : flatten_json(runs_[row].summary_json))
      if (value.typeId() == QMetaType::Double) numbers[key] = value.toDouble();
    for (int f = 0; f < kFigureCount; ++f) {
      for (const QString& key : figure_keys()[static_cast<size_t>(f)]) {
        if (const auto it = numbers.find(key); it != numbers.end()) {
          figures_[row][static_cast<size_t>(f)] = it->second;
          break;
        }
      }
    }
  }
  endResetModel();
}

int RunTableModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(runs_.size());
}

int RunTableModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : kColumnCount;
}

QVariant RunTableModel::data(const QModelIndex& index, int role) const {
  if (!checkIndex(index, CheckIndexOption::IndexIsValid | CheckIndexOption::ParentIsInvalid))
    return {};
  const RunRecord& r = runs_[static_cast<size_t>(index.row())];
  const int column = index.column();
  if (role == kIdRole) return QVariant::fromValue<qint64>(r.id);
  if (role == kKindRole) return QString::fromStdString(r.kind);
  const bool is_figure = column >= kFirstFigure;
  const double figure =
      is_figure ? figures_[static_cast<size_t>(index.row())][column - kFirstFigure] : 0.0;
  if (role == kValueRole) return is_figure && !std::isnan(figure) ? QVariant(figure) : QVariant();
  if (role == Qt::TextAlignmentRole && is_figure)
    return QVariant::fromValue(Qt::AlignRight | Qt::AlignVCenter);
  if (role == Qt::ToolTipRole && column == kTitle)
    return QStringLiteral("%1\n%2").arg(QString::fromStdString(r.title),
                                        QString::fromStdString(r.config_json));
  if (role != Qt::DisplayRole) return {};
  switch (column) {
    case kTime:
      return QDateTime::fromMSecsSinceEpoch(r.created_at_ms)
          .toString(QStringLiteral("yyyy-MM-dd hh:mm:ss"));
    case kKind:
      return QString::fromStdString(r.kind);
    case kTitle:
      return QString::fromStdString(r.title);
    case kModel:
      return QString::fromStdString(r.model);
    default:
      return format_figure(figure);
  }
}

QVariant RunTableModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (role != Qt::DisplayRole || orientation != Qt::Horizontal) return {};
  if (section < 0 || section >= kColumnCount) return {};
  return kHeaders[section];
}

}  // namespace tokenfab::ui
