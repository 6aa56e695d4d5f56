#include "core/tokenizer/jinja_operators.h"

#include <algorithm>
#include <climits>
#include <cmath>

#include "core/tokenizer/jinja_builtins.h"
#include "core/tokenizer/jinja_string.h"

namespace tokenfab::jinja {

namespace {

[[noreturn]] void unsupported(const std::string& op, const Value& a, const Value& b) {
  throw RenderError("unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" +
                    b.type_name() + "'");
}

[[noreturn]] void overflow() {
  throw RenderError("integer overflow (the result needs more than 64 bits)");
}

void check_size(size_t size, size_t max_size) {
  if (size > max_size) {
    throw RenderError("the result would be larger than the limit of " + std::to_string(max_size));
  }
}

// jinja2 names the object in an Undefined's message: "'dict object' has no attribute 'x'".
std::string object_name(const Value& obj) {
  if (obj.is_none()) return "None";
  return obj.type_name() + " object";
}

Value missing(const Value& obj, const Value& key) {
  if (key.is_string()) {
    return Value::undefined("'" + object_name(obj) + "' has no attribute '" + key.as_string() +
                            "'");
  }
  return Value::undefined("'" + object_name(obj) + "' has no element " + repr(key));
}

int64_t int_power(int64_t base, int64_t exponent) {
  int64_t result = 1;
  while (exponent > 0) {
    if ((exponent & 1) && __builtin_mul_overflow(result, base, &result)) overflow();
    exponent >>= 1;
    if (exponent > 0 && __builtin_mul_overflow(base, base, &base)) overflow();
  }
  return result;
}

Value int_arithmetic(const std::string& op, int64_t x, int64_t y) {
  int64_t r = 0;
  if (op == "+") {
    if (__builtin_add_overflow(x, y, &r)) overflow();
  } else if (op == "-") {
    if (__builtin_sub_overflow(x, y, &r)) overflow();
  } else if (op == "*") {
    if (__builtin_mul_overflow(x, y, &r)) overflow();
  } else if (op == "//" || op == "%") {
    if (y == 0) throw RenderError("integer division or modulo by zero");
    if (x == INT64_MIN && y == -1) overflow();
    int64_t q = x / y, m = x % y;
    if (m != 0 && ((m < 0) != (y < 0))) {
      --q;
      m += y;
    }
    r = op == "//" ? q : m;
  } else if (op == "**") {
    if (y < 0) {
      if (x == 0) throw RenderError("0.0 cannot be raised to a negative power");
      return Value(std::pow(static_cast<double>(x), static_cast<double>(y)));
    }
    r = int_power(x, y);
  }
  return Value(r);
}

Value float_arithmetic(const std::string& op, double x, double y) {
  if (op == "+") return Value(x + y);
  if (op == "-") return Value(x - y);
  if (op == "*") return Value(x * y);
  if (op == "/") {
    if (y == 0) throw RenderError("division by zero");
    return Value(x / y);
  }
  if (op == "//" || op == "%") {
    if (y == 0) throw RenderError("float divmod()");
    // CPython's float_divmod.
    double m = std::fmod(x, y);
    double div = (x - m) / y;
    if (m != 0 && ((y < 0) != (m < 0))) {
      m += y;
      div -= 1.0;
    }
    if (op == "%") return Value(m == 0 ? std::copysign(0.0, y) : m);
    if (div == 0) return Value(std::copysign(0.0, x / y));
    double floored = std::floor(div);
    if (div - floored > 0.5) floored += 1.0;
    return Value(floored);
  }
  if (x == 0 && y < 0) throw RenderError("0.0 cannot be raised to a negative power");
  if (x < 0 && std::floor(y) != y)
    throw RenderError("a negative number raised to a fractional power is not supported");
  return Value(std::pow(x, y));
}

Value repeat(const Value& seq, int64_t times, size_t max_size) {
  if (times <= 0) return seq.is_string() ? Value("") : Value::list({});
  if (seq.is_string()) {
    const std::string& s = seq.as_string();
    check_size(s.size() * static_cast<uint64_t>(times), max_size);
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += s;
    return Value(std::move(out));
  }
  const ListData& l = seq.as_list();
  check_size(l.items.size() * static_cast<uint64_t>(times), max_size);
  std::vector<Value> out;
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), l.items.begin(), l.items.end());
  return l.is_tuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

Value concatenate(const std::string& op, const Value& a, const Value& b, size_t max_size) {
  if (a.is_string() && b.is_string()) {
    check_size(a.as_string().size() + b.as_string().size(), max_size);
    return Value(a.as_string() + b.as_string());
  }
  if (a.kind() == Kind::List && b.kind() == Kind::List &&
      a.as_list().is_tuple == b.as_list().is_tuple) {
    std::vector<Value> items = a.as_list().items;
    check_size(items.size() + b.as_list().items.size(), max_size);
    items.insert(items.end(), b.as_list().items.begin(), b.as_list().items.end());
    return a.as_list().is_tuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
  }
  unsupported(op, a, b);
}

}  // namespace

void fail_undefined(const Value& undefined) {
  const std::string& hint = undefined.undefined_hint();
  throw RenderError(hint.empty() ? "an undefined value was used" : hint);
}

Value binary_operator(const std::string& op, const Value& a, const Value& b, size_t max_size) {
  if (op == "~") {
    std::string text = to_str(a);
    text += to_str(b);
    check_size(text.size(), max_size);
    return Value(std::move(text));
  }
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral() && op != "/") {
      return int_arithmetic(op, a.as_int(), b.as_int());
    }
    return float_arithmetic(op, a.as_float(), b.as_float());
  }
  if (op == "+") return concatenate(op, a, b, max_size);
  if (op == "*") {
    if (a.is_sequence() && b.is_integral()) return repeat(a, b.as_int(), max_size);
    if (b.is_sequence() && a.is_integral()) return repeat(b, a.as_int(), max_size);
  }
  if (op == "%" && a.is_string()) throw RenderError("string formatting with '%' is not supported");
  unsupported(op, a, b);
}

