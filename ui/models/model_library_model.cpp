#include "ui/models/model_library_model.h"

#include <QBrush>
#include <QColor>
#include <QFileInfo>
#include <QFont>
#include <algorithm>

namespace tokenfab::ui {

namespace {

const QStringList kHeaders = {"Name",    "Source", "Family", "Parameters", "Type",   "Bits/weight",
                              "Context", "Size",   "Runs",   "Needs",      "Verdict"};

QString from_std(const std::string& s) {
  return QString::fromStdString(s);
}

QString key_of(const QString& path) {
  const QFileInfo info(path);
  const QString canonical = info.canonicalFilePath();
  return canonical.isEmpty() ? info.absoluteFilePath() : canonical;
}

QString key_of(const std::filesystem::path& path) {
  return key_of(from_std(path.string()));
}

QColor verdict_color(FitVerdict verdict) {
  switch (verdict) {
    case FitVerdict::kFits:
      return QColor(0x2e, 0x7d, 0x32);  // green
    case FitVerdict::kFitsOnOneDeviceOnly:
      return QColor(0xb2, 0x6a, 0x00);  // amber
    case FitVerdict::kDoesNotFit:
      break;
  }
  return QColor(0xc6, 0x28, 0x28);  // red
}

// "Q4_K 71.2% · Q6_K 20.3% · F32 0.1%", by share of the weights' bytes, largest first.
QString type_mix_text(const gguf::TypeMix& mix) {
  std::vector<std::pair<double, std::string>> shares;
  for (const auto& [type, share] : mix.by_type) shares.emplace_back(mix.bytes_fraction(type), type);
  std::sort(shares.rbegin(), shares.rend());
  QStringList parts;
  for (const auto& [fraction, type] : shares)
    parts << QStringLiteral("%1 %2%").arg(from_std(type)).arg(100.0 * fraction, 0, 'f', 1);
  return parts.join(QStringLiteral(" · "));
}

}  // namespace

QString ModelLibraryModel::parameters_text(uint64_t parameters) {
  const double n = static_cast<double>(parameters);
  if (parameters >= 1'000'000'000) return QStringLiteral("%1B").arg(n / 1e9, 0, 'f', 2);
  if (parameters >= 1'000'000) return QStringLiteral("%1M").arg(n / 1e6, 0, 'f', 1);
  return QStringLiteral("%1K").arg(n / 1e3, 0, 'f', 1);
}

void ModelLibraryModel::set_models(std::vector<ModelInfo> models,
                                   const std::vector<std::filesystem::path>& opened,
                                   std::vector<MemoryPlace> places) {
  std::vector<QString> opened_keys;
  for (const auto& path : opened) opened_keys.push_back(key_of(path));
  beginResetModel();
  places_ = std::move(places);
  rows_.clear();
  for (ModelInfo& m : models) {
    QString key = key_of(m.found.path);
    Row row{std::move(m), std::move(key), false};
    row.opened = std::find(opened_keys.begin(), opened_keys.end(), row.key) != opened_keys.end();
    judge(row);
    rows_.push_back(std::move(row));
  }
  endResetModel();
}

int ModelLibraryModel::add_opened(ModelInfo model) {
  Row row{std::move(model), {}, true};
  row.key = key_of(row.info.found.path);
  judge(row);
  const int existing = row_of(row.key);
  if (existing >= 0) {
    row.opened = rows_[static_cast<size_t>(existing)].opened;  // a library file stays one
    rows_[static_cast<size_t>(existing)] = std::move(row);
    emit dataChanged(index(existing, 0), index(existing, columnCount() - 1));
    return existing;
  }
  const int at = rowCount();
  beginInsertRows({}, at, at);
  rows_.push_back(std::move(row));
  endInsertRows();
  return at;
}

void ModelLibraryModel::judge(Row& row) const {
  ModelInfo& m = row.info;
  m.memory.context = context_ > 0 ? context_ : default_context(m.context_length);
  m.fit = assess_fit(m.memory, places_);
}

void ModelLibraryModel::set_context(int64_t context) {
  if (context == context_) return;
  context_ = context;
  for (Row& row : rows_) judge(row);
  if (rows_.empty()) return;
  emit dataChanged(index(0, kNeeds), index(rowCount() - 1, columnCount() - 1),
                   {Qt::DisplayRole, Qt::ToolTipRole, Qt::ForegroundRole, kSortRole, kVerdictRole});
}

void ModelLibraryModel::set_loaded_path(const QString& path) {
  const QString key = path.isEmpty() ? QString() : key_of(path);
  if (key == loaded_key_) return;
  const int before = loaded_key_.isEmpty() ? -1 : row_of(loaded_key_);
  loaded_key_ = key;
  const int after = key.isEmpty() ? -1 : row_of(key);
  for (int row : {before, after}) {
    if (row < 0) continue;
    emit dataChanged(index(row, 0), index(row, columnCount() - 1),
                     {Qt::DisplayRole, Qt::FontRole, Qt::ToolTipRole, kLoadedRole});
  }
}

int ModelLibraryModel::row_of(const QString& path) const {
  const QString key = key_of(path);
  for (size_t i = 0; i < rows_.size(); ++i)
    if (rows_[i].key == key) return static_cast<int>(i);
  return -1;
}

int ModelLibraryModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(rows_.size());
}

int ModelLibraryModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : kFirstPlace + static_cast<int>(places_.size());
}

