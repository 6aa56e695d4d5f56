#pragma once
// The filters, tests, methods and global functions templates can call (jinja_filters.cpp,
// jinja_tests.cpp, jinja_methods.cpp, jinja_globals.cpp). Errors are RenderErrors with Python's
// and jinja2's wording; the renderer adds the position.

#include <optional>
#include <string>
#include <string_view>

#include "core/tokenizer/jinja_value.h"

namespace tokenfab::jinja {

bool has_filter(std::string_view name);
Value apply_filter(Renderer& renderer, const std::string& name, const Value& input,
                   const CallArgs& args);

bool has_test(std::string_view name);
bool apply_test(Renderer& renderer, const std::string& name, const Value& input,
                const CallArgs& args);

// `self.name` as a bound method (str, dict and namespace methods), or nullopt when `self` has
// none of that name.
std::optional<Value> method_of(const Value& self, const std::string& name);

// The global function `name` (range, namespace, dict, raise_exception, strftime_now), or
// nullopt.
std::optional<Value> global_function(std::string_view name);

// Binds call arguments to parameters by position, then by keyword, Python's way. `params` lists
// the names in order; the result has one entry per parameter, Undefined (kind) where not given.
// Throws RenderError naming `what` on an unknown keyword or too many arguments.
std::vector<Value> bind_arguments(const CallArgs& args,
                                  std::initializer_list<std::string_view> params,
                                  std::string_view what);

// The exception raise_exception() throws: its message is the template's own.
class TemplateRaised : public RenderError {
 public:
  explicit TemplateRaised(const std::string& message) : RenderError(message) {}
};

}  // namespace tokenfab::jinja