Value unary_operator(const std::string& op, const Value& a) {
  if (a.is_undefined()) fail_undefined(a);
  if (!a.is_number())
    throw RenderError("bad operand type for unary " + op + ": '" + a.type_name() + "'");
  if (a.kind() == Kind::Float) return Value(op == "-" ? -a.as_float() : a.as_float());
  if (op == "-" && a.as_int() == INT64_MIN) overflow();
  return Value(op == "-" ? -a.as_int() : a.as_int());
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::Undefined:
      return false;
    case Kind::String:
      if (!item.is_string()) {
        throw RenderError("'in <string>' requires string as left operand, not " + item.type_name());
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Kind::List:
      for (const Value& v : container.as_list().items) {
        if (equals(v, item)) return true;
      }
      return false;
    case Kind::Dict:
      return container.as_dict().find(item) != nullptr;
    default:
      throw RenderError("argument of type '" + container.type_name() + "' is not iterable");
  }
}

bool compare_operator(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return equals(a, b);
  if (op == "!=") return !equals(a, b);
  if (op == "in") return contains(b, a);
  if (op == "not in") return !contains(b, a);
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  const std::optional<int> order = compare(a, b);
  if (!order) {
    throw RenderError("'" + op + "' not supported between instances of '" + a.type_name() +
                      "' and '" + b.type_name() + "'");
  }
  if (op == "<") return *order < 0;
  if (op == ">") return *order > 0;
  if (op == "<=") return *order <= 0;
  return *order >= 0;
}

// The methods HF's immutable sandbox refuses: they would change a list or dict.
bool is_mutating_method(const Value& obj, std::string_view name) {
  static constexpr std::string_view kList[] = {"append", "extend", "insert", "pop",
                                               "remove", "clear",  "sort",   "reverse"};
  static constexpr std::string_view kDict[] = {"update", "pop", "popitem", "setdefault", "clear"};
  if (obj.kind() == Kind::List)
    return std::find(std::begin(kList), std::end(kList), name) != std::end(kList);
  if (obj.kind() == Kind::Dict)
    return std::find(std::begin(kDict), std::end(kDict), name) != std::end(kDict);
  return false;
}

Value get_attribute(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (is_mutating_method(obj, name)) {  // as jinja2's sandbox: undefined, an error when called
    return Value::undefined("access to attribute '" + name + "' of '" + obj.type_name() +
                            "' object is unsafe.");
  }
  if (std::optional<Value> method = method_of(obj, name)) return *method;
  if (obj.kind() == Kind::Dict) {
    if (const Value* v = obj.as_dict().find(std::string_view(name))) return *v;
  } else if (obj.kind() == Kind::Namespace) {
    if (const Value* v = obj.namespace_attributes().find(std::string_view(name))) return *v;
  }
  return missing(obj, Value(name));
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.kind() == Kind::Dict) {
    if (const Value* v = obj.as_dict().find(key)) return *v;
  } else if (obj.is_sequence() && key.is_integral()) {
    const int64_t n = obj.is_string() ? static_cast<int64_t>(pystr::length(obj.as_string()))
                                      : static_cast<int64_t>(obj.as_list().items.size());
    int64_t i = key.as_int();
    if (i < 0) i += n;
    if (i >= 0 && i < n) {
      if (!obj.is_string()) return obj.as_list().items[static_cast<size_t>(i)];
      const std::vector<uint32_t> cps = pystr::code_points(obj.as_string());
      return Value(
          pystr::from_code_points(cps, static_cast<size_t>(i), static_cast<size_t>(i) + 1));
    }
  }
  if (key.is_string()) return get_attribute(obj, key.as_string());
  return missing(obj, key);
}

Value get_slice(const Value& obj, const std::optional<int64_t>& start,
                const std::optional<int64_t>& stop, const std::optional<int64_t>& step) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (!obj.is_sequence()) return Value::undefined("'" + object_name(obj) + "' cannot be sliced");
  const int64_t by = step.value_or(1);
  if (by == 0) throw RenderError("slice step cannot be zero");
  std::vector<uint32_t> cps;
  if (obj.is_string()) cps = pystr::code_points(obj.as_string());
  const int64_t n = obj.is_string() ? static_cast<int64_t>(cps.size())
                                    : static_cast<int64_t>(obj.as_list().items.size());
  // Python's PySlice_AdjustIndices.
  const auto adjust = [&](std::optional<int64_t> v, int64_t absent) {
    if (!v) return absent;
    int64_t i = *v;
    if (i < 0) {
      i += n;
      if (i < 0) i = by < 0 ? -1 : 0;
    } else if (i >= n) {
      i = by < 0 ? n - 1 : n;
    }
    return i;
  };
  const int64_t first = adjust(start, by < 0 ? n - 1 : 0);
  const int64_t last = adjust(stop, by < 0 ? -1 : n);
  std::vector<size_t> picked;
  for (int64_t i = first; by > 0 ? i < last : i > last; i += by)
    picked.push_back(static_cast<size_t>(i));
  if (obj.is_string()) {
    std::string out;
    for (size_t i : picked) out += pystr::from_code_points(cps, i, i + 1);
    return Value(std::move(out));
  }
  std::vector<Value> items;
  for (size_t i : picked) items.push_back(obj.as_list().items[i]);
  return obj.as_list().is_tuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
}

}  // namespace tokenfab::jinja
