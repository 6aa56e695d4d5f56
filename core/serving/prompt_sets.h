#pragma once
// Prompt sets: the text the serving benchmark sends as prompts ("chat_turns": short user turns;
// "documents": long prose to be summarized), and the domain sets that draft heads are trained
// ("train") and evaluated ("validation") on. The sets are written for this project, live in
// resources/prompts/<name>.txt and resources/domains/<domain>/<split>.txt, and are compiled into
// the binary; a domain split is also a builtin set named "domains/<domain>/<split>".
//
// File format (UTF-8): optional `#` comment lines at the top of the file only; entries separated
// by a line that is exactly `%%`; leading and trailing blank lines of an entry are trimmed; empty
// entries are ignored. CRLF line endings and a UTF-8 byte-order mark are accepted.

#include <string>
#include <string_view>
#include <vector>

namespace tokenfab {

struct PromptSet {
  std::string name;
  std::vector<std::string> entries;  // each non-empty; lines joined with '\n'
};

// Throws Error naming `name` when the text holds no entries.
PromptSet parse_prompt_set(std::string name, std::string_view text);

// A set compiled into the binary, parsed on first use. Throws Error for an unknown name, listing
// the known ones.
const PromptSet& builtin_prompt_set(std::string_view name);

// Names of the compiled-in sets, sorted.
std::vector<std::string> builtin_prompt_set_names();

// Names of the built-in domains (those with both splits), sorted: code, korean, math, prose,
// structured.
std::vector<std::string> builtin_domains();

// A domain's split ("train" or "validation"). Throws Error naming the domain and split, listing
// the known domains and splits, when there is no such set.
const PromptSet& domain_prompt_set(std::string_view domain, std::string_view split);

}  // namespace tokenfab
