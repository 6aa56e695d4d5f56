#pragma once
// ConversationListModel: the Chat page's list of conversations (core/storage/conversations.h),
// most recently active first, optionally filtered by a search text (title or any message).
// Display and edit role: the title (editing renames, emitting dataChanged for those roles).

#include <QAbstractListModel>
#include <QString>
#include <vector>

#include "core/storage/conversations.h"

namespace tokenfab::ui {

class ConversationListModel : public QAbstractListModel {
  Q_OBJECT

 public:
  enum Role {
    kIdRole = Qt::UserRole + 1,  // qint64
    kUpdatedRole,                // QDateTime, the last activity
  };

  // `db` outlives the model.
  explicit ConversationListModel(Database& db, QObject* parent = nullptr);

  int rowCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  bool setData(const QModelIndex& index, const QVariant& value, int role = Qt::EditRole) override;
  Qt::ItemFlags flags(const QModelIndex& index) const override;
  QHash<int, QByteArray> roleNames() const override;

  // Re-reads the list (a model reset); call after messages were added (the order changes).
  void reload();
  void set_filter(const QString& text);
  const QString& filter() const { return filter_; }

  int64_t id_at(int row) const;  // 0 for a row out of range
  int row_of(int64_t id) const;  // -1 when not listed
  int64_t create(const QString& title);
  bool rename(int64_t id, const QString& title);
  bool remove(int64_t id);

 private:
  Conversations store_;
  QString filter_;
  std::vector<ConversationRecord> rows_;
};

}  // namespace tokenfab::ui
