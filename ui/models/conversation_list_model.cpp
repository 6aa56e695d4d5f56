#include "ui/models/conversation_list_model.h"

#include <QDateTime>

namespace tokenfab::ui {

ConversationListModel::ConversationListModel(Database& db, QObject* parent)
    : QAbstractListModel(parent), store_(db) {
  rows_ = store_.list();
}

int ConversationListModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(rows_.size());
}

QVariant ConversationListModel::data(const QModelIndex& index, int role) const {
  if (!checkIndex(index, CheckIndexOption::IndexIsValid | CheckIndexOption::ParentIsInvalid))
    return {};
  const ConversationRecord& c = rows_[static_cast<size_t>(index.row())];
  switch (role) {
    case Qt::DisplayRole:
    case Qt::EditRole:
      return QString::fromStdString(c.title);
    case Qt::ToolTipRole:
      return QStringLiteral("%1 — last active %2")
          .arg(QString::fromStdString(c.title),
               QDateTime::fromSecsSinceEpoch(c.updated_unix).toString(Qt::ISODate));
    case kIdRole:
      return QVariant::fromValue<qint64>(c.id);
    case kUpdatedRole:
      return QDateTime::fromSecsSinceEpoch(c.updated_unix);
    default:
      return {};
  }
}

bool ConversationListModel::setData(const QModelIndex& index, const QVariant& value, int role) {
  if (role != Qt::EditRole ||
      !checkIndex(index, CheckIndexOption::IndexIsValid | CheckIndexOption::ParentIsInvalid))
    return false;
  const QString title = value.toString().trimmed();
  if (title.isEmpty()) return false;
  ConversationRecord& c = rows_[static_cast<size_t>(index.row())];
  if (!store_.rename(c.id, title.toStdString())) return false;
  c.title = title.toStdString();
  emit dataChanged(index, index, {Qt::DisplayRole, Qt::EditRole, Qt::ToolTipRole});
  return true;
}

Qt::ItemFlags ConversationListModel::flags(const QModelIndex& index) const {
  if (!index.isValid()) return Qt::NoItemFlags;
  return QAbstractListModel::flags(index) | Qt::ItemIsEditable;
}

QHash<int, QByteArray> ConversationListModel::roleNames() const {
  QHash<int, QByteArray> names = QAbstractListModel::roleNames();
  names[kIdRole] = "conversationId";
  names[kUpdatedRole] = "updated";
  return names;
}

void ConversationListModel::reload() {
  beginResetModel();
  rows_ = store_.search(filter_.toStdString());
  endResetModel();
}

void ConversationListModel::set_filter(const QString& text) {
  filter_ = text;
  reload();
}

int64_t ConversationListModel::id_at(int row) const {
  if (row < 0 || row >= static_cast<int>(rows_.size())) return 0;
  return rows_[static_cast<size_t>(row)].id;
}

int ConversationListModel::row_of(int64_t id) const {
  for (size_t i = 0; i < rows_.size(); ++i)
    if (rows_[i].id == id) return static_cast<int>(i);
  return -1;
}

int64_t ConversationListModel::create(const QString& title) {
  const int64_t id = store_.create(title.toStdString());
  reload();
  return id;
}

bool ConversationListModel::rename(int64_t id, const QString& title) {
  const int row = row_of(id);
  if (row < 0) return store_.rename(id, title.toStdString());
  return setData(index(row), title, Qt::EditRole);
}

bool ConversationListModel::remove(int64_t id) {
  if (!store_.remove(id)) return false;
  if (const int row = row_of(id); row >= 0) {
    beginRemoveRows({}, row, row);
    rows_.erase(rows_.begin() + row);
    endRemoveRows();
  }
  return true;
}

}  // namespace tokenfab::ui