QVariant ModelLibraryModel::data(const QModelIndex& index, int role) const {
  if (!checkIndex(index, CheckIndexOption::IndexIsValid | CheckIndexOption::ParentIsInvalid))
    return {};
  const Row& row = rows_[static_cast<size_t>(index.row())];
  const ModelInfo& m = row.info;
  const int column = index.column();
  const bool loaded = !loaded_key_.isEmpty() && row.key == loaded_key_;
  switch (role) {
    case kPathRole:
      return from_std(m.found.path.string());
    case kRunnableRole:
      return m.runnable;
    case kReasonRole:
      return from_std(m.not_runnable_because);
    case kVerdictRole:
      return static_cast<int>(m.fit.verdict);
    case kLoadedRole:
      return loaded;
    case kOpenedRole:
      return row.opened;
    case kSortRole:
      return sort_value(row, column);
    case Qt::DisplayRole:
      return display(row, column);
    case Qt::ToolTipRole:
      return tooltip(row, column);
    case Qt::FontRole:
      if (loaded || column == kVerdict) {
        QFont font;
        font.setBold(true);
        return font;
      }
      return {};
    case Qt::ForegroundRole:
      if (column == kVerdict) return QBrush(verdict_color(m.fit.verdict));
      if (column == kRuns && !m.runnable) return QBrush(verdict_color(FitVerdict::kDoesNotFit));
      break;
    case Qt::TextAlignmentRole:
      if (column == kParameters || column == kBitsPerWeight || column == kContextLength ||
          column == kSize || column == kNeeds)
        return QVariant::fromValue(Qt::AlignRight | Qt::AlignVCenter);
      return {};
    default:
      break;
  }
  if (column >= kFirstPlace && role == Qt::ForegroundRole)
    return place_cell(row, places_[static_cast<size_t>(column - kFirstPlace)], role);
  return {};
}

QVariant ModelLibraryModel::display(const Row& row, int column) const {
  const ModelInfo& m = row.info;
  const bool loaded = !loaded_key_.isEmpty() && row.key == loaded_key_;
  switch (column) {
    case kName:
      return loaded ? QStringLiteral("● %1").arg(from_std(m.name)) : from_std(m.name);
    case kSource:
      return row.opened ? QStringLiteral("opened")
                        : QString::fromLatin1(source_name(m.found.source));
    case kFamily:
      return m.family.empty() ? QStringLiteral("?") : from_std(m.family);
    case kParameters:
      return parameters_text(m.type_mix.elements);
    case kType:
      return m.file_type ? from_std(*m.file_type) : QStringLiteral("?");
    case kBitsPerWeight:
      return QString::number(m.type_mix.bits_per_weight(), 'f', 2);
    case kContextLength:
      return m.context_length > 0 ? QString::number(m.context_length) : QStringLiteral("?");
    case kSize:
      return from_std(bytes_text(m.file_size));
    case kRuns:
      return m.runnable ? QStringLiteral("yes") : QStringLiteral("no");
    case kNeeds:
      return QStringLiteral("%1 @ %2%3")
          .arg(from_std(bytes_text(m.memory.total_bytes())))
          .arg(m.memory.context)
          .arg(m.kv_note.empty() ? QString() : QStringLiteral(" (no KV)"));
    case kVerdict:
      return QString::fromLatin1(verdict_text(m.fit.verdict));
    default:
      break;
  }
  const MemoryPlace& place = places_[static_cast<size_t>(column - kFirstPlace)];
  return place_cell(row, place, Qt::DisplayRole);
}

