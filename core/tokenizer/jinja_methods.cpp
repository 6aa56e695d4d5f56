// Python methods templates call on values: str methods and the read-only dict methods. (HF's
// sandbox is immutable: list.append, dict.update and the like raise there, so they are absent.)

#include <algorithm>

#include "core/tokenizer/jinja_builtins.h"
#include "core/tokenizer/jinja_string.h"

namespace tokenfab::jinja {

namespace {

using StrMethod = Value (*)(const std::string& self, const CallArgs& args);

std::optional<std::string> optional_string(const Value& v, const char* what) {
  if (v.is_undefined() || v.is_none()) return std::nullopt;
  if (!v.is_string())
    throw RenderError(std::string(what) + " must be str or None, not " + v.type_name());
  return v.as_string();
}

const std::string& string_argument(const Value& v, const char* what) {
  if (!v.is_string()) throw RenderError(std::string(what) + " must be str, not " + v.type_name());
  return v.as_string();
}

int64_t int_or(const Value& v, int64_t fallback) {
  if (v.is_undefined()) return fallback;
  if (!v.is_integral())
    throw RenderError("'" + v.type_name() + "' object cannot be interpreted as an integer");
  return v.as_int();
}

Value strings(const std::vector<std::string>& parts) {
  std::vector<Value> items(parts.begin(), parts.end());
  return Value::list(std::move(items));
}

Value strip_method(const std::string& s, const CallArgs& args, bool left, bool right) {
  const auto a = bind_arguments(args, {"chars"}, "strip");
  return Value(pystr::strip(s, optional_string(a[0], "strip arg"), left, right));
}

// startswith / endswith: the prefix is a str or a tuple of them.
Value affix_method(const std::string& s, const CallArgs& args, bool at_start) {
  const auto a = bind_arguments(args, {"prefix"}, at_start ? "startswith" : "endswith");
  std::vector<Value> candidates;
  if (a[0].kind() == Kind::List) {
    candidates = a[0].as_list().items;
  } else {
    candidates.push_back(a[0]);
  }
  for (const Value& c : candidates) {
    const std::string& affix = string_argument(c, at_start ? "startswith arg" : "endswith arg");
    if (at_start ? s.starts_with(affix) : s.ends_with(affix)) return true;
  }
  return false;
}

Value split_method(const std::string& s, const CallArgs& args, bool from_right) {
  const auto a = bind_arguments(args, {"sep", "maxsplit"}, from_right ? "rsplit" : "split");
  const std::optional<std::string> sep = optional_string(a[0], "split separator");
  if (sep && sep->empty()) throw RenderError("empty separator");
  const int64_t maxsplit = int_or(a[1], -1);
  return strings(from_right ? pystr::rsplit(s, sep, maxsplit) : pystr::split(s, sep, maxsplit));
}

Value find_method(const std::string& s, const CallArgs& args, bool reverse, bool must_find) {
  const auto a = bind_arguments(args, {"sub"}, reverse ? "rfind" : "find");
  const int64_t at = pystr::find(s, string_argument(a[0], "find arg"), reverse);
  if (must_find && at < 0) throw RenderError("substring not found");
  return at;
}

Value join_method(const std::string& s, const CallArgs& args) {
  const auto a = bind_arguments(args, {"iterable"}, "join");
  std::string out;
  const std::vector<Value> items = iterate(a[0]);
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].is_string()) {
      throw RenderError("sequence item " + std::to_string(i) + ": expected str instance, " +
                        items[i].type_name() + " found");
    }
    if (i > 0) out += s;
    out += items[i].as_string();
  }
  return Value(std::move(out));
}

// isdigit, isspace, isalpha, isalnum: every character is one, and there is at least one.
template <typename Pred>
Value all_characters(const std::string& s, Pred pred) {
  const std::vector<uint32_t> cps = pystr::code_points(s);
  return !cps.empty() && std::all_of(cps.begin(), cps.end(), pred);
}

bool is_digit(uint32_t cp) {
  return cp >= '0' && cp <= '9';
}
bool is_letter(uint32_t cp) {
  return pystr::is_alpha(cp);
}

Value no_arguments(const CallArgs& args, const char* what) {
  bind_arguments(args, {}, what);
  return Value();
}

// The one-line methods: str.upper() and the like, str.isdigit() and the like.
template <std::string (*Transform)(std::string_view)>
Value transform_method(const std::string& s, const CallArgs& args) {
  no_arguments(args, "the str method");
  return Value(Transform(s));
}

