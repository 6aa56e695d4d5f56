// Filters over sequences and mappings, with jinja2's signatures and results (generators jinja2
// returns, such as unique's and reverse's, are lists here).

#include <algorithm>

#include "core/tokenizer/jinja_filters.h"
#include "core/tokenizer/jinja_operators.h"
#include "core/tokenizer/jinja_renderer.h"
#include "core/tokenizer/jinja_string.h"

namespace tokenfab::jinja::filters {

namespace {

bool flag(const Value& v) {
  return v.truthy();
}

// The sort key of an item: its attribute when one is named; strings lower-cased unless
// case-sensitive.
Value sort_key(const Value& item, const Value& attribute, bool case_sensitive) {
  if (!attribute.is_undefined() && !attribute.is_none()) {
    return attribute_of(item, attribute, !case_sensitive);
  }
  if (!case_sensitive && item.is_string()) return Value(pystr::lower(item.as_string()));
  return item;
}

bool less(const Value& a, const Value& b) {
  const std::optional<int> order = compare(a, b);
  if (!order) {
    throw RenderError("'<' not supported between instances of '" + a.type_name() + "' and '" +
                      b.type_name() + "'");
  }
  return *order < 0;
}

// min and max: the first item whose key is smallest (or largest).
Value extreme(const Value& input, const CallArgs& args, bool largest) {
  const auto a = bind_arguments(args, {"case_sensitive", "attribute"}, largest ? "max" : "min");
  const std::vector<Value> items = iterate(input);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  Value best_key = sort_key(items[0], a[1], flag(a[0]));
  for (size_t i = 1; i < items.size(); ++i) {
    Value key = sort_key(items[i], a[1], flag(a[0]));
    if (largest ? less(best_key, key) : less(key, best_key)) {
      best = i;
      best_key = std::move(key);
    }
  }
  return items[best];
}

// select, reject, selectattr, rejectattr: the test (or truthiness) on each item, or on its
// attribute.
Value filter_items(Renderer& r, const Value& input, const CallArgs& args, bool by_attribute,
                   bool keep_passing) {
  const char* what = by_attribute ? "selectattr" : "select";
  if (!args.keyword.empty()) throw RenderError(std::string(what) + "() takes no keyword arguments");
  size_t next = 0;
  Value attribute;
  if (by_attribute) {
    if (args.positional.empty()) throw RenderError("selectattr() needs an attribute name");
    attribute = args.positional[next++];
  }
  std::optional<std::string> test;
  if (next < args.positional.size()) test = to_str(args.positional[next++]);
  CallArgs test_args;
  test_args.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(next),
                              args.positional.end());
  std::vector<Value> kept;
  for (const Value& item : iterate(input)) {
    const Value subject = by_attribute ? attribute_of(item, attribute) : item;
    const bool passes = test ? apply_test(r, *test, subject, test_args) : subject.truthy();
    if (passes == keep_passing) kept.push_back(item);
  }
  return Value::list(std::move(kept));
}

}  // namespace

Value attribute_of(const Value& item, const Value& attribute, bool lower_strings) {
  std::vector<Value> parts;
  if (attribute.is_string()) {
    for (const std::string& part : pystr::split(attribute.as_string(), ".", -1)) {
      const bool digits = !part.empty() && std::all_of(part.begin(), part.end(),
                                                       [](char c) { return c >= '0' && c <= '9'; });
      parts.push_back(digits ? Value(pystr::parse_int(part, 10).value_or(0)) : Value(part));
    }
  } else {
    parts.push_back(attribute);
  }
  Value v = item;
  for (const Value& part : parts) v = get_item(v, part);
  if (lower_strings && v.is_string()) return Value(pystr::lower(v.as_string()));
  return v;
}

