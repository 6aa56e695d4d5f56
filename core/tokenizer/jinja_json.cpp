// to_json: Python's json.dumps as HF's tojson filter calls it (ensure_ascii=False).

#include <algorithm>
#include <cmath>

#include "core/tokenizer/jinja_value.h"
#include "core/tokenizer/utf8.h"

namespace tokenfab::jinja {

namespace {

class JsonWriter {
 public:
  explicit JsonWriter(const JsonOptions& options) : options_(options) {
    const bool indented = options.indent.has_value();
    item_separator_ = indented ? "," : ", ";
    key_separator_ = ": ";
    if (options.separators) std::tie(item_separator_, key_separator_) = *options.separators;
  }

  void write(const Value& v, int level) {
    const NestingGuard guard;
    switch (v.kind()) {
      case Kind::None:
        out_ += "null";
        return;
      case Kind::Bool:
        out_ += v.as_bool() ? "true" : "false";
        return;
      case Kind::Int:
        out_ += std::to_string(v.as_int());
        return;
      case Kind::Float:
        out_ += float_text(v.as_float());
        return;
      case Kind::String:
        write_string(v.as_string());
        return;
      case Kind::List:
        write_list(v.as_list().items, level);
        return;
      case Kind::Dict:
        write_dict(v.as_dict(), level);
        return;
      default:
        throw RenderError("Object of type " + v.type_name() + " is not JSON serializable");
    }
  }

  std::string take() { return std::move(out_); }

 private:
  static std::string float_text(double x) {
    if (std::isnan(x)) return "NaN";
    if (std::isinf(x)) return x < 0 ? "-Infinity" : "Infinity";
    return format_float(x);
  }

  void escape_unit(uint32_t unit) {
    static constexpr char kHex[] = "0123456789abcdef";
    out_ += "\\u";
    for (int shift = 12; shift >= 0; shift -= 4) out_ += kHex[(unit >> shift) & 15];
  }

  // A non-ASCII character as \uXXXX, or a surrogate pair above U+FFFF; returns its byte length.
  size_t escape_non_ascii(std::string_view rest) {
    const utf8::Step step = utf8::decode(rest);
    if (step.status != utf8::Status::kValid) {
      out_ += rest[0];
      return 1;
    }
    if (step.cp < 0x10000) {
      escape_unit(step.cp);
    } else {
      const uint32_t v = step.cp - 0x10000;
      escape_unit(0xD800 + (v >> 10));
      escape_unit(0xDC00 + (v & 0x3FF));
    }
    return step.length;
  }

  void write_string(const std::string& s) {
    out_ += '"';
    for (size_t i = 0; i < s.size(); ++i) {
      const char c = s[i];
      const auto u = static_cast<unsigned char>(c);
      if (u >= 0x80 && options_.ensure_ascii) {
        i += escape_non_ascii(std::string_view(s).substr(i)) - 1;
        continue;
      }
      switch (c) {
        case '"':
          out_ += "\\\"";
          break;
        case '\\':
          out_ += "\\\\";
          break;
        case '\n':
          out_ += "\\n";
          break;
        case '\r':
          out_ += "\\r";
          break;
        case '\t':
          out_ += "\\t";
          break;
        case '\b':
          out_ += "\\b";
          break;
        case '\f':
          out_ += "\\f";
          break;
        default:
          if (u < 0x20) {
            escape_unit(u);
          } else {
            out_ += c;
          }
      }
    }
    out_ += '"';
  }

  // Before an item at `level`: the separator, then a newline and indent when indenting.
  void open_item(bool first, int level) {
    if (!first) out_ += item_separator_;
    if (options_.indent) newline(level);
  }

  void newline(int level) {
    out_ += '\n';
    for (int i = 0; i < level; ++i) out_ += *options_.indent;
  }

  void write_list(const std::vector<Value>& items, int level) {
    if (items.empty()) {
      out_ += "[]";
      return;
    }
    out_ += '[';
    for (size_t i = 0; i < items.size(); ++i) {
      open_item(i == 0, level + 1);
      write(items[i], level + 1);
    }
    if (options_.indent) newline(level);
    out_ += ']';
  }

  static std::string key_text(const Value& key) {
    switch (key.kind()) {
      case Kind::String:
        return key.as_string();
      case Kind::None:
        return "null";
      case Kind::Bool:
        return key.as_bool() ? "true" : "false";
      case Kind::Int:
        return std::to_string(key.as_int());
      case Kind::Float:
        return float_text(key.as_float());
      default:
        throw RenderError("keys must be str, int, float, bool or None, not " + key.type_name());
    }
  }

  void write_dict(const DictData& dict, int level) {
    if (dict.items.empty()) {
      out_ += "{}";
      return;
    }
    std::vector<std::pair<std::string, const Value*>> items;
    for (const auto& [key, value] : dict.items) items.emplace_back(key_text(key), &value);
    if (options_.sort_keys) {
      std::stable_sort(items.begin(), items.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
    }
    out_ += '{';
    for (size_t i = 0; i < items.size(); ++i) {
      open_item(i == 0, level + 1);
      write_string(items[i].first);
      out_ += key_separator_;
      write(*items[i].second, level + 1);
    }
    if (options_.indent) newline(level);
    out_ += '}';
  }

  const JsonOptions& options_;
  std::string item_separator_, key_separator_;
  std::string out_;
};

}  // namespace

std::string to_json(const Value& v, const JsonOptions& options) {
  JsonWriter writer(options);
  writer.write(v, 0);
  return writer.take();
}

}  // namespace tokenfab::jinja
