#pragma once
// The renderer's state while one template renders: scopes, the output being written, limits.
// Statements are executed in jinja_render.cpp, expressions evaluated in jinja_eval.cpp; the
// builtins call back into it (macros, map/select over filters and tests, strftime_now).

#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "core/tokenizer/jinja_ast.h"
#include "core/tokenizer/jinja_render.h"

namespace tokenfab::jinja {

// Variables of one level: the template, a loop iteration, a macro call. `set` writes to the
// innermost scope, so a loop body's assignments end with the iteration, as in jinja2.
class Scope {
 public:
  explicit Scope(std::shared_ptr<Scope> parent) : parent_(std::move(parent)) {}
  const Value* find(const std::string& name) const;
  void set(const std::string& name, Value value);

 private:
  std::shared_ptr<Scope> parent_;
  std::vector<std::pair<std::string, Value>> variables_;
};
using ScopePtr = std::shared_ptr<Scope>;

class Renderer {
 public:
  Renderer(const Program& program, const DictData& variables, const RenderOptions& options);
  ~Renderer();
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;

  std::string render();

  // For the builtins.
  Value call(const Value& callee, const CallArgs& args);
  const std::tm& now();
  void count_iteration();  // throws RenderError past the limit
  size_t max_size() const { return options_.limits.max_output_bytes; }
  const RenderLimits& limits() const { return options_.limits; }
  void keep_namespace(const Value& ns) { namespaces_.push_back(ns); }

 private:
  enum class Flow { Normal, Break, Continue };

  // jinja_render.cpp
  Flow exec(const Body& body, const ScopePtr& scope);
  Flow exec_statement(const Stmt& stmt, const ScopePtr& scope);
  Flow exec_for(const Stmt& stmt, const ScopePtr& scope);
  void exec_call_block(const Stmt& stmt, const ScopePtr& scope);
  void exec_filter_block(const Stmt& stmt, const ScopePtr& scope);
  void assign(const Expr& target, const Value& value, const ScopePtr& scope);
  std::string capture(const Body& body, const ScopePtr& scope);
  Value define_macro(const Stmt& macro, const ScopePtr& scope);
  Value call_macro(const Stmt& macro, const std::weak_ptr<Scope>& defined_in, const CallArgs& args);
  void write(std::string_view text);

  // jinja_eval.cpp
  Value eval(const Expr& expr, const ScopePtr& scope);
  Value eval_node(const Expr& expr, const ScopePtr& scope);
  Value eval_compare(const Expr& expr, const ScopePtr& scope);
  Value eval_collection(const Expr& expr, const ScopePtr& scope);
  Value eval_slice(const Expr& expr, const ScopePtr& scope);
  Value lookup(const std::string& name, const ScopePtr& scope) const;
  CallArgs eval_arguments(const Expr& expr, size_t first, const ScopePtr& scope);

  [[noreturn]] void fail(uint32_t offset, const std::string& what) const;

  const Program& program_;
  const RenderOptions& options_;
  ScopePtr root_;
  std::string* out_ = nullptr;
  std::optional<std::tm> now_;
  int64_t iterations_ = 0;
  int call_depth_ = 0;
  std::vector<std::string> filter_inputs_;  // the text of the filter blocks being rendered
  std::vector<Value> namespaces_;           // cleared at the end: a namespace may hold itself
};

}  // namespace tokenfab::jinja
