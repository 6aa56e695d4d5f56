#include "core/tokenizer/jinja_value.h"

#include <charconv>
#include <cmath>

#include "core/tokenizer/jinja_string.h"

namespace tokenfab::jinja {

namespace {

std::string join_reprs(const std::vector<Value>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += ", ";
    out += repr(items[i]);
  }
  return out;
}

std::string dict_repr(const DictData& d) {
  std::string out = "{";
  for (size_t i = 0; i < d.items.size(); ++i) {
    if (i > 0) out += ", ";
    out += repr(d.items[i].first) + ": " + repr(d.items[i].second);
  }
  return out + "}";
}

int sign_of(double x) {
  return x < 0 ? -1 : x > 0 ? 1 : 0;
}

thread_local int t_nesting = 0;

}  // namespace

NestingGuard::NestingGuard() {
  if (++t_nesting > kMaxNesting) {
    --t_nesting;
    throw RenderError("a value is nested more than " + std::to_string(kMaxNesting) +
                      " levels deep (or contains itself)");
  }
}

NestingGuard::~NestingGuard() {
  --t_nesting;
}

const Value* DictData::find(const Value& key) const {
  for (const auto& [k, v] : items) {
    if (equals(k, key)) return &v;
  }
  return nullptr;
}

const Value* DictData::find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k.is_string() && k.as_string() == key) return &v;
  }
  return nullptr;
}

void DictData::set(Value key, Value value) {
  for (auto& [k, v] : items) {
    if (equals(k, key)) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

Value Value::undefined(std::string hint) {
  return Value(Kind::Undefined, std::make_shared<const std::string>(std::move(hint)));
}

const std::string& Value::undefined_hint() const {
  static const std::string kNone;
  const auto* hint = std::get_if<Text>(&data_);
  return hint != nullptr ? **hint : kNone;
}
Value Value::none() {
  return Value(Kind::None, std::monostate());
}

Value Value::list(std::vector<Value> items) {
  return Value(Kind::List, std::make_shared<ListData>(ListData{std::move(items), false}));
}

Value Value::tuple(std::vector<Value> items) {
  return Value(Kind::List, std::make_shared<ListData>(ListData{std::move(items), true}));
}

Value Value::dict(DictData data) {
  return Value(Kind::Dict, std::make_shared<DictData>(std::move(data)));
}

Value Value::namespace_object(DictData attributes) {
  return Value(Kind::Namespace, std::make_shared<DictData>(std::move(attributes)));
}

Value Value::callable(std::string name, std::function<Value(Renderer&, const CallArgs&)> fn) {
  return Value(Kind::Callable,
               std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)}));
}

bool Value::is_number() const {
  return kind_ == Kind::Bool || kind_ == Kind::Int || kind_ == Kind::Float;
}

bool Value::is_sequence() const {
  return kind_ == Kind::String || kind_ == Kind::List;
}

int64_t Value::as_int() const {
  return kind_ == Kind::Bool ? int64_t{as_bool()} : std::get<int64_t>(data_);
}

double Value::as_float() const {
  return kind_ == Kind::Float ? std::get<double>(data_) : static_cast<double>(as_int());
}

const void* Value::identity() const {
  if (const auto* p = std::get_if<std::shared_ptr<ListData>>(&data_)) return p->get();
  if (const auto* p = std::get_if<std::shared_ptr<DictData>>(&data_)) return p->get();
  if (const auto* p = std::get_if<std::shared_ptr<const Callable>>(&data_)) return p->get();
  return nullptr;
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None:
      return false;
    case Kind::Bool:
      return as_bool();
    case Kind::Int:
      return as_int() != 0;
    case Kind::Float:
      return as_float() != 0.0;
    case Kind::String:
      return !as_string().empty();
    case Kind::List:
      return !as_list().items.empty();
    case Kind::Dict:
      return !as_dict().items.empty();
    case Kind::Namespace:
    case Kind::Callable:
      return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::Undefined:
      return "Undefined";
    case Kind::None:
      return "NoneType";
    case Kind::Bool:
      return "bool";
    case Kind::Int:
      return "int";
    case Kind::Float:
      return "float";
    case Kind::String:
      return "str";
    case Kind::List:
      return as_list().is_tuple ? "tuple" : "list";
    case Kind::Dict:
      return "dict";
    case Kind::Namespace:
      return "Namespace";
    case Kind::Callable:
      return "function";
  }
  return "object";
}

