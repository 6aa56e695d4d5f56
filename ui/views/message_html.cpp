#include "ui/views/message_html.h"

#include <QStringList>

namespace tokenfab::ui {

namespace {

// Escapes content[begin, end), wrapping runs of drafted characters in a coloured span.
QString line_html(const MessageView& m, qsizetype begin, qsizetype end, bool colour_drafted) {
  QString out;
  bool in_span = false;
  for (qsizetype i = begin; i < end; ++i) {
    const bool drafted = colour_drafted && static_cast<size_t>(i) < m.drafted.size() &&
                         m.drafted[static_cast<size_t>(i)];
    if (drafted != in_span) {
      out += drafted ? QStringLiteral("<span style=\"color:%1\">").arg(kDraftedColour)
                     : QStringLiteral("</span>");
      in_span = drafted;
    }
    out += QString(m.content[i]).toHtmlEscaped();
  }
  if (in_span) out += QStringLiteral("</span>");
  return out;
}

}  // namespace

QString message_html(const MessageView& m, bool colour_drafted) {
  const bool user = m.role == QLatin1String("user");
  QString html = QStringLiteral(
                     "<table width=\"100%\" cellpadding=\"6\" style=\"margin-bottom:6px\"><tr><td "
                     "style=\"background:%1\"><b>%2</b><br>")
                     .arg(user ? "#e8eef8" : "#f6f6f6", user ? "You" : "Assistant");
  bool in_code = false;
  QStringList code_lines;
  qsizetype begin = 0;
  const qsizetype n = m.content.size();
  while (begin <= n) {
    qsizetype end = m.content.indexOf(QLatin1Char('\n'), begin);
    if (end < 0) end = n;
    const bool fence = m.content.mid(begin, end - begin).trimmed().startsWith(QLatin1String("```"));
    if (fence) {
      if (in_code) {
        html += QStringLiteral(
                    "<pre style=\"font-family:monospace; background:#272822; color:#f8f8f2; "
                    "padding:6px\">%1</pre>")
                    .arg(code_lines.join(QLatin1Char('\n')));
        code_lines.clear();
      }
      in_code = !in_code;
    } else if (in_code) {
      code_lines << line_html(m, begin, end, colour_drafted);
    } else {
      html += line_html(m, begin, end, colour_drafted);
      if (end < n) html += QStringLiteral("<br>");
    }
    begin = end + 1;
  }
  if (in_code)  // an open fence (still streaming): show what there is as code
    html += QStringLiteral(
                "<pre style=\"font-family:monospace; background:#272822; "
                "color:#f8f8f2; padding:6px\">%1</pre>")
                .arg(code_lines.join(QLatin1Char('\n')));
  if (m.streaming) html += QStringLiteral(" <span style=\"color:#888\">▌</span>");
  if (!m.stats.isEmpty())
    html +=
        QStringLiteral("<br><small style=\"color:#666\">%1</small>").arg(m.stats.toHtmlEscaped());
  html += QStringLiteral("</td></tr></table>");
  return html;
}

}  // namespace tokenfab::ui
