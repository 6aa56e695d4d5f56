#pragma once
// Jinja tokens to a syntax tree (jinja_ast.h), following jinja2's grammar and precedence:
// conditional < or < and < not < comparisons (in, not in, chained) < + - < ~ < * / // % < ** <
// unary - + < filters, tests and calls < primaries. Statements: if, for (with else, an if filter
// and tuple targets), set (and set blocks), macro, call, filter, with, break, continue, and HF's
// generation; raw blocks are taken care of by the lexer. Unknown filters and tests, and what we do
// not implement (include, import, extends, block, recursive loops, call blocks with arguments,
// *args and **kwargs), are refused here, before anything renders.

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/tokenizer/jinja_ast.h"

namespace tokenfab::jinja {

// Throws tokenfab::Error "NAME:LINE:COLUMN: what was wrong".
std::shared_ptr<const Program> parse_program(SourceText source);

namespace detail {

class Parser {
 public:
  Parser(const SourceText& source, std::vector<Token> tokens);
  Body parse_template();

 private:
  // Statements (jinja_parser.cpp).
  Body parse_body(std::initializer_list<std::string_view> ends);
  StmtPtr parse_statement();
  StmtPtr parse_if(uint32_t at);
  StmtPtr parse_for(uint32_t at);
  StmtPtr parse_set(uint32_t at);
  StmtPtr parse_macro(uint32_t at);
  StmtPtr parse_call_block(uint32_t at);
  StmtPtr parse_filter_block(uint32_t at);
  StmtPtr parse_scope_block(uint32_t at, std::string_view end);
  StmtPtr parse_with(uint32_t at);
  ExprPtr parse_assign_target(bool allow_attribute);
  std::string end_tag();  // the tag name that ended the last parse_body (consumed)

  // Expressions (jinja_parse_expr.cpp).
  ExprPtr parse_expression(bool with_conditional = true);
  ExprPtr parse_tuple(bool explicit_parentheses = false);
  ExprPtr parse_conditional();
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary(bool with_filter);
  ExprPtr parse_primary();
  ExprPtr parse_list_or_dict();
  ExprPtr parse_postfix(ExprPtr node);
  ExprPtr parse_subscript(ExprPtr node);
  ExprPtr parse_subscribed();
  ExprPtr parse_filter_expr(ExprPtr node);
  ExprPtr parse_filter(ExprPtr node);
  ExprPtr parse_test(ExprPtr node);
  void parse_call_args(Expr& call);
  std::string parse_dotted_name();

  // Tokens.
  const Token& peek(size_t ahead = 0) const;
  const Token& next();
  bool at_operator(std::string_view op, size_t ahead = 0) const;
  bool at_name(std::string_view name, size_t ahead = 0) const;
  bool skip_operator(std::string_view op);
  bool skip_name(std::string_view name);
  void expect_operator(std::string_view op);
  std::string expect_name();
  void expect_block_end(std::string_view tag);
  std::string describe(const Token& token) const;
  [[noreturn]] void fail(uint32_t offset, const std::string& what) const;

  // Bounds the parser's recursion (nested blocks, parentheses, unary operators).
  class Deeper {
   public:
    explicit Deeper(Parser& p);
    ~Deeper() { --parser_.depth_; }
    Deeper(const Deeper&) = delete;
    Deeper& operator=(const Deeper&) = delete;

   private:
    Parser& parser_;
  };

  struct OpenBlock {
    std::string tag;
    uint32_t offset;
  };

  const SourceText& source_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;  // enclosing for-loops in the current macro (for break and continue)
  std::vector<OpenBlock> open_;
};

}  // namespace detail

}  // namespace tokenfab::jinja
