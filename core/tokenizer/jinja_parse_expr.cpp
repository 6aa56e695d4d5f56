// Expressions, by jinja2's precedence (see jinja_parser.h).

#include "core/tokenizer/jinja_builtins.h"
#include "core/tokenizer/jinja_parser.h"

namespace tokenfab::jinja::detail {

namespace {

ExprPtr make(ExprKind kind, uint32_t offset) {
  return std::make_unique<Expr>(kind, offset);
}

ExprPtr binary(std::string op, ExprPtr left, ExprPtr right) {
  ExprPtr node = make(ExprKind::Binary, left->offset);
  node->name = std::move(op);
  node->children.push_back(std::move(left));
  node->children.push_back(std::move(right));
  return node;
}

}  // namespace

ExprPtr Parser::parse_expression(bool with_conditional) {
  return with_conditional ? parse_conditional() : parse_or();
}

// Items separated by commas form a tuple; one item without a comma is itself.
ExprPtr Parser::parse_tuple(bool explicit_parentheses) {
  const uint32_t at = peek().offset;
  std::vector<ExprPtr> items;
  bool is_tuple = false;
  while (true) {
    if (!items.empty()) expect_operator(",");
    const TokenKind k = peek().kind;
    if (k == TokenKind::VarEnd || k == TokenKind::BlockEnd || at_operator(")")) break;
    items.push_back(parse_expression());
    if (!at_operator(",")) break;
    is_tuple = true;
  }
  if (!is_tuple) {
    if (!items.empty()) return std::move(items[0]);
    if (!explicit_parentheses)
      fail(peek().offset, "expected an expression, got " + describe(peek()));
  }
  ExprPtr tuple = make(ExprKind::Tuple, at);
  tuple->children = std::move(items);
  return tuple;
}

ExprPtr Parser::parse_conditional() {
  ExprPtr value = parse_or();
  while (skip_name("if")) {
    ExprPtr node = make(ExprKind::Conditional, value->offset);
    node->children.push_back(std::move(value));
    node->children.push_back(parse_or());
    node->children.push_back(skip_name("else") ? parse_conditional() : nullptr);
    value = std::move(node);
  }
  return value;
}

ExprPtr Parser::parse_or() {
  ExprPtr left = parse_and();
  while (skip_name("or")) left = binary("or", std::move(left), parse_and());
  return left;
}

ExprPtr Parser::parse_and() {
  ExprPtr left = parse_not();
  while (skip_name("and")) left = binary("and", std::move(left), parse_not());
  return left;
}

ExprPtr Parser::parse_not() {
  if (!at_name("not")) return parse_compare();
  const Deeper deeper(*this);
  ExprPtr node = make(ExprKind::Unary, next().offset);
  node->name = "not";
  node->children.push_back(parse_not());
  return node;
}

ExprPtr Parser::parse_compare() {
  ExprPtr first = parse_math1();
  ExprPtr node;
  while (true) {
    std::string op;
    const Token& token = peek();
    if (token.kind == TokenKind::Operator &&
        (token.value == "==" || token.value == "!=" || token.value == "<" || token.value == ">" ||
         token.value == "<=" || token.value == ">=")) {
      op = token.value;
      next();
    } else if (at_name("in")) {
      op = "in";
      next();
    } else if (at_name("not") && at_name("in", 1)) {
      op = "not in";
      next();
      next();
    } else {
      break;
    }
    if (!node) {
      node = make(ExprKind::Compare, first->offset);
      node->children.push_back(std::move(first));
    }
    node->ops.push_back(op);
    node->children.push_back(parse_math1());
  }
  return node ? std::move(node) : std::move(first);
}

ExprPtr Parser::parse_math1() {
  ExprPtr left = parse_concat();
  while (at_operator("+") || at_operator("-")) {
    const std::string op = next().value;
    left = binary(op, std::move(left), parse_concat());
  }
  return left;
}

ExprPtr Parser::parse_concat() {
  ExprPtr left = parse_math2();
  while (skip_operator("~")) left = binary("~", std::move(left), parse_math2());
  return left;
}

ExprPtr Parser::parse_math2() {
  ExprPtr left = parse_pow();
  while (at_operator("*") || at_operator("/") || at_operator("//") || at_operator("%")) {
    const std::string op = next().value;
    left = binary(op, std::move(left), parse_pow());
  }
  return left;
}

ExprPtr Parser::parse_pow() {
  ExprPtr left = parse_unary(true);
  while (skip_operator("**")) left = binary("**", std::move(left), parse_unary(true));
  return left;
}

// As in jinja2, "-x|f" is f(-x): the sign binds to the primary, filters to the signed value.
ExprPtr Parser::parse_unary(bool with_filter) {
  const Deeper deeper(*this);
  ExprPtr node;
  if (at_operator("-") || at_operator("+")) {
    node = make(ExprKind::Unary, peek().offset);
    node->name = next().value;
    node->children.push_back(parse_unary(false));
  } else {
    node = parse_primary();
  }
  node = parse_postfix(std::move(node));
  return with_filter ? parse_filter_expr(std::move(node)) : std::move(node);
}

ExprPtr Parser::parse_primary() {
  const Token& token = peek();
  switch (token.kind) {
    case TokenKind::Name: {
      ExprPtr node = make(ExprKind::Literal, token.offset);
      const std::string& n = token.value;
      if (n == "true" || n == "True" || n == "false" || n == "False") {
        node->value = Value(n == "true" || n == "True");
      } else if (n == "none" || n == "None") {
        node->value = Value::none();
      } else {
        node->kind = ExprKind::Name;
        node->name = n;
      }
      next();
      return node;
    }
    case TokenKind::String: {
      ExprPtr node = make(ExprKind::Literal, token.offset);
      std::string text;
      while (peek().kind == TokenKind::String) text += next().value;  // 'a' 'b' is 'ab'
      node->value = Value(std::move(text));
      return node;
    }
    case TokenKind::Int:
    case TokenKind::Float: {
      ExprPtr node = make(ExprKind::Literal, token.offset);
      node->value =
          token.kind == TokenKind::Int ? Value(token.int_value) : Value(token.float_value);
      next();
      return node;
    }
    default:
      break;
  }
  if (skip_operator("(")) {
    ExprPtr inner = parse_tuple(true);
    expect_operator(")");
    return inner;
  }
  if (at_operator("[") || at_operator("{")) return parse_list_or_dict();
  fail(token.offset, "expected an expression, got " + describe(token));
}

ExprPtr Parser::parse_list_or_dict() {
  const bool is_list = at_operator("[");
  ExprPtr node = make(is_list ? ExprKind::List : ExprKind::Dict, next().offset);
  const std::string close = is_list ? "]" : "}";
  while (!at_operator(close)) {
    if (!node->children.empty()) expect_operator(",");
    if (at_operator(close)) break;
    node->children.push_back(parse_expression());
    if (!is_list) {
      expect_operator(":");
      node->children.push_back(parse_expression());
    }
  }
  next();
  return node;
}

ExprPtr Parser::parse_postfix(ExprPtr node) {
  while (true) {
    if (at_operator(".") || at_operator("[")) {
      node = parse_subscript(std::move(node));
    } else if (at_operator("(")) {
      ExprPtr call = make(ExprKind::Call, node->offset);
      call->children.push_back(std::move(node));
      parse_call_args(*call);
      node = std::move(call);
    } else {
      return node;
    }
  }
}

ExprPtr Parser::parse_subscript(ExprPtr node) {
  const uint32_t at = peek().offset;
  if (skip_operator(".")) {
    const Token& token = peek();
    if (token.kind == TokenKind::Name) {
      ExprPtr attribute = make(ExprKind::Attribute, at);
      attribute->name = next().value;
      attribute->children.push_back(std::move(node));
      return attribute;
    }
    if (token.kind != TokenKind::Int)
      fail(token.offset, "expected a name or number after '.', got " + describe(token));
    ExprPtr item = make(ExprKind::Item, at);
    ExprPtr key = make(ExprKind::Literal, token.offset);
    key->value = Value(next().int_value);
    item->children.push_back(std::move(node));
    item->children.push_back(std::move(key));
    return item;
  }
  expect_operator("[");
  std::vector<ExprPtr> keys;
  while (!at_operator("]")) {
    if (!keys.empty()) expect_operator(",");
    keys.push_back(parse_subscribed());
  }
  next();
  if (keys.empty()) fail(at, "expected a subscript inside '[]'");
  for (const ExprPtr& key : keys) {
    if (key->kind == ExprKind::Slice && keys.size() > 1) {
      fail(key->offset, "a slice cannot be combined with other subscripts");
    }
  }
  if (keys.size() == 1 && keys[0]->kind == ExprKind::Slice) {
    keys[0]->children[0] = std::move(node);
    return std::move(keys[0]);
  }
  ExprPtr item = make(ExprKind::Item, at);
  item->children.push_back(std::move(node));
  if (keys.size() == 1) {
    item->children.push_back(std::move(keys[0]));
  } else {
    ExprPtr tuple = make(ExprKind::Tuple, at);
    tuple->children = std::move(keys);
    item->children.push_back(std::move(tuple));
  }
  return item;
}

// One subscript: an expression, or a slice start:stop:step with any part left out. A slice comes
// back with a null children[0] for the caller to fill in.
ExprPtr Parser::parse_subscribed() {
  const uint32_t at = peek().offset;
  ExprPtr start;
  if (!at_operator(":")) {
    start = parse_expression();
    if (!at_operator(":")) return start;
  }
  next();  // ":"
  ExprPtr slice = make(ExprKind::Slice, at);
  const auto part = [&]() -> ExprPtr {
    return at_operator(":") || at_operator("]") || at_operator(",") ? nullptr : parse_expression();
  };
  slice->children.push_back(nullptr);
  slice->children.push_back(std::move(start));
  slice->children.push_back(part());
  slice->children.push_back(skip_operator(":") ? part() : nullptr);
  return slice;
}

ExprPtr Parser::parse_filter_expr(ExprPtr node) {
  while (true) {
    if (at_operator("|")) {
      node = parse_filter(std::move(node));
    } else if (at_name("is")) {
      node = parse_test(std::move(node));
    } else if (at_operator("(")) {
      ExprPtr call = make(ExprKind::Call, peek().offset);
      call->children.push_back(std::move(node));
      parse_call_args(*call);
      node = std::move(call);
    } else {
      return node;
    }
  }
}

ExprPtr Parser::parse_filter(ExprPtr node) {
  next();  // "|"
  ExprPtr filter = make(ExprKind::Filter, peek().offset);
  filter->name = parse_dotted_name();
  if (!has_filter(filter->name)) fail(filter->offset, "unknown filter '" + filter->name + "'");
  filter->children.push_back(std::move(node));
  if (at_operator("(")) parse_call_args(*filter);
  return filter;
}

// "is [not] name", then arguments in parentheses, or one argument without them.
ExprPtr Parser::parse_test(ExprPtr node) {
  next();  // "is"
  ExprPtr test = make(ExprKind::Test, peek().offset);
  test->negated = skip_name("not");
  test->offset = peek().offset;
  test->name = parse_dotted_name();
  if (!has_test(test->name)) fail(test->offset, "unknown test '" + test->name + "'");
  test->children.push_back(std::move(node));
  const Token& token = peek();
  const bool argument_follows = (token.kind == TokenKind::Name && token.value != "else" &&
                                 token.value != "or" && token.value != "and") ||
                                token.kind == TokenKind::String || token.kind == TokenKind::Int ||
                                token.kind == TokenKind::Float || at_operator("[") ||
                                at_operator("{");
  if (at_operator("(")) {
    parse_call_args(*test);
  } else if (argument_follows) {
    if (at_name("is")) fail(token.offset, "tests cannot be chained with 'is'");
    test->children.push_back(parse_postfix(parse_primary()));
  }
  return test;
}

void Parser::parse_call_args(Expr& call) {
  expect_operator("(");
  bool first = true;
  while (!at_operator(")")) {
    if (!first) expect_operator(",");
    first = false;
    if (at_operator(")")) break;
    if (at_operator("*") || at_operator("**"))
      fail(peek().offset, "*args and **kwargs are not supported");
    if (peek().kind == TokenKind::Name && at_operator("=", 1)) {
      std::string key = next().value;
      next();  // "="
      call.keywords.emplace_back(std::move(key), parse_expression());
    } else {
      if (!call.keywords.empty())
        fail(peek().offset, "a positional argument follows a keyword argument");
      call.children.push_back(parse_expression());
    }
  }
  next();  // ")"
}

std::string Parser::parse_dotted_name() {
  std::string name = expect_name();
  while (at_operator(".") && peek(1).kind == TokenKind::Name) {
    next();
    name += "." + next().value;
  }
  return name;
}

}  // namespace tokenfab::jinja::detail
