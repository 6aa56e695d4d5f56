#pragma once
// Markdown-ish HTML for one chat message: ``` fences become monospace blocks, other lines plain
// paragraphs; characters the draft head proposed (and the target accepted) can be coloured.

#include <QString>
#include <vector>

namespace tokenfab::ui {

struct MessageView {
  QString role;  // "user", "assistant", "system"
  QString content;
  std::vector<bool> drafted;  // per QChar of content (may be empty or shorter: not drafted)
  QString stats;              // one line under an assistant message; empty for none
  bool streaming = false;     // a reply still being generated
};

inline constexpr const char* kDraftedColour = "#1f7a1f";

QString message_html(const MessageView& message, bool colour_drafted);

}  // namespace tokenfab::ui
