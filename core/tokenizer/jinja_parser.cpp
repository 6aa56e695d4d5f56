// Statements, and the token helpers the expression parser (jinja_parse_expr.cpp) shares.

#include "core/tokenizer/jinja_parser.h"

#include <algorithm>

#include "core/common/error.h"
#include "core/tokenizer/jinja_builtins.h"

namespace tokenfab::jinja {

namespace {

constexpr int kMaxParseDepth = 100;

// The tags that close or continue each block, for messages about a block left open.
std::string expected_ends(const std::string& tag) {
  if (tag == "if") return "'elif', 'else' or 'endif'";
  if (tag == "for") return "'else' or 'endfor'";
  return "'end" + tag + "'";
}

bool is_end_like(std::string_view name) {
  return name.starts_with("end") || name == "elif" || name == "else";
}

}  // namespace

std::shared_ptr<const Program> parse_program(SourceText source) {
  auto program = std::make_shared<Program>();
  program->source = std::move(source);
  detail::Parser parser(program->source, tokenize(program->source));
  program->body = parser.parse_template();
  return program;
}

namespace detail {

Parser::Parser(const SourceText& source, std::vector<Token> tokens)
    : source_(source), tokens_(std::move(tokens)) {}

Parser::Deeper::Deeper(Parser& p) : parser_(p) {
  if (++parser_.depth_ > kMaxParseDepth) {
    parser_.fail(parser_.peek().offset, "the template nests blocks or expressions more than " +
                                            std::to_string(kMaxParseDepth) + " levels deep");
  }
}

Body Parser::parse_template() {
  return parse_body({});
}

// Statements up to one of the tags in `ends` (its "{%" and name are consumed; see end_tag), or
// the end of the template when `ends` is empty.
Body Parser::parse_body(std::initializer_list<std::string_view> ends) {
  const Deeper deeper(*this);
  Body body;
  while (true) {
    const Token& token = peek();
    if (token.kind == TokenKind::End) {
      if (ends.size() == 0) return body;
      const OpenBlock& open = open_.back();
      fail(token.offset, "unexpected end of template: the '" + open.tag + "' block opened at " +
                             source_.line_column(open.offset) + " is not closed (expected " +
                             expected_ends(open.tag) + ")");
    }
    if (token.kind == TokenKind::Text) {
      auto text = std::make_unique<Stmt>(StmtKind::Text, token.offset);
      text->text = next().value;
      body.push_back(std::move(text));
    } else if (token.kind == TokenKind::VarBegin) {
      auto output = std::make_unique<Stmt>(StmtKind::Output, next().offset);
      output->expr = parse_tuple();
      if (peek().kind != TokenKind::VarEnd)
        fail(peek().offset, "expected '}}', got " + describe(peek()));
      next();
      body.push_back(std::move(output));
    } else if (token.kind == TokenKind::BlockBegin) {
      const Token& name = peek(1);
      if (name.kind == TokenKind::Name &&
          std::find(ends.begin(), ends.end(), name.value) != ends.end()) {
        next();
        return body;
      }
      body.push_back(parse_statement());
    } else {
      fail(token.offset, "unexpected " + describe(token));
    }
  }
}

std::string Parser::end_tag() {
  return expect_name();
}

StmtPtr Parser::parse_statement() {
  const uint32_t at = next().offset;  // "{%"
  if (peek().kind != TokenKind::Name)
    fail(peek().offset, "expected a tag name, got " + describe(peek()));
  const std::string tag = peek().value;
  if (tag == "if") return parse_if(at);
  if (tag == "for") return parse_for(at);
  if (tag == "set") return parse_set(at);
  if (tag == "macro") return parse_macro(at);
  if (tag == "call") return parse_call_block(at);
  if (tag == "filter") return parse_filter_block(at);
  if (tag == "generation") return parse_scope_block(at, "endgeneration");
  if (tag == "with") return parse_with(at);
  if (tag == "break" || tag == "continue") {
    if (loop_depth_ == 0) fail(peek().offset, "'" + tag + "' outside a loop");
    next();
    expect_block_end(tag);
    return std::make_unique<Stmt>(tag == "break" ? StmtKind::Break : StmtKind::Continue, at);
  }
  if (is_end_like(tag)) {
    std::string what = "unexpected '" + tag + "'";
    if (open_.empty()) {
      what += " (no block is open)";
    } else {
      what += " (the innermost open block is '" + open_.back().tag + "', opened at " +
              source_.line_column(open_.back().offset) + ", which expects " +
              expected_ends(open_.back().tag) + ")";
    }
    fail(peek().offset, what);
  }
  fail(peek().offset, "unknown or unsupported tag '" + tag + "'");
}

StmtPtr Parser::parse_if(uint32_t at) {
  next();  // "if"
  auto stmt = std::make_unique<Stmt>(StmtKind::If, at);
  open_.push_back({"if", at});
  ExprPtr condition = parse_expression();
  while (true) {
    expect_block_end("if");
    Body body = parse_body({"elif", "else", "endif"});
    stmt->branches.emplace_back(std::move(condition), std::move(body));
    const std::string tag = end_tag();
    if (tag == "elif") {
      condition = parse_expression();
      continue;
    }
    if (tag == "else") {
      expect_block_end("else");
      stmt->branches.emplace_back(nullptr, parse_body({"endif"}));
      end_tag();
    }
    expect_block_end("endif");
    break;
  }
  open_.pop_back();
  return stmt;
}

StmtPtr Parser::parse_for(uint32_t at) {
  next();  // "for"
  auto stmt = std::make_unique<Stmt>(StmtKind::For, at);
  open_.push_back({"for", at});
  stmt->target = parse_assign_target(false);
  if (!skip_name("in")) fail(peek().offset, "expected 'in', got " + describe(peek()));
  stmt->expr = parse_expression(false);
  if (skip_name("if")) stmt->condition = parse_expression();
  if (at_name("recursive")) fail(peek().offset, "recursive loops are not supported");
  expect_block_end("for");
  ++loop_depth_;
  stmt->body = parse_body({"endfor", "else"});
  --loop_depth_;
  if (end_tag() == "else") {
    expect_block_end("else");
    stmt->else_body = parse_body({"endfor"});
    end_tag();
  }
  expect_block_end("endfor");
  open_.pop_back();
  return stmt;
}

// A name, `ns.attribute` (set only), or names separated by commas, optionally in parentheses.
ExprPtr Parser::parse_assign_target(bool allow_attribute) {
  const uint32_t at = peek().offset;
  const bool parenthesized = skip_operator("(");
  std::vector<ExprPtr> names;
  do {
    auto name = std::make_unique<Expr>(ExprKind::Name, peek().offset);
    name->name = expect_name();
    if (allow_attribute && !parenthesized && names.empty() && at_operator(".")) {
      next();
      auto attribute = std::make_unique<Expr>(ExprKind::Attribute, name->offset);
      attribute->name = expect_name();
      attribute->children.push_back(std::move(name));
      return attribute;
    }
    names.push_back(std::move(name));
  } while (skip_operator(","));
  if (parenthesized) expect_operator(")");
  if (names.size() == 1 && !parenthesized) return std::move(names[0]);
  auto tuple = std::make_unique<Expr>(ExprKind::Tuple, at);
  tuple->children = std::move(names);
  return tuple;
}

StmtPtr Parser::parse_set(uint32_t at) {
  next();  // "set"
  ExprPtr target = parse_assign_target(true);
  if (skip_operator("=")) {
    auto stmt = std::make_unique<Stmt>(StmtKind::Set, at);
    stmt->target = std::move(target);
    stmt->expr = parse_tuple();
    expect_block_end("set");
    return stmt;
  }
  auto stmt = std::make_unique<Stmt>(StmtKind::SetBlock, at);
  if (target->kind == ExprKind::Tuple) fail(target->offset, "a set block assigns one name");
  stmt->target = std::move(target);
  expect_block_end("set");
  open_.push_back({"set", at});
  stmt->body = parse_body({"endset"});
  end_tag();
  expect_block_end("endset");
  open_.pop_back();
  return stmt;
}

StmtPtr Parser::parse_macro(uint32_t at) {
  next();  // "macro"
  auto stmt = std::make_unique<Stmt>(StmtKind::Macro, at);
  stmt->text = expect_name();
  expect_operator("(");
  while (!at_operator(")")) {
    if (!stmt->params.empty()) expect_operator(",");
    if (at_operator(")")) break;
    std::string name = expect_name();
    ExprPtr fallback = skip_operator("=") ? parse_expression() : nullptr;
    stmt->params.emplace_back(std::move(name), std::move(fallback));
  }
  next();  // ")"
  expect_block_end("macro");
  open_.push_back({"macro", at});
  const int loops = std::exchange(loop_depth_, 0);
  stmt->body = parse_body({"endmacro"});
  loop_depth_ = loops;
  end_tag();
  expect_block_end("endmacro");
  open_.pop_back();
  return stmt;
}

StmtPtr Parser::parse_call_block(uint32_t at) {
  next();  // "call"
  if (at_operator("(")) fail(peek().offset, "call blocks with caller arguments are not supported");
  auto stmt = std::make_unique<Stmt>(StmtKind::CallBlock, at);
  stmt->expr = parse_expression();
  if (stmt->expr->kind != ExprKind::Call) fail(stmt->expr->offset, "expected a macro call");
  expect_block_end("call");
  open_.push_back({"call", at});
  const int loops = std::exchange(loop_depth_, 0);
  stmt->body = parse_body({"endcall"});
  loop_depth_ = loops;
  end_tag();
  expect_block_end("endcall");
  open_.pop_back();
  return stmt;
}

StmtPtr Parser::parse_filter_block(uint32_t at) {
  next();  // "filter"
  auto stmt = std::make_unique<Stmt>(StmtKind::FilterBlock, at);
  ExprPtr chain;  // null: the block's text
  do {
    auto filter = std::make_unique<Expr>(ExprKind::Filter, peek().offset);
    filter->children.push_back(std::move(chain));
    chain = std::move(filter);
    chain->name = parse_dotted_name();
    if (!has_filter(chain->name)) fail(chain->offset, "unknown filter '" + chain->name + "'");
    if (at_operator("(")) parse_call_args(*chain);
  } while (skip_operator("|"));
  stmt->expr = std::move(chain);
  expect_block_end("filter");
  open_.push_back({"filter", at});
  stmt->body = parse_body({"endfilter"});
  end_tag();
  expect_block_end("endfilter");
  open_.pop_back();
  return stmt;
}

// HF's {% generation %} marks the assistant's text for training masks; it renders its body.
StmtPtr Parser::parse_scope_block(uint32_t at, std::string_view end) {
  const std::string tag = next().value;
  expect_block_end(tag);
  open_.push_back({tag, at});
  auto stmt = std::make_unique<Stmt>(StmtKind::If, at);
  auto always = std::make_unique<Expr>(ExprKind::Literal, at);
  always->value = Value(true);
  stmt->branches.emplace_back(std::move(always), parse_body({end}));
  end_tag();
  expect_block_end(end);
  open_.pop_back();
  return stmt;
}

// {% with a = 1, b = 2 %}: the names hold in the block only.
StmtPtr Parser::parse_with(uint32_t at) {
  next();  // "with"
  auto stmt = std::make_unique<Stmt>(StmtKind::With, at);
  while (peek().kind != TokenKind::BlockEnd) {
    if (!stmt->params.empty()) expect_operator(",");
    std::string name = expect_name();
    expect_operator("=");
    stmt->params.emplace_back(std::move(name), parse_expression());
  }
  expect_block_end("with");
  open_.push_back({"with", at});
  stmt->body = parse_body({"endwith"});
  end_tag();
  expect_block_end("endwith");
  open_.pop_back();
  return stmt;
}

// --- tokens ---

const Token& Parser::peek(size_t ahead) const {
  return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
}

const Token& Parser::next() {
  const Token& token = peek();
  if (pos_ + 1 < tokens_.size()) ++pos_;
  return token;
}

bool Parser::at_operator(std::string_view op, size_t ahead) const {
  return peek(ahead).kind == TokenKind::Operator && peek(ahead).value == op;
}

bool Parser::at_name(std::string_view name, size_t ahead) const {
  return peek(ahead).kind == TokenKind::Name && peek(ahead).value == name;
}

bool Parser::skip_operator(std::string_view op) {
  if (!at_operator(op)) return false;
  next();
  return true;
}

bool Parser::skip_name(std::string_view name) {
  if (!at_name(name)) return false;
  next();
  return true;
}

void Parser::expect_operator(std::string_view op) {
  if (!skip_operator(op))
    fail(peek().offset, "expected '" + std::string(op) + "', got " + describe(peek()));
}

std::string Parser::expect_name() {
  if (peek().kind != TokenKind::Name)
    fail(peek().offset, "expected a name, got " + describe(peek()));
  return next().value;
}

void Parser::expect_block_end(std::string_view tag) {
  if (peek().kind != TokenKind::BlockEnd) {
    fail(peek().offset,
         "expected the end of the '" + std::string(tag) + "' tag ('%}'), got " + describe(peek()));
  }
  next();
}

std::string Parser::describe(const Token& token) const {
  switch (token.kind) {
    case TokenKind::Text:
      return "template text";
    case TokenKind::VarBegin:
      return "'{{'";
    case TokenKind::VarEnd:
      return "the end of the expression ('}}')";
    case TokenKind::BlockBegin:
      return "'{%'";
    case TokenKind::BlockEnd:
      return "the end of the tag ('%}')";
    case TokenKind::Name:
      return "name '" + token.value + "'";
    case TokenKind::String:
      return "a string";
    case TokenKind::Int:
    case TokenKind::Float:
      return "number " + token.value;
    case TokenKind::Operator:
      return "'" + token.value + "'";
    case TokenKind::End:
      return "the end of the template";
  }
  return "a token";
}

void Parser::fail(uint32_t offset, const std::string& what) const {
  throw Error(source_.position(offset) + ": " + what);
}

}  // namespace detail

}  // namespace tokenfab::jinja
