#pragma once
// The filter functions, shared by the filter table (jinja_filters.cpp, text and number filters)
// and jinja_sequence_filters.cpp (filters over lists and dicts). Use apply_filter
// (jinja_builtins.h) to call one by name.

#include "core/tokenizer/jinja_builtins.h"

namespace tokenfab::jinja::filters {

using FilterFn = Value (*)(Renderer& r, const Value& input, const CallArgs& args);

// `item`'s attribute or item `attribute` ("a.b" walks, "0" indexes), Python's way; when
// `lower_strings`, a string result is lower-cased (the case-insensitive keys of sort and unique).
Value attribute_of(const Value& item, const Value& attribute, bool lower_strings = false);

Value first(Renderer& r, const Value& input, const CallArgs& args);
Value last(Renderer& r, const Value& input, const CallArgs& args);
Value join(Renderer& r, const Value& input, const CallArgs& args);
Value list(Renderer& r, const Value& input, const CallArgs& args);
Value items(Renderer& r, const Value& input, const CallArgs& args);
Value reverse(Renderer& r, const Value& input, const CallArgs& args);
Value sort(Renderer& r, const Value& input, const CallArgs& args);
Value unique(Renderer& r, const Value& input, const CallArgs& args);
Value min(Renderer& r, const Value& input, const CallArgs& args);
Value max(Renderer& r, const Value& input, const CallArgs& args);
Value sum(Renderer& r, const Value& input, const CallArgs& args);
Value dictsort(Renderer& r, const Value& input, const CallArgs& args);
Value map(Renderer& r, const Value& input, const CallArgs& args);
Value select(Renderer& r, const Value& input, const CallArgs& args);
Value reject(Renderer& r, const Value& input, const CallArgs& args);
Value selectattr(Renderer& r, const Value& input, const CallArgs& args);
Value rejectattr(Renderer& r, const Value& input, const CallArgs& args);

}  // namespace tokenfab::jinja::filters
