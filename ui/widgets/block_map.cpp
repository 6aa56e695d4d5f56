#include "ui/widgets/block_map.h"

#include <QHelpEvent>
#include <QMouseEvent>
#include <QPainter>
#include <QToolTip>
#include <algorithm>
#include <cmath>
#include <unordered_map>

namespace tokenfab::ui {

namespace {

constexpr int kLegendHeight = 22;  // px under the cells
constexpr int kGapFrom = 4;        // cells this large or larger get a 1 px gap
constexpr QRgb kBackground = 0xff1b1d20;
constexpr QRgb kFreeColor = 0xff3a3d42;
constexpr QRgb kCachedColor = 0xff14a89a;  // teal

uint64_t mix(uint64_t x) {  // splitmix64 finalizer: neighbouring ids get unrelated hues
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A hue for a sequence, skipping the teal band (150..209°) that means "cached".
QRgb owner_color(SequenceId owner, bool shared) {
  // A negative owner is the prefill device's hold on request -owner while its KV is sent.
  const uint64_t key = static_cast<uint64_t>(owner < 0 ? -owner : owner);
  int hue = static_cast<int>(mix(key) % 300);
  if (hue >= 150) hue += 60;
  return shared ? QColor::fromHsv(hue, 110, 255).rgb() : QColor::fromHsv(hue, 200, 200).rgb();
}

QString owner_name(SequenceId owner) {
  return owner < 0 ? QString("hold of #%1").arg(-owner) : QString("#%1").arg(owner);
}

}  // namespace

BlockMap::BlockMap(QWidget* parent) : QWidget(parent) {
  setMouseTracking(true);
  setAttribute(Qt::WA_OpaquePaintEvent);
  setSizePolicy(QSizePolicy::Expanding, QSizePolicy::Expanding);
}

void BlockMap::set_snapshot(const KvSnapshot& snapshot) {
  snapshot_ = snapshot;
  used_cells_ = 0;
  for (const BlockRecord& r : snapshot_.blocks)
    if (r.state != BlockState::kFree) ++used_cells_;
  if (selected_ >= snapshot_.n_blocks) selected_ = -1;
  dirty_ = true;
  update();
}

QRgb BlockMap::cell_color(const BlockRecord& record) {
  switch (record.state) {
    case BlockState::kFree:
      return kFreeColor;
    case BlockState::kCached:
      return kCachedColor;
    case BlockState::kOwned:
      return record.owners.empty() ? kFreeColor
                                   : owner_color(record.owners.front(), record.ref_count > 1);
  }
  return kFreeColor;
}

QString BlockMap::describe(const BlockRecord& record, int block, int block_size) {
  QStringList owners;
  for (const SequenceId o : record.owners) owners << owner_name(o);
  QString text = QString("Block %1 · %2\nref count %3\ntokens %4/%5")
                     .arg(block)
                     .arg(block_state_name(record.state))
                     .arg(record.ref_count)
                     .arg(record.n_tokens)
                     .arg(block_size);
  if (!owners.isEmpty()) text += "\nowners " + owners.join(", ");
  text += record.has_hash ? QString("\nhash %1").arg(record.hash, 16, 16, QChar('0'))
                          : QString("\nhash — (not in the prefix cache)");
  return text;
}

QString BlockMap::describe(const KvSnapshot& snapshot, int block) {
  const auto b = static_cast<size_t>(block);
  QString text = describe(snapshot.blocks[b], block, snapshot.block_size);
  if (b < snapshot.block_slots.size()) {
    const int32_t refs = snapshot.slot_refs[b];
    text += QString("\nstorage slot %1").arg(snapshot.block_slots[b]);
    text += refs > 1
                ? QString(" · mapped by %1 blocks (KV shared between the partitions)").arg(refs)
                : QString(" · its own");
  }
  return text;
}

QRect BlockMap::cells_area() const {
  return QRect(0, 0, width(), std::max(0, height() - kLegendHeight));
}

// The largest cell side c ≥ 1 with ceil(n / floor(w / c)) * c ≤ h.
BlockMap::Grid BlockMap::grid_for(QSize area) const {
  const int n = std::max(0, snapshot_.n_blocks);
  const int w = std::max(1, area.width()), h = std::max(1, area.height());
  Grid g;
  if (n == 0) return g;
  int c = std::max(1, static_cast<int>(std::sqrt(static_cast<double>(w) * h / n)));
  auto fits = [&](int cell) {
    if (cell > w) return false;
    const int cols = std::max(1, w / cell);
    return static_cast<int64_t>((n + cols - 1) / cols) * cell <= h;
  };
  while (c > 1 && !fits(c)) --c;
  while (fits(c + 1)) ++c;
  g.cell = c;
  g.cols = std::max(1, w / c);
  g.rows = (n + g.cols - 1) / g.cols;
  return g;
}

void BlockMap::rebuild_image() {
  const QRect area = cells_area();
  grid_ = grid_for(area.size());
  image_area_ = area.size();
  dirty_ = false;
  ++image_rebuilds_;
  const int n = snapshot_.n_blocks;
  if (n == 0 || area.isEmpty()) {
    image_ = QImage();
    image_rect_ = QRect();
    return;
  }
  const int c = grid_.cell;
  const int side = c >= kGapFrom ? c - 1 : c;  // filled pixels per cell side
  image_ = QImage(grid_.cols * c, grid_.rows * c, QImage::Format_RGB32);
  image_.fill(kBackground);
  // (rows * c, cols * c) pixels, row-major; each block fills side × side pixels of its cell.
  for (int b = 0; b < n; ++b) {
    const QRgb color = cell_color(snapshot_.blocks[static_cast<size_t>(b)]);
    const int x0 = (b % grid_.cols) * c, y0 = (b / grid_.cols) * c;
    for (int y = y0; y < y0 + side; ++y) {
      QRgb* line = reinterpret_cast<QRgb*>(image_.scanLine(y));
      std::fill(line + x0, line + x0 + side, color);
    }
  }
  // Even 1 px cells may overflow a tiny widget: then the image is scaled down to fit.
  QSize target = image_.size();
  if (target.width() > area.width() || target.height() > area.height())
    target.scale(area.size(), Qt::KeepAspectRatio);
  image_rect_ = QRect(area.topLeft(), target);
}

int BlockMap::block_at(const QPoint& pos) const {
  const QRect area = cells_area();
  if (snapshot_.n_blocks == 0 || !area.contains(pos)) return -1;
  const Grid g = grid_for(area.size());
  QSize drawn(g.cols * g.cell, g.rows * g.cell);
  if (drawn.width() > area.width() || drawn.height() > area.height()) {
    QSize target = drawn;
    target.scale(area.size(), Qt::KeepAspectRatio);
    // Back from the scaled-down image to image pixels.
    const double sx = static_cast<double>(drawn.width()) / std::max(1, target.width());
    const double sy = static_cast<double>(drawn.height()) / std::max(1, target.height());
    if (pos.x() >= target.width() || pos.y() >= target.height()) return -1;
    const int col = static_cast<int>(pos.x() * sx) / g.cell;
    const int row = static_cast<int>(pos.y() * sy) / g.cell;
    const int b = row * g.cols + col;
    return col < g.cols && b < snapshot_.n_blocks ? b : -1;
  }
  const int col = pos.x() / g.cell, row = pos.y() / g.cell;
  if (col >= g.cols) return -1;
  const int b = row * g.cols + col;
  return b < snapshot_.n_blocks ? b : -1;
}

void BlockMap::set_selected(int block) {
  selected_ = block >= 0 && block < snapshot_.n_blocks ? block : -1;
  update();
}

void BlockMap::paintEvent(QPaintEvent*) {
  if (dirty_ || image_area_ != cells_area().size()) rebuild_image();
  QPainter painter(this);
  painter.fillRect(rect(), QColor::fromRgb(kBackground));
  if (!image_.isNull()) painter.drawImage(image_rect_, image_);
  if (selected_ >= 0 && !image_.isNull()) {
    const double sx = static_cast<double>(image_rect_.width()) / image_.width();
    const double sy = static_cast<double>(image_rect_.height()) / image_.height();
    const int c = grid_.cell;
    const QRectF cell((selected_ % grid_.cols) * c * sx, (selected_ / grid_.cols) * c * sy,
                      std::max(3.0, c * sx), std::max(3.0, c * sy));
    painter.setPen(QPen(Qt::white, 1.5));
    painter.setBrush(Qt::NoBrush);
    painter.drawRect(cell.adjusted(-1, -1, 1, 1));
  }
  paint_legend(painter);
}

void BlockMap::paint_legend(QPainter& painter) const {
  const int y = height() - kLegendHeight;
  painter.setPen(QColor(200, 200, 200));
  int x = 4;
  auto swatch = [&](QRgb color, const QString& label) {
    painter.fillRect(QRect(x, y + 6, 10, 10), QColor::fromRgb(color));
    x += 14;
    const int w = painter.fontMetrics().horizontalAdvance(label);
    painter.drawText(QRect(x, y, w + 2, kLegendHeight), Qt::AlignVCenter, label);
    x += w + 12;
  };
  swatch(kFreeColor, QString("free %1").arg(snapshot_.n_free));
  swatch(kCachedColor, QString("cached %1").arg(snapshot_.n_cached));
  swatch(owner_color(1, false), QString("owned %1 (colour per sequence)").arg(snapshot_.n_owned));
  swatch(owner_color(1, true), "shared (ref > 1)");
}

void BlockMap::mousePressEvent(QMouseEvent* event) {
  const int b = block_at(event->position().toPoint());
  if (b < 0) return QWidget::mousePressEvent(event);
  set_selected(b);
  emit blockClicked(b);
}

bool BlockMap::event(QEvent* event) {
  if (event->type() == QEvent::ToolTip) {
    auto* help = static_cast<QHelpEvent*>(event);
    const int b = block_at(help->pos());
    if (b < 0) {
      QToolTip::hideText();
      event->ignore();
    } else {
      QToolTip::showText(help->globalPos(), describe(snapshot_, b), this);
    }
    return true;
  }
  return QWidget::event(event);
}

}  // namespace tokenfab::ui