std::string format_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  const std::string_view text(buf, static_cast<size_t>(result.ptr - buf));
  const size_t e = text.find('e');
  std::string sign, digits;
  for (char c : text.substr(0, e)) {
    if (c == '-') sign = "-";
    if (c >= '0' && c <= '9') digits += c;
  }
  int exponent = 0;
  std::string_view exp_text = text.substr(e + 1);
  if (exp_text.front() == '+') exp_text.remove_prefix(1);
  std::from_chars(exp_text.data(), exp_text.data() + exp_text.size(), exponent);
  const int decpt = exponent + 1;  // digits d1 d2 ... mean 0.d1d2... * 10^decpt
  const int n = static_cast<int>(digits.size());
  if (decpt <= -4 || decpt > 16) {
    std::string out = sign + digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    const int shown = decpt - 1;
    const std::string magnitude = std::to_string(std::abs(shown));
    return out + "e" + (shown < 0 ? "-" : "+") + (magnitude.size() < 2 ? "0" : "") + magnitude;
  }
  if (decpt <= 0) return sign + "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
  if (decpt >= n) return sign + digits + std::string(static_cast<size_t>(decpt - n), '0') + ".0";
  return sign + digits.substr(0, static_cast<size_t>(decpt)) + "." +
         digits.substr(static_cast<size_t>(decpt));
}

std::string to_str(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined:
      return "";
    case Kind::None:
      return "None";
    case Kind::Bool:
      return v.as_bool() ? "True" : "False";
    case Kind::Int:
      return std::to_string(v.as_int());
    case Kind::Float:
      return format_float(v.as_float());
    case Kind::String:
      return v.as_string();
    case Kind::List: {
      const NestingGuard guard;
      const ListData& l = v.as_list();
      if (!l.is_tuple) return "[" + join_reprs(l.items) + "]";
      return "(" + join_reprs(l.items) + (l.items.size() == 1 ? ",)" : ")");
    }
    case Kind::Dict: {
      const NestingGuard guard;
      return dict_repr(v.as_dict());
    }
    case Kind::Namespace: {
      const NestingGuard guard;
      return "<Namespace " + dict_repr(v.namespace_attributes()) + ">";
    }
    case Kind::Callable:
      return "<function " + v.as_callable().name + ">";
  }
  return "";
}

std::string repr(const Value& v) {
  if (v.is_string()) return pystr::repr(v.as_string());
  if (v.is_undefined()) return "Undefined";
  return to_str(v);
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.as_int() == b.as_int();
    return a.as_float() == b.as_float();
  }
  if (a.kind() != b.kind()) return false;
  const NestingGuard guard;
  switch (a.kind()) {
    case Kind::Undefined:
    case Kind::None:
      return true;
    case Kind::String:
      return a.as_string() == b.as_string();
    case Kind::List: {
      const ListData &x = a.as_list(), &y = b.as_list();
      if (x.is_tuple != y.is_tuple || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i) {
        if (!equals(x.items[i], y.items[i])) return false;
      }
      return true;
    }
    case Kind::Dict: {
      const DictData &x = a.as_dict(), &y = b.as_dict();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [key, value] : x.items) {
        const Value* other = y.find(key);
        if (other == nullptr || !equals(value, *other)) return false;
      }
      return true;
    }
    default:
      return a.identity() == b.identity();
  }
}

std::optional<int> compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) {
      return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
    }
    if (std::isnan(a.as_float()) || std::isnan(b.as_float())) return std::nullopt;
    return sign_of(a.as_float() - b.as_float());
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.as_string().compare(b.as_string());  // UTF-8 keeps code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.kind() == Kind::List && b.kind() == Kind::List &&
      a.as_list().is_tuple == b.as_list().is_tuple) {
    const NestingGuard guard;
    const auto &x = a.as_list().items, &y = b.as_list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equals(x[i], y[i])) return compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  return std::nullopt;
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined:
      return {};
    case Kind::List:
      return v.as_list().items;
    case Kind::Dict: {
      std::vector<Value> keys;
      for (const auto& item : v.as_dict().items) keys.push_back(item.first);
      return keys;
    }
    case Kind::String: {
      const std::vector<uint32_t> cps = pystr::code_points(v.as_string());
      std::vector<Value> chars;
      for (size_t i = 0; i < cps.size(); ++i)
        chars.emplace_back(pystr::from_code_points(cps, i, i + 1));
      return chars;
    }
    default:
      throw RenderError("'" + v.type_name() + "' object is not iterable");
  }
}

}  // namespace tokenfab::jinja
