#pragma once
// ModelLibraryModel: the Models page's table — one row per GGUF file the model library knows
// (core/model/model_library.h: Tokenfab's cache, the user's folders, LM Studio, GPT4All, Ollama)
// and per file the user opened: name, source, family, parameters, type, bits per weight, context
// length, size, whether Tokenfab runs it, the memory it needs (weights + KV cache at the chosen
// context), the verdict, and one column per memory place of this machine (the host's RAM, each
// GPU's memory) saying whether it holds the model. The loaded model's row is marked.
//
// The rows come from describe_model() (headers only, read off the GUI thread by the page);
// set_context() re-judges every row from the numbers the headers gave (KV bytes per token), so a
// new context reads no file. Sort through a QSortFilterProxyModel on kSortRole.

#include <QAbstractTableModel>
#include <QString>
#include <QVariant>
#include <vector>

#include "core/model/model_library.h"

namespace tokenfab::ui {

class ModelLibraryModel : public QAbstractTableModel {
  Q_OBJECT

 public:
  // The fixed columns; the memory places follow them (kFirstPlace + i: places()[i]).
  enum Column {
    kName,
    kSource,
    kFamily,
    kParameters,
    kType,
    kBitsPerWeight,
    kContextLength,
    kSize,
    kRuns,
    kNeeds,
    kVerdict,
    kFirstPlace
  };
  // On any column: kPathRole the file (QString), kRunnableRole bool, kReasonRole why Tokenfab
  // cannot run it (empty when it can), kVerdictRole the FitVerdict (int), kLoadedRole whether it
  // is the loaded model, kOpenedRole whether the user opened it (not found by the library).
  // kSortRole: the column's value to sort by (a number for numeric columns, else the text).
  static constexpr int kSortRole = Qt::UserRole;
  static constexpr int kPathRole = Qt::UserRole + 1;
  static constexpr int kRunnableRole = Qt::UserRole + 2;
  static constexpr int kReasonRole = Qt::UserRole + 3;
  static constexpr int kVerdictRole = Qt::UserRole + 4;
  static constexpr int kLoadedRole = Qt::UserRole + 5;
  static constexpr int kOpenedRole = Qt::UserRole + 6;

  using QAbstractTableModel::QAbstractTableModel;

  // Replaces every row (a scan's result): `opened` are the files the user opened, listed with the
  // source "opened". Each row is judged at context() against `places`.
  void set_models(std::vector<ModelInfo> models, const std::vector<std::filesystem::path>& opened,
                  std::vector<MemoryPlace> places);
  // Appends one opened file, or replaces its row when listed; returns its row.
  int add_opened(ModelInfo model);
  // 0: each model's default_context (min(context length, 4096)). Emits dataChanged for the
  // memory, verdict and place columns.
  void set_context(int64_t context);
  int64_t context() const { return context_; }
  // The loaded model's file ("" for none); its row is drawn bold with a mark.
  void set_loaded_path(const QString& path);

  int row_of(const QString& path) const;  // -1 when absent; paths compared canonically
  const ModelInfo& model(int row) const { return rows_.at(static_cast<size_t>(row)).info; }
  const std::vector<MemoryPlace>& places() const { return places_; }

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation orientation,
                      int role = Qt::DisplayRole) const override;

  // "2.1K", "135.0M", "7.24B".
  static QString parameters_text(uint64_t parameters);

 private:
  struct Row {
    ModelInfo info;
    QString key;  // canonical path
    bool opened = false;
  };

  void judge(Row& row) const;  // memory.context and fit at context_ against places_
  QVariant display(const Row& row, int column) const;
  QVariant sort_value(const Row& row, int column) const;
  QVariant tooltip(const Row& row, int column) const;
  QVariant place_cell(const Row& row, const MemoryPlace& place, int role) const;

  std::vector<Row> rows_;
  std::vector<MemoryPlace> places_;
  int64_t context_ = 0;
  QString loaded_key_;
};

}  // namespace tokenfab::ui
