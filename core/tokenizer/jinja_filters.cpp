// The filter table, and the filters on text and numbers (those on sequences are in
// jinja_sequence_filters.cpp). Signatures follow jinja2's; tojson is HF's (json.dumps with
// ensure_ascii=False); escape escapes HTML as markupsafe does even though HF turns autoescape off.

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/tokenizer/jinja_filters.h"
#include "core/tokenizer/jinja_renderer.h"
#include "core/tokenizer/jinja_string.h"

namespace tokenfab::jinja {

namespace filters {
namespace {

bool given(const Value& v) {
  return !v.is_undefined() && !v.is_none();
}

Value trim(Renderer&, const Value& input, const CallArgs& args) {
  const auto a = bind_arguments(args, {"chars"}, "trim");
  std::optional<std::string> chars;
  if (given(a[0])) chars = to_str(a[0]);
  return Value(pystr::strip(to_str(input), chars, true, true));
}

Value length(Renderer&, const Value& input, const CallArgs& args) {
  bind_arguments(args, {}, "length");
  switch (input.kind()) {
    case Kind::Undefined:
      return 0;
    case Kind::String:
      return static_cast<int64_t>(pystr::length(input.as_string()));
    case Kind::List:
      return static_cast<int64_t>(input.as_list().items.size());
    case Kind::Dict:
      return static_cast<int64_t>(input.as_dict().items.size());
    default:
      throw RenderError("object of type '" + input.type_name() + "' has no len()");
  }
}

template <std::string (*Transform)(std::string_view)>
Value text_filter(Renderer&, const Value& input, const CallArgs& args) {
  bind_arguments(args, {}, "filter");
  return Value(Transform(to_str(input)));
}

std::optional<std::string> json_indent(const Value& v) {
  if (!given(v)) return std::nullopt;
  if (v.is_string()) return v.as_string();
  if (!v.is_integral()) throw RenderError("tojson indent must be an int or a str");
  return std::string(static_cast<size_t>(std::max<int64_t>(0, v.as_int())), ' ');
}

Value tojson(Renderer&, const Value& input, const CallArgs& args) {
  const auto a =
      bind_arguments(args, {"ensure_ascii", "indent", "separators", "sort_keys"}, "tojson");
  JsonOptions options;
  options.ensure_ascii = a[0].truthy();
  options.indent = json_indent(a[1]);
  if (given(a[2])) {
    const std::vector<Value> pair = iterate(a[2]);
    if (pair.size() != 2 || !pair[0].is_string() || !pair[1].is_string()) {
      throw RenderError("tojson separators must be a pair of strings");
    }
    options.separators = std::make_pair(pair[0].as_string(), pair[1].as_string());
  }
  options.sort_keys = a[3].truthy();
  return Value(to_json(input, options));
}

Value default_value(Renderer&, const Value& input, const CallArgs& args) {
  const auto a = bind_arguments(args, {"default_value", "boolean"}, "default");
  const Value fallback = a[0].is_undefined() ? Value("") : a[0];
  if (input.is_undefined() || (a[1].truthy() && !input.truthy())) return fallback;
  return input;
}

Value replace(Renderer& r, const Value& input, const CallArgs& args) {
  const auto a = bind_arguments(args, {"old", "new", "count"}, "replace");
  const std::string s = to_str(input), old = to_str(a[0]), with = to_str(a[1]);
  if (given(a[2]) && !a[2].is_integral()) throw RenderError("replace() count must be an integer");
  const int64_t count = given(a[2]) ? a[2].as_int() : -1;
  const uint64_t n =
      old.empty() ? pystr::length(s) + 1 : static_cast<uint64_t>(pystr::count(s, old));
  if (with.size() > old.size() && s.size() + n * (with.size() - old.size()) > r.max_size()) {
    throw RenderError("replace() result is larger than the output limit");
  }
  return Value(pystr::replace(s, old, with, count));
}

Value string(Renderer&, const Value& input, const CallArgs& args) {
  bind_arguments(args, {}, "string");
  return Value(to_str(input));
}

// int(value, default=0, base=10): strings as Python's int(), else int(float(s)), else default.
Value to_int(Renderer&, const Value& input, const CallArgs& args) {
  const auto a = bind_arguments(args, {"default", "base"}, "int");
  const Value fallback = a[0].is_undefined() ? Value(0) : a[0];
  if (input.is_integral()) return input.as_int();
  if (input.kind() == Kind::Float) {
    const double v = std::trunc(input.as_float());
    if (!std::isfinite(v) || std::fabs(v) >= 9.2e18) return fallback;
    return static_cast<int64_t>(v);
  }
  if (!input.is_string()) return fallback;
  const int base = a[1].is_integral() ? static_cast<int>(a[1].as_int()) : 10;
  if (const auto v = pystr::parse_int(input.as_string(), base)) return *v;
  if (const auto f = pystr::parse_float(input.as_string());
      f && std::isfinite(*f) && std::fabs(*f) < 9.2e18) {
    return static_cast<int64_t>(std::trunc(*f));
  }
  return fallback;
}

Value to_float(Renderer&, const Value& input, const CallArgs& args) {
  const auto a = bind_arguments(args, {"default"}, "float");
  const Value fallback = a[0].is_undefined() ? Value(0.0) : a[0];
  if (input.is_number()) return input.as_float();
  if (input.is_string()) {
    if (const auto f = pystr::parse_float(input.as_string())) return *f;
  }
  return fallback;
}

Value indent(Renderer& r, const Value& input, const CallArgs& args) {
  const auto a = bind_arguments(args, {"width", "first", "blank"}, "indent");
  std::string prefix = "    ";
  if (a[0].is_string()) prefix = a[0].as_string();
  if (a[0].is_integral())
    prefix.assign(static_cast<size_t>(std::max<int64_t>(0, a[0].as_int())), ' ');
  const std::vector<std::string> lines = pystr::splitlines(to_str(input) + "\n");
  if (lines.size() * prefix.size() > r.max_size())
    throw RenderError("indent() result is too large");
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += "\n";
    const bool indented = a[2].truthy() ? i > 0 : i > 0 && !lines[i].empty();
    out += (indented ? prefix : "") + lines[i];
  }
  return Value(a[1].truthy() ? prefix + out : out);
}

Value safe(Renderer&, const Value& input, const CallArgs& args) {
  bind_arguments(args, {}, "safe");
  return Value(to_str(input));
}

Value escape(Renderer&, const Value& input, const CallArgs& args) {
  bind_arguments(args, {}, "escape");
  std::string out;
  for (char c : to_str(input)) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return Value(std::move(out));
}

Value absolute(Renderer&, const Value& input, const CallArgs& args) {
  bind_arguments(args, {}, "abs");
  if (input.kind() == Kind::Float) return std::fabs(input.as_float());
  if (!input.is_integral())
    throw RenderError("bad operand type for abs(): '" + input.type_name() + "'");
  if (input.as_int() == INT64_MIN) throw RenderError("integer overflow");
  return std::abs(input.as_int());
}

// round(value, precision=0, method='common'): 'common' is Python's round() (ties to even on the
// exact binary value, which printf's correctly rounded conversion gives).
Value round(Renderer&, const Value& input, const CallArgs& args) {
  const auto a = bind_arguments(args, {"precision", "method"}, "round");
  const int64_t precision = a[0].is_integral() ? a[0].as_int() : 0;
  const std::string method = a[1].is_undefined() ? "common" : to_str(a[1]);
  if (method != "common" && method != "ceil" && method != "floor") {
    throw RenderError("method must be common, ceil or floor");
  }
  if (!input.is_number())
    throw RenderError("type " + input.type_name() + " doesn't define __round__ method");
  if (method == "common" && input.is_integral()) return input.as_int();
  const double x = input.as_float();
  if (method != "common") {
    const double scale = std::pow(10.0, static_cast<double>(precision));
    return (method == "ceil" ? std::ceil(x * scale) : std::floor(x * scale)) / scale;
  }
  if (!std::isfinite(x)) return x;
  if (precision < 0) {
    const double scale = std::pow(10.0, static_cast<double>(-precision));
    return std::nearbyint(x / scale) * scale;
  }
  char buffer[512];
  std::snprintf(buffer, sizeof buffer, "%.*f", static_cast<int>(std::min<int64_t>(precision, 300)),
                x);
  return std::strtod(buffer, nullptr);
}

struct Entry {
  std::string_view name;
  FilterFn fn;
};

const std::vector<Entry>& table() {
  static const std::vector<Entry> entries = {
      {"abs", absolute},
      {"capitalize", text_filter<pystr::capitalize>},
      {"count", length},
      {"d", default_value},
      {"default", default_value},
      {"dictsort", dictsort},
      {"e", escape},
      {"escape", escape},
      {"first", first},
      {"float", to_float},
      {"indent", indent},
      {"int", to_int},
      {"items", items},
      {"join", join},
      {"last", last},
      {"length", length},
      {"list", list},
      {"lower", text_filter<pystr::lower>},
      {"map", map},
      {"max", max},
      {"min", min},
      {"reject", reject},
      {"rejectattr", rejectattr},
      {"replace", replace},
      {"reverse", reverse},
      {"round", round},
      {"safe", safe},
      {"select", select},
      {"selectattr", selectattr},
      {"sort", sort},
      {"string", string},
      {"sum", sum},
      {"title", text_filter<pystr::title_filter>},
      {"tojson", tojson},
      {"trim", trim},
      {"unique", unique},
      {"upper", text_filter<pystr::upper>},
  };
  return entries;
}

FilterFn find_filter(std::string_view name) {
  for (const Entry& e : table()) {
    if (e.name == name) return e.fn;
  }
  return nullptr;
}

}  // namespace
}  // namespace filters

bool has_filter(std::string_view name) {
  return filters::find_filter(name) != nullptr;
}

Value apply_filter(Renderer& renderer, const std::string& name, const Value& input,
                   const CallArgs& args) {
  const filters::FilterFn fn = filters::find_filter(name);
  if (fn == nullptr) throw RenderError("No filter named '" + name + "'.");
  Value result = fn(renderer, input, args);
  if (result.is_string() && result.as_string().size() > renderer.max_size()) {
    throw RenderError("the result of |" + name + " is larger than the output limit");
  }
  return result;
}

}  // namespace tokenfab::jinja
