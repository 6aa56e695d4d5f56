// Value: construction of arrays and the range-checked conversions declared in gguf_reader.h.

#include <limits>
#include <type_traits>

#include "core/gguf/gguf_reader.h"

namespace tokenfab::gguf {

namespace {

[[noreturn]] void conversion_error(std::string_view what, std::string_view expected,
                                   const Value& value, std::string_view detail = {}) {
  std::string message = std::string(what) + ": expected " + std::string(expected) + ", got ";
  message += detail.empty() ? std::string(value_type_name(value.type())) : std::string(detail);
  throw Error(message);
}

// An integer value widened to 64 bits: `s` holds it when `is_signed`, else `u`.
struct WideInt {
  bool is_signed = false;
  int64_t s = 0;
  uint64_t u = 0;
};

std::optional<WideInt> widen(const Value& value) {
  return std::visit(
      [](const auto& v) -> std::optional<WideInt> {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool> || !std::is_integral_v<T>) {
          return std::nullopt;
        } else if constexpr (std::is_signed_v<T>) {
          return WideInt{true, static_cast<int64_t>(v), 0};
        } else {
          return WideInt{false, 0, static_cast<uint64_t>(v)};
        }
      },
      value.storage());
}

std::string element_what(std::string_view what, size_t index) {
  return std::string(what) + "[" + std::to_string(index) + "]";
}

}  // namespace

Value Value::array(ValueType element_type, Array items) {
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].type() != element_type) {
      throw Error("gguf array: element " + std::to_string(i) + " has type " +
                  value_type_name(items[i].type()) + ", expected " + value_type_name(element_type));
    }
  }
  return {ValueType::Array, std::move(items), element_type};
}

Value Value::string_array(const std::vector<std::string>& items) {
  Array values;
  values.reserve(items.size());
  for (const auto& item : items) values.push_back(Value::string(item));
  return {ValueType::Array, std::move(values), ValueType::String};
}

bool Value::is_integer() const { return widen(*this).has_value(); }

int64_t Value::as_int(std::string_view what) const {
  auto wide = widen(*this);
  if (!wide) conversion_error(what, "an integer", *this);
  if (wide->is_signed) return wide->s;
  if (wide->u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    conversion_error(what, "an integer that fits in int64", *this, std::to_string(wide->u));
  }
  return static_cast<int64_t>(wide->u);
}

uint64_t Value::as_uint(std::string_view what) const {
  auto wide = widen(*this);
  if (!wide) conversion_error(what, "a non-negative integer", *this);
  if (!wide->is_signed) return wide->u;
  if (wide->s < 0) conversion_error(what, "a non-negative integer", *this, std::to_string(wide->s));
  return static_cast<uint64_t>(wide->s);
}

double Value::as_float(std::string_view what) const {
  if (const auto* f = std::get_if<float>(&storage_)) return *f;
  if (const auto* d = std::get_if<double>(&storage_)) return *d;
  auto wide = widen(*this);
  if (!wide) conversion_error(what, "a number", *this);
  return wide->is_signed ? static_cast<double>(wide->s) : static_cast<double>(wide->u);
}

bool Value::as_bool(std::string_view what) const {
  if (const auto* b = std::get_if<bool>(&storage_)) return *b;
  conversion_error(what, "a bool", *this);
}

const std::string& Value::as_string(std::string_view what) const {
  if (const auto* s = std::get_if<std::string>(&storage_)) return *s;
  conversion_error(what, "a string", *this);
}

const Value::Array& Value::as_array(std::string_view what) const {
  if (const auto* a = std::get_if<Array>(&storage_)) return *a;
  conversion_error(what, "an array", *this);
}

std::vector<std::string> Value::as_string_array(std::string_view what) const {
  const Array& items = as_array(what);
  std::vector<std::string> out;
  out.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    if (const auto* s = std::get_if<std::string>(&items[i].storage())) {
      out.push_back(*s);
    } else {
      out.push_back(items[i].as_string(element_what(what, i)));
    }
  }
  return out;
}

std::vector<int64_t> Value::as_int_array(std::string_view what) const {
  const Array& items = as_array(what);
  std::vector<int64_t> out;
  out.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    // The fast path skips building the element name unless the element fails.
    if (auto wide = widen(items[i]);
        wide && (wide->is_signed ||
                 wide->u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))) {
      out.push_back(wide->is_signed ? wide->s : static_cast<int64_t>(wide->u));
    } else {
      out.push_back(items[i].as_int(element_what(what, i)));
    }
  }
  return out;
}

std::vector<double> Value::as_float_array(std::string_view what) const {
  const Array& items = as_array(what);
  std::vector<double> out;
  out.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    if (const auto* f = std::get_if<float>(&items[i].storage())) {
      out.push_back(*f);
    } else {
      out.push_back(items[i].as_float(element_what(what, i)));
    }
  }
  return out;
}

}  // namespace tokenfab::gguf
