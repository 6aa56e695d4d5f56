// The renderer's expressions.

#include "core/common/error.h"
#include "core/tokenizer/jinja_builtins.h"
#include "core/tokenizer/jinja_operators.h"
#include "core/tokenizer/jinja_renderer.h"

namespace tokenfab::jinja {

// Errors from values, operators and builtins get the position of the innermost expression that
// was being evaluated; errors already positioned (tokenfab::Error) pass through.
Value Renderer::eval(const Expr& expr, const ScopePtr& scope) {
  try {
    return eval_node(expr, scope);
  } catch (const TemplateRaised& e) {
    fail(expr.offset, std::string("the template raised an error: ") + e.what());
  } catch (const RenderError& e) {
    fail(expr.offset, e.what());
  }
}

Value Renderer::eval_node(const Expr& expr, const ScopePtr& scope) {
  const auto child = [&](size_t i) { return eval(*expr.children[i], scope); };
  switch (expr.kind) {
    case ExprKind::Literal:
      return expr.value;
    case ExprKind::Name:
      return lookup(expr.name, scope);
    case ExprKind::List:
    case ExprKind::Tuple:
    case ExprKind::Dict:
      return eval_collection(expr, scope);
    case ExprKind::Attribute:
      return get_attribute(child(0), expr.name);
    case ExprKind::Item: {
      const Value obj = child(0);
      return get_item(obj, child(1));
    }
    case ExprKind::Slice:
      return eval_slice(expr, scope);
    case ExprKind::Call: {
      const Value callee = child(0);
      return call(callee, eval_arguments(expr, 1, scope));
    }
    case ExprKind::Filter: {
      const Value input = expr.children[0] ? child(0) : Value(filter_inputs_.back());
      return apply_filter(*this, expr.name, input, eval_arguments(expr, 1, scope));
    }
    case ExprKind::Test: {
      const Value input = child(0);
      return apply_test(*this, expr.name, input, eval_arguments(expr, 1, scope)) != expr.negated;
    }
    case ExprKind::Unary:
      if (expr.name == "not") return !child(0).truthy();
      return unary_operator(expr.name, child(0));
    case ExprKind::Binary: {
      const Value left = child(0);
      if (expr.name == "and") return left.truthy() ? child(1) : left;
      if (expr.name == "or") return left.truthy() ? left : child(1);
      return binary_operator(expr.name, left, child(1), max_size());
    }
    case ExprKind::Compare:
      return eval_compare(expr, scope);
    case ExprKind::Conditional:
      if (child(1).truthy()) return child(0);
      if (expr.children[2]) return child(2);
      return Value::undefined("the inline if-expression evaluated to false and has no else");
  }
  return Value();
}

// Python's chained comparison: a < b < c is a < b and b < c, each operand evaluated once.
Value Renderer::eval_compare(const Expr& expr, const ScopePtr& scope) {
  Value left = eval(*expr.children[0], scope);
  for (size_t i = 0; i < expr.ops.size(); ++i) {
    Value right = eval(*expr.children[i + 1], scope);
    if (!compare_operator(expr.ops[i], left, right)) return false;
    left = std::move(right);
  }
  return true;
}

Value Renderer::eval_collection(const Expr& expr, const ScopePtr& scope) {
  if (expr.kind == ExprKind::Dict) {
    DictData dict;
    for (size_t i = 0; i + 1 < expr.children.size(); i += 2) {
      Value key = eval(*expr.children[i], scope);
      dict.set(std::move(key), eval(*expr.children[i + 1], scope));
    }
    return Value::dict(std::move(dict));
  }
  std::vector<Value> items;
  for (const ExprPtr& item : expr.children) items.push_back(eval(*item, scope));
  return expr.kind == ExprKind::Tuple ? Value::tuple(std::move(items))
                                      : Value::list(std::move(items));
}

Value Renderer::eval_slice(const Expr& expr, const ScopePtr& scope) {
  const Value obj = eval(*expr.children[0], scope);
  std::optional<int64_t> parts[3];
  for (size_t i = 0; i < 3; ++i) {
    if (!expr.children[i + 1]) continue;
    const Value v = eval(*expr.children[i + 1], scope);
    if (v.is_none()) continue;
    if (!v.is_integral()) {
      throw RenderError("slice indices must be integers or None, not " + v.type_name());
    }
    parts[i] = v.as_int();
  }
  return get_slice(obj, parts[0], parts[1], parts[2]);
}

// Template variables and assignments first, then the globals (range, namespace, ...).
Value Renderer::lookup(const std::string& name, const ScopePtr& scope) const {
  if (const Value* v = scope->find(name)) return *v;
  if (std::optional<Value> global = global_function(name)) return *global;
  return Value::undefined("'" + name + "' is undefined");
}

CallArgs Renderer::eval_arguments(const Expr& expr, size_t first, const ScopePtr& scope) {
  CallArgs args;
  for (size_t i = first; i < expr.children.size(); ++i) {
    args.positional.push_back(eval(*expr.children[i], scope));
  }
  for (const auto& [key, value] : expr.keywords)
    args.keyword.emplace_back(key, eval(*value, scope));
  return args;
}

Value Renderer::call(const Value& callee, const CallArgs& args) {
  if (callee.is_undefined()) fail_undefined(callee);
  if (callee.kind() != Kind::Callable) {
    throw RenderError("'" + callee.type_name() + "' object is not callable");
  }
  return callee.as_callable().call(*this, args);
}

}  // namespace tokenfab::jinja
