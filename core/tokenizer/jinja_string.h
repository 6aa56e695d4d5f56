#pragma once
// Python's str operations on UTF-8 text, as chat templates call them: indices and lengths count
// code points; whitespace is what str.isspace() accepts. Case mapping covers ASCII, Latin-1,
// Greek and Cyrillic (the rest of Unicode keeps its case). Invalid UTF-8 bytes count as one code
// point each, so nothing here fails on odd input.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tokenfab::jinja::pystr {

std::vector<uint32_t> code_points(std::string_view s);  // invalid bytes as themselves
std::string from_code_points(const std::vector<uint32_t>& cps, size_t begin, size_t end);
size_t length(std::string_view s);
// The code point index of byte offset `byte` (which must start a code point).
size_t index_of_byte(std::string_view s, size_t byte);

bool is_space(uint32_t cp);
uint32_t to_upper(uint32_t cp);
uint32_t to_lower(uint32_t cp);
bool is_alpha(uint32_t cp);  // a letter with a case in the ranges above, or any other non-ASCII

std::string upper(std::string_view s);  // "ß" becomes "SS", as in Python
std::string lower(std::string_view s);
std::string capitalize(std::string_view s);    // str.capitalize()
std::string title_method(std::string_view s);  // str.title(): a letter after a non-letter is upper
std::string title_filter(std::string_view s);  // jinja2's |title: words split at spaces - ( { [ <

// str.strip / lstrip / rstrip; `chars` nullopt strips whitespace.
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                  bool right);
// str.split(sep, maxsplit) and str.rsplit; `sep` nullopt splits at runs of whitespace.
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep,
                               int64_t maxsplit);
std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep,
                                int64_t maxsplit);
std::vector<std::string> splitlines(std::string_view s);
std::string replace(std::string_view s, std::string_view old, std::string_view with, int64_t count);
int64_t count(std::string_view s, std::string_view part);
int64_t find(std::string_view s, std::string_view part, bool reverse);  // code points, or -1

// repr() of a str: quotes chosen as Python does, control and invisible characters escaped.
std::string repr(std::string_view s);

// Python's int(s) and float(s): surrounding whitespace allowed, "_" between digits.
std::optional<int64_t> parse_int(std::string_view s, int base);
std::optional<double> parse_float(std::string_view s);

}  // namespace tokenfab::jinja::pystr
