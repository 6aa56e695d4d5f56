#include <algorithm>

#include "core/tokenizer/unicode_tables.h"

namespace tokenfab::unicode {

namespace {

// ASCII is most of most inputs: a direct table avoids the binary search.
struct AsciiTable {
  CodepointClass cls[128];
  AsciiTable() {
    for (uint32_t cp = 0; cp < 128; ++cp) cls[cp] = classify_ranges(cp);
  }
  static CodepointClass classify_ranges(uint32_t cp) {
    const CodepointRange* begin = kCodepointRanges;
    const CodepointRange* end = kCodepointRanges + kCodepointRangeCount;
    // First range whose `last` is >= cp; cp is in it when its `first` is <= cp.
    const CodepointRange* it = std::lower_bound(
        begin, end, cp, [](const CodepointRange& r, uint32_t value) { return r.last < value; });
    return (it != end && it->first <= cp) ? it->cls : CodepointClass::kOther;
  }
};

const AsciiTable& ascii_table() {
  static const AsciiTable table;
  return table;
}

}  // namespace

CodepointClass classify(uint32_t cp) {
  if (cp < 128) return ascii_table().cls[cp];
  return AsciiTable::classify_ranges(cp);
}

}  // namespace tokenfab::unicode
