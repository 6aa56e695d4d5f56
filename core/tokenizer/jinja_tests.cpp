// Jinja tests: `x is name(args)`, and select/reject's predicates.

#include <cmath>

#include "core/tokenizer/jinja_builtins.h"
#include "core/tokenizer/jinja_operators.h"
#include "core/tokenizer/jinja_string.h"

namespace tokenfab::jinja {

namespace {

using TestFn = bool (*)(const Value& v, const std::vector<Value>& args);

const Value& argument(const std::vector<Value>& args, const char* test) {
  if (args.empty()) throw RenderError(std::string("the test '") + test + "' needs an argument");
  return args[0];
}

// value % n == 0, with Python's int and float modulo.
bool divisible(const Value& v, const Value& n) {
  const Value rest = binary_operator("%", v, n, 0);
  return rest.as_float() == 0.0;
}

bool has_case(const std::string& s, bool upper) {
  bool cased = false;
  for (uint32_t cp : pystr::code_points(s)) {
    if (pystr::to_upper(cp) == cp && pystr::to_lower(cp) == cp) continue;
    cased = true;
    if ((upper ? pystr::to_upper(cp) : pystr::to_lower(cp)) != cp) return false;
  }
  return cased;
}

const Value& string_or_empty(const Value& v) {
  static const Value kEmpty("");
  return v.is_string() ? v : kEmpty;
}

const std::vector<std::pair<std::string_view, TestFn>>& tests() {
  using A = const std::vector<Value>&;
  static const std::vector<std::pair<std::string_view, TestFn>> table = {
      {"defined", [](const Value& v, A) { return !v.is_undefined(); }},
      {"undefined", [](const Value& v, A) { return v.is_undefined(); }},
      {"none", [](const Value& v, A) { return v.is_none(); }},
      {"boolean", [](const Value& v, A) { return v.kind() == Kind::Bool; }},
      {"true", [](const Value& v, A) { return v.kind() == Kind::Bool && v.as_bool(); }},
      {"false", [](const Value& v, A) { return v.kind() == Kind::Bool && !v.as_bool(); }},
      {"integer", [](const Value& v, A) { return v.kind() == Kind::Int; }},
      {"float", [](const Value& v, A) { return v.kind() == Kind::Float; }},
      {"number", [](const Value& v, A) { return v.is_number(); }},
      {"string", [](const Value& v, A) { return v.is_string(); }},
      {"mapping", [](const Value& v, A) { return v.kind() == Kind::Dict; }},
      {"callable", [](const Value& v, A) { return v.kind() == Kind::Callable; }},
      // Undefined iterates as empty and has a length in jinja2, so it passes both.
      {"iterable", [](const Value& v,
                      A) { return v.is_undefined() || v.is_sequence() || v.kind() == Kind::Dict; }},
      {"sequence", [](const Value& v,
                      A) { return v.is_undefined() || v.is_sequence() || v.kind() == Kind::Dict; }},
      {"divisibleby", [](const Value& v, A a) { return divisible(v, argument(a, "divisibleby")); }},
      {"even", [](const Value& v, A) { return divisible(v, Value(2)); }},
      {"odd", [](const Value& v, A) { return !divisible(v, Value(2)); }},
      {"lower", [](const Value& v, A) { return has_case(to_str(string_or_empty(v)), false); }},
      {"upper", [](const Value& v, A) { return has_case(to_str(string_or_empty(v)), true); }},
      {"in", [](const Value& v, A a) { return contains(argument(a, "in"), v); }},
      {"sameas",
       [](const Value& v, A a) {
         const Value& other = argument(a, "sameas");
         if (v.identity() != nullptr || other.identity() != nullptr)
           return v.identity() == other.identity();
         return v.kind() == other.kind() && (v.kind() == Kind::None || v.kind() == Kind::Bool) &&
                equals(v, other);
       }},
      {"eq", [](const Value& v, A a) { return compare_operator("==", v, argument(a, "eq")); }},
      {"ne", [](const Value& v, A a) { return compare_operator("!=", v, argument(a, "ne")); }},
      {"lt", [](const Value& v, A a) { return compare_operator("<", v, argument(a, "lt")); }},
      {"le", [](const Value& v, A a) { return compare_operator("<=", v, argument(a, "le")); }},
      {"gt", [](const Value& v, A a) { return compare_operator(">", v, argument(a, "gt")); }},
      {"ge", [](const Value& v, A a) { return compare_operator(">=", v, argument(a, "ge")); }},
  };
  return table;
}

// jinja2's other names for the comparison tests.
std::string_view canonical(std::string_view name) {
  if (name == "equalto" || name == "==") return "eq";
  if (name == "!=") return "ne";
  if (name == "lessthan" || name == "<") return "lt";
  if (name == "<=") return "le";
  if (name == "greaterthan" || name == ">") return "gt";
  if (name == ">=") return "ge";
  return name;
}

TestFn find_test(std::string_view name) {
  const std::string_view key = canonical(name);
  for (const auto& [test_name, fn] : tests()) {
    if (test_name == key) return fn;
  }
  return nullptr;
}

}  // namespace

bool has_test(std::string_view name) {
  return find_test(name) != nullptr;
}

bool apply_test(Renderer&, const std::string& name, const Value& input, const CallArgs& args) {
  const TestFn fn = find_test(name);
  if (fn == nullptr) throw RenderError("no test named '" + name + "'");
  if (!args.keyword.empty())
    throw RenderError("the test '" + name + "' takes no keyword arguments");
  return fn(input, args.positional);
}

}  // namespace tokenfab::jinja
