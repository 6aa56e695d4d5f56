// Template, and the renderer's statements (expressions are in jinja_eval.cpp).

#include "core/tokenizer/jinja_render.h"

#include "core/common/error.h"
#include "core/tokenizer/jinja_builtins.h"
#include "core/tokenizer/jinja_operators.h"
#include "core/tokenizer/jinja_parser.h"
#include "core/tokenizer/jinja_renderer.h"

namespace tokenfab::jinja {

namespace {

// jinja2's loop variable for item `i` of `items`.
Value loop_object(const std::vector<Value>& items, size_t i) {
  const auto n = static_cast<int64_t>(items.size());
  const auto index0 = static_cast<int64_t>(i);
  DictData loop;
  loop.set("index", index0 + 1);
  loop.set("index0", index0);
  loop.set("revindex", n - index0);
  loop.set("revindex0", n - index0 - 1);
  loop.set("first", i == 0);
  loop.set("last", index0 == n - 1);
  loop.set("length", n);
  loop.set("depth", 1);
  loop.set("depth0", 0);
  loop.set("previtem", i > 0 ? items[i - 1] : Value::undefined("there is no previous item"));
  loop.set("nextitem", index0 + 1 < n ? items[i + 1] : Value::undefined("there is no next item"));
  loop.set("cycle", Value::callable("cycle", [index0](Renderer&, const CallArgs& args) {
             if (args.positional.empty()) throw RenderError("no items for cycling given");
             return args.positional[static_cast<size_t>(index0) % args.positional.size()];
           }));
  return Value::dict(std::move(loop));
}

}  // namespace

// Errors leave as tokenfab::Error only; anything else escaping (a bug of ours) is reported as
// one, naming the template, rather than taking the application down.
Template Template::parse(std::string_view text, std::string source_name) {
  Template t;
  try {
    t.program_ = parse_program(SourceText::normalize(text, source_name));
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(source_name + ": internal error while parsing the template: " + e.what());
  }
  return t;
}

std::string Template::render(const DictData& variables, const RenderOptions& options) const {
  try {
    Renderer renderer(*program_, variables, options);
    return renderer.render();
  } catch (const Error&) {
    throw;
  } catch (const RenderError& e) {  // raised outside any statement (cannot happen; kept safe)
    throw Error(program_->source.name + ": " + e.what());
  } catch (const std::exception& e) {
    throw Error(program_->source.name + ": internal error while rendering: " + e.what());
  }
}

const std::string& Template::source_name() const {
  return program_->source.name;
}

const Value* Scope::find(const std::string& name) const {
  for (const Scope* s = this; s != nullptr; s = s->parent_.get()) {
    for (const auto& [key, value] : s->variables_) {
      if (key == name) return &value;
    }
  }
  return nullptr;
}

void Scope::set(const std::string& name, Value value) {
  for (auto& [key, existing] : variables_) {
    if (key == name) {
      existing = std::move(value);
      return;
    }
  }
  variables_.emplace_back(name, std::move(value));
}

Renderer::Renderer(const Program& program, const DictData& variables, const RenderOptions& options)
    : program_(program), options_(options), root_(std::make_shared<Scope>(nullptr)) {
  for (const auto& [key, value] : variables.items) {
    if (key.is_string()) root_->set(key.as_string(), value);
  }
}

Renderer::~Renderer() {
  for (const Value& ns : namespaces_) ns.namespace_attributes().items.clear();
}

std::string Renderer::render() {
  std::string out;
  out_ = &out;
  exec(program_.body, root_);
  return out;
}

void Renderer::fail(uint32_t offset, const std::string& what) const {
  throw Error(program_.source.position(offset) + ": " + what);
}

void Renderer::write(std::string_view text) {
  if (out_->size() + text.size() > max_size()) {
    throw RenderError("the output would be larger than the limit of " + std::to_string(max_size()) +
                      " bytes");
  }
  out_->append(text);
}

void Renderer::count_iteration() {
  if (++iterations_ > options_.limits.max_iterations) {
    throw RenderError("more than " + std::to_string(options_.limits.max_iterations) +
                      " loop iterations and macro calls (a runaway loop?)");
  }
}

const std::tm& Renderer::now() {
  if (!now_) {
    now_ = options_.now;
    if (!now_) {
      const std::time_t t = std::time(nullptr);
      std::tm local{};
      localtime_r(&t, &local);
      now_ = local;
    }
  }
  return *now_;
}

Renderer::Flow Renderer::exec(const Body& body, const ScopePtr& scope) {
  for (const StmtPtr& stmt : body) {
    const Flow flow = exec_statement(*stmt, scope);
    if (flow != Flow::Normal) return flow;
  }
  return Flow::Normal;
}

Renderer::Flow Renderer::exec_statement(const Stmt& stmt, const ScopePtr& scope) {
  try {
    switch (stmt.kind) {
      case StmtKind::Text:
        write(stmt.text);
        break;
      case StmtKind::Output:
        write(to_str(eval(*stmt.expr, scope)));
        break;
      case StmtKind::If:
        for (const auto& [condition, body] : stmt.branches) {
          if (!condition || eval(*condition, scope).truthy()) return exec(body, scope);
        }
        break;
      case StmtKind::For:
        return exec_for(stmt, scope);
      case StmtKind::Set:
        assign(*stmt.target, eval(*stmt.expr, scope), scope);
        break;
      case StmtKind::SetBlock:
        assign(*stmt.target, Value(capture(stmt.body, scope)), scope);
        break;
      case StmtKind::Macro:
        scope->set(stmt.text, define_macro(stmt, scope));
        break;
      case StmtKind::CallBlock:
        exec_call_block(stmt, scope);
        break;
      case StmtKind::FilterBlock:
        exec_filter_block(stmt, scope);
        break;
      case StmtKind::With: {
        auto inner = std::make_shared<Scope>(scope);  // values are computed in the outer scope
        for (const auto& [name, value] : stmt.params) inner->set(name, eval(*value, scope));
        return exec(stmt.body, inner);
      }
      case StmtKind::Break:
        return Flow::Break;
      case StmtKind::Continue:
        return Flow::Continue;
    }
  } catch (const RenderError& e) {
    fail(stmt.offset, e.what());
  }
  return Flow::Normal;
}

Renderer::Flow Renderer::exec_for(const Stmt& stmt, const ScopePtr& scope) {
  std::vector<Value> items = iterate(eval(*stmt.expr, scope));
  if (stmt.condition) {  // "for x in xs if c": c sees x but not loop
    std::vector<Value> kept;
    for (const Value& item : items) {
      count_iteration();
      auto probe = std::make_shared<Scope>(scope);
      assign(*stmt.target, item, probe);
      if (eval(*stmt.condition, probe).truthy()) kept.push_back(item);
    }
    items = std::move(kept);
  }
  for (size_t i = 0; i < items.size(); ++i) {
    count_iteration();
    auto iteration = std::make_shared<Scope>(scope);
    assign(*stmt.target, items[i], iteration);
    iteration->set("loop", loop_object(items, i));
    if (exec(stmt.body, iteration) == Flow::Break) break;
  }
  if (items.empty()) exec(stmt.else_body, std::make_shared<Scope>(scope));
  return Flow::Normal;
}

void Renderer::assign(const Expr& target, const Value& value, const ScopePtr& scope) {
  if (target.kind == ExprKind::Name) {
    scope->set(target.name, value);
  } else if (target.kind == ExprKind::Attribute) {
    const Value ns = lookup(target.children[0]->name, scope);
    if (ns.kind() != Kind::Namespace) {
      fail(target.offset, "cannot assign attribute on non-namespace object");
    }
    ns.namespace_attributes().set(Value(target.name), value);
  } else {  // a tuple of names
    const std::vector<Value> items = iterate(value);
    const size_t want = target.children.size();
    if (items.size() != want) {
      fail(target.offset, (items.size() < want ? "not enough" : "too many") +
                              std::string(" values to unpack (expected ") + std::to_string(want) +
                              ", got " + std::to_string(items.size()) + ")");
    }
    for (size_t i = 0; i < want; ++i) scope->set(target.children[i]->name, items[i]);
  }
}

std::string Renderer::capture(const Body& body, const ScopePtr& scope) {
  std::string text;
  std::string* outer = std::exchange(out_, &text);
  try {
    exec(body, scope);
  } catch (...) {
    out_ = outer;
    throw;
  }
  out_ = outer;
  return text;
}

// A macro renders its body in a scope of its own whose parent is where it was defined (held
// weakly: the defining scope holds the macro, and a strong reference would never be freed).
Value Renderer::define_macro(const Stmt& macro, const ScopePtr& scope) {
  const std::weak_ptr<Scope> defined_in = scope;
  return Value::callable(macro.text, [&macro, defined_in](Renderer& r, const CallArgs& args) {
    return r.call_macro(macro, defined_in, args);
  });
}

Value Renderer::call_macro(const Stmt& macro, const std::weak_ptr<Scope>& defined_in,
                           const CallArgs& args) {
  count_iteration();
  if (call_depth_ >= options_.limits.max_call_depth) {
    throw RenderError("macros call each other more than " +
                      std::to_string(options_.limits.max_call_depth) +
                      " levels deep (runaway recursion?)");
  }
  const size_t n = macro.params.size();
  if (args.positional.size() > n) {
    throw RenderError("macro '" + macro.text + "' takes not more than " + std::to_string(n) +
                      " argument(s)");
  }
  ScopePtr parent = defined_in.lock();
  auto scope = std::make_shared<Scope>(parent ? parent : root_);
  for (const auto& [key, value] : args.keyword) {
    bool known = key == "caller";
    for (const auto& param : macro.params) known = known || param.first == key;
    if (!known)
      throw RenderError("macro '" + macro.text + "' takes no keyword argument '" + key + "'");
    scope->set(key, value);
  }
  for (size_t i = 0; i < n; ++i) {
    const auto& [name, fallback] = macro.params[i];
    bool by_keyword = false;
    for (const auto& kw : args.keyword) by_keyword = by_keyword || kw.first == name;
    if (i < args.positional.size()) {
      if (by_keyword) {
        throw RenderError("macro '" + macro.text + "' got multiple values for argument '" + name +
                          "'");
      }
      scope->set(name, args.positional[i]);
    } else if (!by_keyword) {
      scope->set(name, fallback ? eval(*fallback, scope)
                                : Value::undefined("parameter '" + name + "' was not provided"));
    }
  }
  ++call_depth_;
  std::string text;
  try {
    text = capture(macro.body, scope);
  } catch (...) {
    --call_depth_;
    throw;
  }
  --call_depth_;
  return Value(std::move(text));
}

void Renderer::exec_call_block(const Stmt& stmt, const ScopePtr& scope) {
  const Stmt* block = &stmt;
  const Value caller = Value::callable("caller", [block, scope](Renderer& r, const CallArgs&) {
    return Value(r.capture(block->body, std::make_shared<Scope>(scope)));
  });
  const Expr& call = *stmt.expr;
  CallArgs args = eval_arguments(call, 1, scope);
  args.keyword.emplace_back("caller", caller);
  write(to_str(this->call(eval(*call.children[0], scope), args)));
}

void Renderer::exec_filter_block(const Stmt& stmt, const ScopePtr& scope) {
  filter_inputs_.push_back(capture(stmt.body, scope));
  Value result;
  try {
    result = eval(*stmt.expr, scope);
  } catch (...) {
    filter_inputs_.pop_back();
    throw;
  }
  filter_inputs_.pop_back();
  write(to_str(result));
}

}  // namespace tokenfab::jinja
