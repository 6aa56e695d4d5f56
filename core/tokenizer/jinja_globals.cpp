// Global functions (range, namespace, dict, raise_exception, strftime_now) and argument binding.

#include <algorithm>
#include <ctime>

#include "core/tokenizer/jinja_builtins.h"
#include "core/tokenizer/jinja_renderer.h"

namespace tokenfab::jinja {

namespace {

int64_t integer_argument(const Value& v, const char* what) {
  if (!v.is_integral()) {
    throw RenderError(std::string("'") + v.type_name() +
                      "' object cannot be interpreted as an integer (" + what + ")");
  }
  return v.as_int();
}

Value range(Renderer& r, const CallArgs& args) {
  if (!args.keyword.empty()) throw RenderError("range() takes no keyword arguments");
  const auto& p = args.positional;
  if (p.empty() || p.size() > 3)
    throw RenderError("range expected 1 to 3 arguments, got " + std::to_string(p.size()));
  const int64_t start = p.size() == 1 ? 0 : integer_argument(p[0], "range");
  const int64_t stop = integer_argument(p.size() == 1 ? p[0] : p[1], "range");
  const int64_t step = p.size() == 3 ? integer_argument(p[2], "range") : 1;
  if (step == 0) throw RenderError("range() arg 3 must not be zero");
  std::vector<Value> items;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (static_cast<int64_t>(items.size()) >= r.limits().max_iterations) {
      throw RenderError("range() is longer than the limit of " +
                        std::to_string(r.limits().max_iterations) + " items");
    }
    items.emplace_back(i);
    if ((step > 0 && i > INT64_MAX - step) || (step < 0 && i < INT64_MIN - step)) break;
  }
  return Value::list(std::move(items));
}

// namespace(mapping?, **attributes) and dict(mapping?, **items).
DictData mapping_arguments(const CallArgs& args, const char* what) {
  DictData data;
  if (args.positional.size() > 1)
    throw RenderError(std::string(what) + "() takes at most 1 positional argument");
  if (args.positional.size() == 1) {
    const Value& m = args.positional[0];
    if (m.kind() == Kind::Dict) {
      data = m.as_dict();
    } else if (m.kind() == Kind::Namespace) {
      data = m.namespace_attributes();
    } else {
      throw RenderError(std::string(what) + "() takes a mapping, not '" + m.type_name() + "'");
    }
  }
  for (const auto& [key, value] : args.keyword) data.set(Value(key), value);
  return data;
}

Value make_namespace(Renderer& r, const CallArgs& args) {
  Value ns = Value::namespace_object(mapping_arguments(args, "namespace"));
  r.keep_namespace(ns);
  return ns;
}

Value make_dict(Renderer&, const CallArgs& args) {
  return Value::dict(mapping_arguments(args, "dict"));
}

Value raise_exception(Renderer&, const CallArgs& args) {
  const std::vector<Value> a = bind_arguments(args, {"message"}, "raise_exception");
  throw TemplateRaised(to_str(a[0]));
}

// datetime.now().strftime(format), with the renderer's clock.
Value strftime_now(Renderer& r, const CallArgs& args) {
  const std::vector<Value> a = bind_arguments(args, {"format"}, "strftime_now");
  if (!a[0].is_string())
    throw RenderError("strftime_now() argument must be str, not " + a[0].type_name());
  const std::string& format = a[0].as_string();
  if (format.empty()) return Value("");
  std::string buffer(format.size() * 8 + 64, '\0');
  for (int attempt = 0; attempt < 4; ++attempt) {
    const size_t n = std::strftime(buffer.data(), buffer.size(), format.c_str(), &r.now());
    if (n > 0) return Value(buffer.substr(0, n));
    buffer.resize(buffer.size() * 4);
  }
  return Value("");  // strftime writes nothing for some formats, e.g. "%p" in some locales
}

const std::vector<std::pair<std::string_view, Value>>& globals() {
  static const std::vector<std::pair<std::string_view, Value>> table = {
      {"range", Value::callable("range", range)},
      {"namespace", Value::callable("namespace", make_namespace)},
      {"dict", Value::callable("dict", make_dict)},
      {"raise_exception", Value::callable("raise_exception", raise_exception)},
      {"strftime_now", Value::callable("strftime_now", strftime_now)},
  };
  return table;
}

}  // namespace

std::optional<Value> global_function(std::string_view name) {
  for (const auto& [key, value] : globals()) {
    if (key == name) return value;
  }
  return std::nullopt;
}

std::vector<Value> bind_arguments(const CallArgs& args,
                                  std::initializer_list<std::string_view> params,
                                  std::string_view what) {
  std::vector<Value> bound(params.size());
  if (args.positional.size() > params.size()) {
    throw RenderError(std::string(what) + "() takes at most " + std::to_string(params.size()) +
                      " argument(s) (" + std::to_string(args.positional.size()) + " given)");
  }
  std::copy(args.positional.begin(), args.positional.end(), bound.begin());
  for (const auto& [key, value] : args.keyword) {
    const auto it = std::find(params.begin(), params.end(), key);
    if (it == params.end()) {
      throw RenderError(std::string(what) + "() got an unexpected keyword argument '" + key + "'");
    }
    bound[static_cast<size_t>(it - params.begin())] = value;
  }
  return bound;
}

}  // namespace tokenfab::jinja