QVariant ModelLibraryModel::place_cell(const Row& row, const MemoryPlace& place, int role) const {
  const ModelInfo& m = row.info;
  const bool holds =
      std::find(m.fit.fits_on.begin(), m.fit.fits_on.end(), place.name) != m.fit.fits_on.end();
  if (role == Qt::ForegroundRole)
    return QBrush(verdict_color(holds ? FitVerdict::kFits : FitVerdict::kDoesNotFit));
  const double share = place.available_bytes > 0 ? static_cast<double>(m.memory.total_bytes()) /
                                                       static_cast<double>(place.available_bytes)
                                                 : 0.0;
  if (role == kSortRole) return share;
  if (role == Qt::ToolTipRole)
    return QStringLiteral("%1: needs %2 of %3 available (%4 total)")
        .arg(from_std(place.name), from_std(bytes_text(m.memory.total_bytes())),
             from_std(bytes_text(place.available_bytes)), from_std(bytes_text(place.total_bytes)));
  const QString percent = place.available_bytes > 0
                              ? QStringLiteral(" (%1% of free)").arg(100.0 * share, 0, 'f', 1)
                              : QString();
  return (holds ? QStringLiteral("fits") : QStringLiteral("too small")) + percent;
}

QVariant ModelLibraryModel::sort_value(const Row& row, int column) const {
  const ModelInfo& m = row.info;
  switch (column) {
    case kParameters:
      return QVariant::fromValue<qulonglong>(m.type_mix.elements);
    case kBitsPerWeight:
      return m.type_mix.bits_per_weight();
    case kContextLength:
      return QVariant::fromValue<qlonglong>(m.context_length);
    case kSize:
      return QVariant::fromValue<qulonglong>(m.file_size);
    case kNeeds:
      return QVariant::fromValue<qulonglong>(m.memory.total_bytes());
    case kVerdict:
      return static_cast<int>(m.fit.verdict);
    case kName:
      return from_std(m.name).toLower();  // without the loaded mark
    default:
      break;
  }
  if (column >= kFirstPlace)
    return place_cell(row, places_[static_cast<size_t>(column - kFirstPlace)], kSortRole);
  return display(row, column).toString().toLower();
}

QVariant ModelLibraryModel::tooltip(const Row& row, int column) const {
  const ModelInfo& m = row.info;
  switch (column) {
    case kName: {
      QString tip = from_std(m.found.path.string());
      if (m.found.parts.size() > 1)
        tip += QStringLiteral("\n%1 parts").arg(static_cast<qsizetype>(m.found.parts.size()));
      if (!loaded_key_.isEmpty() && row.key == loaded_key_)
        tip += QStringLiteral("\nThe loaded model");
      return tip;
    }
    case kType:
      return type_mix_text(m.type_mix);
    case kRuns:
      return m.runnable ? QStringLiteral("Tokenfab runs this model")
                        : from_std(m.not_runnable_because);
    case kNeeds:
      return QStringLiteral("weights %1 + KV cache %2 (%3 per token × %4 tokens, fp16)%5")
          .arg(from_std(bytes_text(m.memory.weight_bytes)),
               from_std(bytes_text(m.memory.kv_bytes())),
               from_std(bytes_text(m.memory.kv_bytes_per_token)))
          .arg(m.memory.context)
          .arg(m.kv_note.empty() ? QString() : QStringLiteral("\n") + from_std(m.kv_note));
    case kVerdict:
      return from_std(m.fit.explanation);
    default:
      break;
  }
  if (column >= kFirstPlace)
    return place_cell(row, places_[static_cast<size_t>(column - kFirstPlace)], Qt::ToolTipRole);
  return {};
}

QVariant ModelLibraryModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (orientation != Qt::Horizontal || section < 0 || section >= columnCount()) return {};
  if (section < kFirstPlace) {
    if (role == Qt::DisplayRole) return kHeaders[section];
    if (role == Qt::ToolTipRole && section == kNeeds)
      return QStringLiteral("The weights + the KV cache (fp16) at @context tokens");
    return {};
  }
  const MemoryPlace& place = places_[static_cast<size_t>(section - kFirstPlace)];
  if (role == Qt::DisplayRole)
    return QStringLiteral("%1 (%2 free)")
        .arg(place.is_host ? QStringLiteral("RAM") : from_std(place.name),
             from_std(bytes_text(place.available_bytes)));
  if (role == Qt::ToolTipRole)
    return QStringLiteral("%1: %2 available of %3")
        .arg(from_std(place.name), from_std(bytes_text(place.available_bytes)),
             from_std(bytes_text(place.total_bytes)));
  return {};
}

}  // namespace tokenfab::ui
