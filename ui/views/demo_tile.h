#pragma once
// DemoTile: one agent of the Demo page — its prompt's title, the text as it streams (appended,
// never re-rendered) and a line of figures — and DemoAgent, what the page knows of that agent.

#include <QElapsedTimer>
#include <QFrame>
#include <QLabel>
#include <QPlainTextEdit>
#include <QScrollBar>
#include <QString>
#include <QTextCursor>
#include <QVBoxLayout>
#include <cstdint>
#include <optional>

#include "core/serving/engine.h"

namespace tokenfab::ui {

struct DemoAgent {
  QString title;  // the prompt's first line, shortened
  RequestId id = 0;
  int64_t tokens = 0;  // every token streamed (end-of-generation tokens included)
  RequestState state = RequestState::kQueued;
  std::optional<double> completion_s;  // finished: its end − the run's submit (engine clock)
  std::optional<double> decode_tok_s;  // finished with >= 2 tokens: 1 / TPOT (engine clock)
  QString error;
};

// One agent: its prompt's title, the text as it streams (appended, never re-rendered) and a line
// of figures.
class DemoTile : public QFrame {
 public:
  DemoTile(int number, const QString& title, QWidget* parent) : QFrame(parent) {
    setFrameShape(QFrame::StyledPanel);
    setObjectName("demoTile");
    auto* header =
        new QLabel(QStringLiteral("<b>#%1</b> %2").arg(number).arg(title.toHtmlEscaped()), this);
    header->setTextFormat(Qt::RichText);
    header->setToolTip(title);
    header->setMinimumWidth(0);
    header->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
    text_ = new QPlainTextEdit(this);
    text_->setReadOnly(true);
    text_->setUndoRedoEnabled(false);
    text_->setVerticalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
    text_->setMinimumHeight(72);
    text_->setStyleSheet("font-size: 11px;");
    figures_ = new QLabel(QStringLiteral("queued"), this);
    figures_->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
    figures_->setStyleSheet("color: #5a6270;");
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(6, 4, 6, 4);
    layout->setSpacing(2);
    layout->addWidget(header);
    layout->addWidget(text_, 1);
    layout->addWidget(figures_);
  }

  void append(const QString& text) {
    if (text.isEmpty()) return;
    QTextCursor cursor(text_->document());
    cursor.movePosition(QTextCursor::End);
    cursor.insertText(text);
    text_->verticalScrollBar()->setValue(text_->verticalScrollBar()->maximum());
  }

  void show_figures(const DemoAgent& a, std::optional<double> live_tok_s) {
    // A finished tile says so by its colour; the line keeps room for the figures.
    QString line =
        a.state == RequestState::kFinished
            ? QStringLiteral("%1 tok").arg(a.tokens)
            : QStringLiteral("%1 · %2 tok").arg(request_state_name(a.state)).arg(a.tokens);
    const std::optional<double> rate = a.decode_tok_s ? a.decode_tok_s : live_tok_s;
    if (rate) line += QStringLiteral(" · %1 tok/s").arg(*rate, 0, 'f', 1);
    if (a.completion_s) line += QStringLiteral(" · done %1 s").arg(*a.completion_s, 0, 'f', 2);
    if (!a.error.isEmpty()) line += QStringLiteral(" · ") + a.error;
    figures_->setText(line);
    if (request_ended(a.state) && !marked_ended_) {  // restyled once, at the end
      marked_ended_ = true;
      const bool ok = a.state == RequestState::kFinished;
      figures_->setStyleSheet(ok ? "color: #1d7a3a; font-weight: bold;" : "color: #b3261e;");
      setStyleSheet(ok ? "#demoTile { border: 1px solid #1d7a3a; border-radius: 3px; }"
                       : "#demoTile { border: 1px solid #b3261e; border-radius: 3px; }");
    }
  }

  // GUI-side arrival of the first and latest tokens: the live rate until the engine's own
  // figure is known at the end.
  QElapsedTimer first_token;
  int64_t tokens_after_first = 0;

 private:
  QPlainTextEdit* text_ = nullptr;
  QLabel* figures_ = nullptr;
  bool marked_ended_ = false;
};

}  // namespace tokenfab::ui
