#include "core/api/stop_text.h"

#include <algorithm>
#include <utility>

namespace tokenfab::api {

std::string StopText::push(const std::string& piece) {
  if (stopped_) return {};
  std::string text = held_ + piece;
  held_.clear();
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, text.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    return text.substr(0, first);
  }
  // The longest suffix of `text` that begins some stop string is held back.
  size_t keep = 0;
  for (const std::string& s : stops_)
    for (size_t n = std::min(s.size() - 1, text.size()); n > keep; --n)
      if (text.compare(text.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
  held_ = text.substr(text.size() - keep);
  text.resize(text.size() - keep);
  return text;
}

std::string StopText::flush() {
  if (stopped_) return {};
  return std::exchange(held_, {});
}

}  // namespace tokenfab::api
