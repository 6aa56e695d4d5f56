#include "core/serving/prompt_sets.h"

#include <algorithm>
#include <map>

#include "core/common/error.h"
#include "core/serving/embedded_prompt_files.h"

namespace tokenfab {

namespace {

constexpr std::string_view kSeparator = "%%";
constexpr std::string_view kDomainPrefix = "domains/";
constexpr std::string_view kTrainSplit = "train";
constexpr std::string_view kValidationSplit = "validation";
constexpr std::string_view kUtf8Bom = "\xEF\xBB\xBF";

bool is_blank(std::string_view line) {
  return line.find_first_not_of(" \t\v\f") == std::string_view::npos;
}

// Lines of `text` without their terminators ("\n" or "\r\n").
std::vector<std::string_view> split_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    const size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
  return lines;
}

// Joins lines [first, last) with '\n' after dropping blank lines at both ends; "" if all blank.
std::string trimmed_entry(const std::vector<std::string_view>& lines, size_t first, size_t last) {
  while (first < last && is_blank(lines[first])) ++first;
  while (last > first && is_blank(lines[last - 1])) --last;
  std::string entry;
  for (size_t i = first; i < last; ++i) {
    if (i > first) entry += '\n';
    entry += lines[i];
  }
  return entry;
}

std::string domain_set_name(std::string_view domain, std::string_view split) {
  return std::string(kDomainPrefix) + std::string(domain) + "/" + std::string(split);
}

struct BuiltinSets {
  std::map<std::string, PromptSet, std::less<>> sets;
};

const BuiltinSets& builtin_sets() {
  // Parsed once, on first use; a function-local static is initialized thread-safely.
  static const BuiltinSets builtins = [] {
    BuiltinSets b;
    for (size_t i = 0; i < detail::kEmbeddedPromptFileCount; ++i) {
      const detail::EmbeddedPromptFile& f = detail::kEmbeddedPromptFiles[i];
      const std::string_view text(reinterpret_cast<const char*>(f.data), f.size);
      b.sets.emplace(f.name, parse_prompt_set(f.name, text));
    }
    return b;
  }();
  return builtins;
}

}  // namespace

PromptSet parse_prompt_set(std::string name, std::string_view text) {
  if (text.starts_with(kUtf8Bom)) text.remove_prefix(kUtf8Bom.size());
  const std::vector<std::string_view> lines = split_lines(text);

  size_t first = 0;  // skip the header: comment (and blank) lines before the first entry line
  while (first < lines.size() && (lines[first].starts_with('#') || is_blank(lines[first]))) {
    ++first;
  }

  PromptSet set{std::move(name), {}};
  for (size_t begin = first, i = first; i <= lines.size(); ++i) {
    if (i < lines.size() && lines[i] != kSeparator) continue;
    std::string entry = trimmed_entry(lines, begin, i);
    if (!entry.empty()) set.entries.push_back(std::move(entry));
    begin = i + 1;
  }
  if (set.entries.empty()) {
    throw Error("prompt set '" + set.name + "': no entries (entries are separated by lines of " +
                std::string(kSeparator) + ")");
  }
  return set;
}

const PromptSet& builtin_prompt_set(std::string_view name) {
  const BuiltinSets& b = builtin_sets();
  if (const auto it = b.sets.find(name); it != b.sets.end()) return it->second;
  std::string known;
  for (const auto& [n, set] : b.sets) known += (known.empty() ? "" : ", ") + n;
  throw Error("unknown prompt set '" + std::string(name) +
              "' (known: " + (known.empty() ? std::string("none") : known) + ")");
}

std::vector<std::string> builtin_prompt_set_names() {
  std::vector<std::string> names;
  for (const auto& [n, set] : builtin_sets().sets) names.push_back(n);
  return names;  // std::map keeps them sorted
}

std::vector<std::string> builtin_domains() {
  const BuiltinSets& b = builtin_sets();
  std::vector<std::string> domains;
  for (const auto& [n, set] : b.sets) {
    // Each domain is visited once, at its "train" set.
    std::string_view name = n;
    if (!name.starts_with(kDomainPrefix)) continue;
    name.remove_prefix(kDomainPrefix.size());
    const size_t slash = name.find('/');
    if (slash == std::string_view::npos || name.substr(slash + 1) != kTrainSplit) continue;
    const std::string_view domain = name.substr(0, slash);
    if (b.sets.contains(domain_set_name(domain, kValidationSplit))) domains.emplace_back(domain);
  }
  // Map order is by full set name, which differs from domain order when a name holds '-' or '.'.
  std::sort(domains.begin(), domains.end());
  return domains;
}

const PromptSet& domain_prompt_set(std::string_view domain, std::string_view split) {
  const BuiltinSets& b = builtin_sets();
  if (const auto it = b.sets.find(domain_set_name(domain, split)); it != b.sets.end()) {
    return it->second;
  }
  std::string known;
  for (const std::string& d : builtin_domains()) known += (known.empty() ? "" : ", ") + d;
  throw Error("unknown domain prompt set '" + std::string(domain) + "' split '" +
              std::string(split) +
              "' (known domains: " + (known.empty() ? std::string("none") : known) +
              "; splits: " + std::string(kTrainSplit) + ", " + std::string(kValidationSplit) + ")");
}

}  // namespace tokenfab