template <bool (*Predicate)(uint32_t)>
Value predicate_method(const std::string& s, const CallArgs& args) {
  no_arguments(args, "the str method");
  return all_characters(s, Predicate);
}

template <bool Left, bool Right>
Value strip_side(const std::string& s, const CallArgs& args) {
  return strip_method(s, args, Left, Right);
}

template <bool AtStart>
Value affix_side(const std::string& s, const CallArgs& args) {
  return affix_method(s, args, AtStart);
}

template <bool FromRight>
Value split_side(const std::string& s, const CallArgs& args) {
  return split_method(s, args, FromRight);
}

template <bool Reverse, bool MustFind>
Value find_variant(const std::string& s, const CallArgs& args) {
  return find_method(s, args, Reverse, MustFind);
}

Value replace_method(const std::string& s, const CallArgs& args) {
  const auto a = bind_arguments(args, {"old", "new", "count"}, "replace");
  return Value(pystr::replace(s, string_argument(a[0], "replace arg 1"),
                              string_argument(a[1], "replace arg 2"), int_or(a[2], -1)));
}

Value count_method(const std::string& s, const CallArgs& args) {
  const auto a = bind_arguments(args, {"sub"}, "count");
  return Value(pystr::count(s, string_argument(a[0], "count arg")));
}

Value splitlines_method(const std::string& s, const CallArgs& args) {
  no_arguments(args, "splitlines");
  return strings(pystr::splitlines(s));
}

bool is_alnum(uint32_t cp) {
  return is_digit(cp) || is_letter(cp);
}

const std::vector<std::pair<std::string_view, StrMethod>>& string_methods() {
  static const std::vector<std::pair<std::string_view, StrMethod>> table = {
      {"strip", strip_side<true, true>},
      {"lstrip", strip_side<true, false>},
      {"rstrip", strip_side<false, true>},
      {"startswith", affix_side<true>},
      {"endswith", affix_side<false>},
      {"split", split_side<false>},
      {"rsplit", split_side<true>},
      {"splitlines", splitlines_method},
      {"upper", transform_method<pystr::upper>},
      {"lower", transform_method<pystr::lower>},
      {"title", transform_method<pystr::title_method>},
      {"capitalize", transform_method<pystr::capitalize>},
      {"replace", replace_method},
      {"find", find_variant<false, false>},
      {"rfind", find_variant<true, false>},
      {"index", find_variant<false, true>},
      {"count", count_method},
      {"join", join_method},
      {"isdigit", predicate_method<is_digit>},
      {"isspace", predicate_method<pystr::is_space>},
      {"isalpha", predicate_method<is_letter>},
      {"isalnum", predicate_method<is_alnum>},
  };
  return table;
}

Value dict_items(const DictData& d) {
  std::vector<Value> items;
  for (const auto& [key, value] : d.items) items.push_back(Value::tuple({key, value}));
  return Value::list(std::move(items));
}

std::optional<Value> dict_method(const Value& self, const std::string& name) {
  if (name == "items" || name == "keys" || name == "values") {
    return Value::callable(name, [self, name](Renderer&, const CallArgs& args) {
      bind_arguments(args, {}, name);
      if (name == "items") return dict_items(self.as_dict());
      std::vector<Value> out;
      for (const auto& [key, value] : self.as_dict().items)
        out.push_back(name == "keys" ? key : value);
      return Value::list(std::move(out));
    });
  }
  if (name == "get") {
    return Value::callable(name, [self](Renderer&, const CallArgs& args) {
      const auto a = bind_arguments(args, {"key", "default"}, "get");
      const Value* v = self.as_dict().find(a[0]);
      if (v != nullptr) return *v;
      return a[1].is_undefined() ? Value::none() : a[1];
    });
  }
  return std::nullopt;
}

}  // namespace

std::optional<Value> method_of(const Value& self, const std::string& name) {
  if (self.kind() == Kind::Dict) return dict_method(self, name);
  if (!self.is_string()) return std::nullopt;
  for (const auto& entry : string_methods()) {
    if (entry.first != name) continue;
    const StrMethod fn = entry.second;  // (clang cannot capture a structured binding)
    return Value::callable(
        name, [self, fn](Renderer&, const CallArgs& args) { return fn(self.as_string(), args); });
  }
  return std::nullopt;
}

}  // namespace tokenfab::jinja
