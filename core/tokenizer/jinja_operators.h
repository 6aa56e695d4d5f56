#pragma once
// Python's operators on jinja values: arithmetic, ~, comparisons, `in`, attribute and item access
// and slicing, with jinja2's treatment of Undefined (empty for ~, an error for arithmetic and
// attribute access). Errors are RenderErrors with Python's wording.

#include <cstddef>
#include <optional>
#include <string>

#include "core/tokenizer/jinja_value.h"

namespace tokenfab::jinja {

// + - * / // % ** ~ ; results longer than `max_size` (bytes of a string, items of a list) fail.
Value binary_operator(const std::string& op, const Value& a, const Value& b, size_t max_size);
Value unary_operator(const std::string& op, const Value& a);  // "-", "+"
// == != < > <= >= in, "not in"
bool compare_operator(const std::string& op, const Value& a, const Value& b);
bool contains(const Value& container, const Value& item);

// obj.name: a method, else an item of a dict or namespace, else Undefined naming what is missing.
Value get_attribute(const Value& obj, const std::string& name);
// obj[key]: an item (negative indices count from the end), else a method when key is a string,
// else Undefined.
Value get_item(const Value& obj, const Value& key);
// obj[start:stop:step] of a list, tuple or string; absent parts are nullopt.
Value get_slice(const Value& obj, const std::optional<int64_t>& start,
                const std::optional<int64_t>& stop, const std::optional<int64_t>& step);

// The error jinja2 raises when an Undefined is used (its hint, or "'x' is undefined").
[[noreturn]] void fail_undefined(const Value& undefined);

}  // namespace tokenfab::jinja