Value first(Renderer&, const Value& input, const CallArgs& args) {
  bind_arguments(args, {}, "first");
  const std::vector<Value> items = iterate(input);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value last(Renderer&, const Value& input, const CallArgs& args) {
  bind_arguments(args, {}, "last");
  const std::vector<Value> items = iterate(input);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

Value join(Renderer& r, const Value& input, const CallArgs& args) {
  const auto a = bind_arguments(args, {"d", "attribute"}, "join");
  const std::string separator = to_str(a[0]);
  std::string out;
  bool first_item = true;
  for (const Value& item : iterate(input)) {
    if (!first_item) out += separator;
    first_item = false;
    out += to_str(a[1].is_undefined() || a[1].is_none() ? item : attribute_of(item, a[1]));
    if (out.size() > r.max_size())
      throw RenderError("join() result is larger than the output limit");
  }
  return Value(std::move(out));
}

Value list(Renderer&, const Value& input, const CallArgs& args) {
  bind_arguments(args, {}, "list");
  return Value::list(iterate(input));
}

Value items(Renderer&, const Value& input, const CallArgs& args) {
  bind_arguments(args, {}, "items");
  if (input.is_undefined()) return Value::list({});
  if (input.kind() != Kind::Dict) throw RenderError("Can only get item pairs from a mapping.");
  std::vector<Value> pairs;
  for (const auto& [key, value] : input.as_dict().items)
    pairs.push_back(Value::tuple({key, value}));
  return Value::list(std::move(pairs));
}

Value reverse(Renderer&, const Value& input, const CallArgs& args) {
  bind_arguments(args, {}, "reverse");
  if (input.is_string()) {
    std::vector<uint32_t> cps = pystr::code_points(input.as_string());
    std::reverse(cps.begin(), cps.end());
    return Value(pystr::from_code_points(cps, 0, cps.size()));
  }
  std::vector<Value> items = iterate(input);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value sort(Renderer&, const Value& input, const CallArgs& args) {
  const auto a = bind_arguments(args, {"reverse", "case_sensitive", "attribute"}, "sort");
  const bool descending = flag(a[0]);
  std::vector<std::pair<Value, Value>> keyed;  // (key, item)
  for (const Value& item : iterate(input))
    keyed.emplace_back(sort_key(item, a[2], flag(a[1])), item);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return descending ? less(y.first, x.first) : less(x.first, y.first);
  });
  std::vector<Value> out;
  for (auto& [key, item] : keyed) out.push_back(std::move(item));
  return Value::list(std::move(out));
}

Value unique(Renderer&, const Value& input, const CallArgs& args) {
  const auto a = bind_arguments(args, {"case_sensitive", "attribute"}, "unique");
  std::vector<Value> seen, out;
  for (const Value& item : iterate(input)) {
    const Value key = sort_key(item, a[1], flag(a[0]));
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); }))
      continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value min(Renderer&, const Value& input, const CallArgs& args) {
  return extreme(input, args, false);
}
Value max(Renderer&, const Value& input, const CallArgs& args) {
  return extreme(input, args, true);
}

Value sum(Renderer& r, const Value& input, const CallArgs& args) {
  const auto a = bind_arguments(args, {"attribute", "start"}, "sum");
  Value total = a[1].is_undefined() ? Value(0) : a[1];
  for (const Value& item : iterate(input)) {
    const Value v = a[0].is_undefined() || a[0].is_none() ? item : attribute_of(item, a[0]);
    total = binary_operator("+", total, v, r.max_size());
  }
  return total;
}

Value dictsort(Renderer&, const Value& input, const CallArgs& args) {
  const auto a = bind_arguments(args, {"case_sensitive", "by", "reverse"}, "dictsort");
  if (input.kind() != Kind::Dict)
    throw RenderError("You can only sort by either \"key\" or \"value\" of a mapping");
  const std::string by = a[1].is_undefined() ? "key" : to_str(a[1]);
  if (by != "key" && by != "value")
    throw RenderError("You can only sort by either \"key\" or \"value\"");
  const bool descending = flag(a[2]);
  std::vector<std::pair<Value, Value>> keyed;
  for (const auto& [key, value] : input.as_dict().items) {
    keyed.emplace_back(sort_key(by == "key" ? key : value, Value(), flag(a[0])),
                       Value::tuple({key, value}));
  }
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return descending ? less(y.first, x.first) : less(x.first, y.first);
  });
  std::vector<Value> out;
  for (auto& [key, pair] : keyed) out.push_back(std::move(pair));
  return Value::list(std::move(out));
}

// map(attribute='x', default=d), or map('filter', args...): applied to every item.
Value map(Renderer& r, const Value& input, const CallArgs& args) {
  std::vector<Value> out;
  if (args.positional.empty()) {
    const auto a = bind_arguments(args, {"attribute", "default"}, "map");
    if (a[0].is_undefined()) throw RenderError("map() needs a filter name or attribute=");
    for (const Value& item : iterate(input)) {
      Value v = attribute_of(item, a[0]);
      out.push_back(v.is_undefined() && !a[1].is_undefined() ? a[1] : v);
    }
    return Value::list(std::move(out));
  }
  const std::string name = to_str(args.positional[0]);
  if (!has_filter(name)) throw RenderError("No filter named '" + name + "'.");
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  for (const Value& item : iterate(input)) out.push_back(apply_filter(r, name, item, rest));
  return Value::list(std::move(out));
}

Value select(Renderer& r, const Value& input, const CallArgs& args) {
  return filter_items(r, input, args, false, true);
}
Value reject(Renderer& r, const Value& input, const CallArgs& args) {
  return filter_items(r, input, args, false, false);
}
Value selectattr(Renderer& r, const Value& input, const CallArgs& args) {
  return filter_items(r, input, args, true, true);
}
Value rejectattr(Renderer& r, const Value& input, const CallArgs& args) {
  return filter_items(r, input, args, true, false);
}

}  // namespace tokenfab::jinja::filters
