#pragma once
// The values of our Jinja implementation (jinja_*.{h,cpp}), with Python's semantics as jinja2
// gives them to chat templates: None, bool, int, float, str (UTF-8), list/tuple, dict (insertion
// order), jinja2's Undefined (renders empty, is falsy, fails on attribute access), namespace()
// objects (the only mutable value, shared like a Python object) and callables (globals, macros,
// bound methods). Lists and dicts are immutable once built (HF renders in an immutable sandbox),
// so copies share their storage.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace tokenfab::jinja {

class Value;
class Renderer;

// An error while evaluating, without a position: the renderer adds the template's source, line and
// column of the expression being evaluated. The messages follow Python's and jinja2's.
class RenderError : public std::runtime_error {
 public:
  explicit RenderError(const std::string& message) : std::runtime_error(message) {}
};

struct ListData {
  std::vector<Value> items;
  bool is_tuple = false;  // only changes how it prints: (1, 2)
};

// A Python dict: keys are compared with ==, kept in insertion order (templates hold few keys).
struct DictData {
  std::vector<std::pair<Value, Value>> items;

  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(Value key, Value value);  // replaces in place, else appends
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// A global function, macro or bound method. `call` may render (macros) through the Renderer.
struct Callable {
  std::string name;
  std::function<Value(Renderer&, const CallArgs&)> call;
};

enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Callable };

class Value {
 public:
  Value() = default;  // undefined
  Value(bool b) : kind_(Kind::Bool), data_(b) {}
  Value(int v) : Value(static_cast<int64_t>(v)) {}
  Value(int64_t v) : kind_(Kind::Int), data_(v) {}
  Value(double v) : kind_(Kind::Float), data_(v) {}
  Value(std::string s)
      : kind_(Kind::String), data_(std::make_shared<const std::string>(std::move(s))) {}
  Value(const char* s) : Value(std::string(s)) {}

  // `hint` is what jinja2 says when the undefined value is used: "'x' is undefined".
  static Value undefined(std::string hint);
  static Value none();
  static Value list(std::vector<Value> items);
  static Value tuple(std::vector<Value> items);
  static Value dict(DictData data);
  static Value namespace_object(DictData attributes);
  static Value callable(std::string name, std::function<Value(Renderer&, const CallArgs&)> fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_number() const;  // bool, int or float (bool is an int in Python)
  bool is_integral() const { return kind_ == Kind::Int || kind_ == Kind::Bool; }
  bool is_sequence() const;  // str, list or tuple

  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const;   // int or bool
  double as_float() const;  // any number
  const std::string& as_string() const { return *std::get<Text>(data_); }
  const ListData& as_list() const { return *std::get<std::shared_ptr<ListData>>(data_); }
  const DictData& as_dict() const { return *std::get<std::shared_ptr<DictData>>(data_); }
  DictData& namespace_attributes() const { return *std::get<std::shared_ptr<DictData>>(data_); }
  const Callable& as_callable() const { return *std::get<std::shared_ptr<const Callable>>(data_); }
  const std::string& undefined_hint() const;
  const void* identity() const;  // for `is sameas` on shared objects

  bool truthy() const;
  std::string type_name() const;  // Python's: 'str', 'int', 'NoneType', 'dict', 'Undefined', ...

 private:
  // Strings are shared: values are copied freely (into scopes, lists, loop variables), and a
  // list may repeat one long string many times.
  using Text = std::shared_ptr<const std::string>;
  using Data = std::variant<std::monostate, bool, int64_t, double, Text, std::shared_ptr<ListData>,
                            std::shared_ptr<DictData>, std::shared_ptr<const Callable>>;
  Value(Kind kind, Data data) : kind_(kind), data_(std::move(data)) {}

  Kind kind_ = Kind::Undefined;
  Data data_;  // Undefined: its hint (Text) or nothing
};

// Bounds the recursion of to_str, equals, compare and to_json: a namespace can hold itself, and a
// loop can nest lists thousands deep. Throws RenderError past kMaxNesting levels.
class NestingGuard {
 public:
  static constexpr int kMaxNesting = 200;
  NestingGuard();
  ~NestingGuard();
  NestingGuard(const NestingGuard&) = delete;
  NestingGuard& operator=(const NestingGuard&) = delete;
};

// Python's str(v) (Undefined renders ""), repr(v), v == w and the order of v and w: -1, 0 or 1,
// or nullopt where Python raises TypeError ('<' not supported between ...).
std::string to_str(const Value& v);
std::string repr(const Value& v);
bool equals(const Value& a, const Value& b);
std::optional<int> compare(const Value& a, const Value& b);

// repr() of a float: the shortest text that reads back to the same double, in Python's layout
// (1.0, 1e+16, 1e-05, inf, nan).
std::string format_float(double v);

// The items `for x in v` visits: a list's items, a dict's keys, a string's characters, nothing
// for Undefined. Throws RenderError ("'int' object is not iterable") for anything else.
std::vector<Value> iterate(const Value& v);

// json.dumps(v, ensure_ascii=..., indent=..., separators=..., sort_keys=...), as HF's tojson
// filter calls it (ensure_ascii=False unless the template asks). `indent` is nullopt for none; a
// non-empty separators pair overrides the defaults. Throws RenderError for values JSON cannot hold
// (Undefined, callables).
struct JsonOptions {
  bool ensure_ascii = false;  // escape every non-ASCII character as \uXXXX
  std::optional<std::string> indent;
  std::optional<std::pair<std::string, std::string>> separators;
  bool sort_keys = false;
};
std::string to_json(const Value& v, const JsonOptions& options);

}  // namespace tokenfab::jinja
