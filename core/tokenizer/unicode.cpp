#include <algorithm>

#include "core/tokenizer/unicode_tables.h"

namespace tokenfab::unicode {

namespace {

// The range holding `cp` in a sorted table of disjoint ranges, or nullptr.
template <typename Range>
const Range* find_range(const Range* begin, std::size_t count, uint32_t cp) {
  const Range* end = begin + count;
  // First range whose `last` is >= cp; cp is in it when its `first` is <= cp.
  const Range* it = std::lower_bound(begin, end, cp,
                                     [](const Range& r, uint32_t value) { return r.last < value; });
  return (it != end && it->first <= cp) ? it : nullptr;
}

CodepointClass classify_ranges(uint32_t cp) {
  const CodepointRange* r = find_range(kCodepointRanges, kCodepointRangeCount, cp);
  return r ? r->cls : CodepointClass::kOther;
}

LetterCategory categorize_ranges(uint32_t cp) {
  const LetterCategoryRange* r = find_range(kLetterCategoryRanges, kLetterCategoryRangeCount, cp);
  return r ? r->category : LetterCategory::kNone;
}

// ASCII is most of most inputs: a direct table avoids the binary search.
struct AsciiTable {
  CodepointClass cls[128];
  LetterCategory category[128];
  AsciiTable() {
    for (uint32_t cp = 0; cp < 128; ++cp) {
      cls[cp] = classify_ranges(cp);
      category[cp] = categorize_ranges(cp);
    }
  }
};

const AsciiTable& ascii_table() {
  static const AsciiTable table;
  return table;
}

}  // namespace

CodepointClass classify(uint32_t cp) {
  if (cp < 128) return ascii_table().cls[cp];
  return classify_ranges(cp);
}

LetterCategory letter_category(uint32_t cp) {
  if (cp < 128) return ascii_table().category[cp];
  return categorize_ranges(cp);
}

}  // namespace tokenfab::unicode
