#pragma once
// BlockMap: one painted cell per KV block of one device's pool, coloured by state — free: dark
// grey; cached (prefix cache, no owner): teal; owned: a colour hashed from the owning sequence,
// lighter when the block is shared (ref count > 1). A legend sits under the cells; hovering a
// cell shows the block's record as a tooltip; clicking emits blockClicked(id).
//
// Responsiveness with 100k+ blocks: the cells are rendered into a QImage once per snapshot (and
// once per resize), one filled square per block, cell size the largest integer (≥ 1 px) that
// fits; paintEvent only blits that image. Hit-testing is arithmetic on the cell grid.

#include <QImage>
#include <QRect>
#include <QWidget>
#include <optional>

#include "core/kvcache/kv_snapshot.h"

namespace tokenfab::ui {

class BlockMap : public QWidget {
  Q_OBJECT

 public:
  explicit BlockMap(QWidget* parent = nullptr);

  // Copies the snapshot (the records are needed for tooltips) and schedules one image rebuild.
  void set_snapshot(const KvSnapshot& snapshot);
  const KvSnapshot& snapshot() const { return snapshot_; }

  int cells() const { return snapshot_.n_blocks; }
  int used_cells() const { return used_cells_; }  // owned + cached cells as drawn
  int image_rebuilds() const { return image_rebuilds_; }

  // The block under `pos` (widget coordinates), or -1.
  int block_at(const QPoint& pos) const;
  // Outlines a block (-1: none); the page calls it for the clicked block.
  void set_selected(int block);
  int selected() const { return selected_; }

  // The colour of a cell; public so legends and tables elsewhere can match it.
  static QRgb cell_color(const BlockRecord& record);
  // Multi-line description of one block (the tooltip text).
  static QString describe(const BlockRecord& record, int block, int block_size);
  // As above for block `block` of `snapshot`, with its storage slot where the pool shares its
  // storage with another (a device's two partitions).
  static QString describe(const KvSnapshot& snapshot, int block);

  QSize sizeHint() const override { return {480, 360}; }
  QSize minimumSizeHint() const override { return {160, 120}; }

 signals:
  void blockClicked(int block);

 protected:
  void paintEvent(QPaintEvent* event) override;
  void mousePressEvent(QMouseEvent* event) override;
  bool event(QEvent* event) override;  // QEvent::ToolTip

 private:
  struct Grid {
    int cell = 1;  // px per cell side (gap included)
    int cols = 1;
    int rows = 0;
  };
  QRect cells_area() const;  // where cells may go (the widget minus the legend strip)
  Grid grid_for(QSize area) const;
  void rebuild_image();
  void paint_legend(class QPainter& painter) const;

  KvSnapshot snapshot_;
  int used_cells_ = 0;
  int selected_ = -1;
  bool dirty_ = true;
  QImage image_;      // (rows * cell, cols * cell) pixels
  QSize image_area_;  // the cells_area() size the image was built for
  QRect image_rect_;  // where the image is drawn (scaled down when even 1 px cells overflow)
  Grid grid_;
  int image_rebuilds_ = 0;
};

}  // namespace tokenfab::ui
