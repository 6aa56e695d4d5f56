#pragma once
// The syntax tree the parser builds and the renderer walks. One node type for expressions and one
// for statements; each kind's comment says which fields it uses. Offsets index the normalized
// source (SourceText) and place error messages.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tokenizer/jinja_lexer.h"
#include "core/tokenizer/jinja_value.h"

namespace tokenfab::jinja {

enum class ExprKind : uint8_t {
  Literal,    // value
  Name,       // name
  List,       // children: the items
  Tuple,      // children: the items
  Dict,       // children: key, value, key, value, ...
  Attribute,  // children[0].name
  Item,       // children[0][children[1]]
  Slice,      // children[0][children[1]:children[2]:children[3]] (null when left out)
  Call,       // children[0](children[1..], keywords)
  Filter,   // children[0] | name(children[1..], keywords); children[0] null: a filter block's text
  Test,     // children[0] is [not: negated] name(children[1..], keywords)
  Unary,    // name ("-", "+", "not") children[0]
  Binary,   // children[0] name children[1]: + - * / // % ** ~ and or
  Compare,  // children[0] ops[0] children[1] ops[1] ... (chained as in Python)
  Conditional,  // children[0] if children[1] else children[2] (null: undefined)
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  Expr(ExprKind k, uint32_t at) : kind(k), offset(at) {}
  ExprKind kind;
  uint32_t offset = 0;
  Value value;
  std::string name;
  bool negated = false;
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
  std::vector<std::string> ops;
};

enum class StmtKind : uint8_t {
  Text,         // text
  Output,       // {{ expr }}
  If,           // branches: (condition, body) ...; the else branch has a null condition
  For,          // for target in expr [if condition]: body, else: else_body
  Set,          // set target = expr (target: Name, Tuple of Names, or Attribute of a namespace)
  SetBlock,     // set target: body rendered to a string
  Macro,        // macro text(params): body
  CallBlock,    // call expr (a Call): body becomes caller()
  FilterBlock,  // filter expr (a Filter chain whose innermost input is null): body
  With,         // with params (name = value, ...): body, in a scope of its own
  Break,
  Continue,
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  Stmt(StmtKind k, uint32_t at) : kind(k), offset(at) {}
  StmtKind kind;
  uint32_t offset = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr target;
  ExprPtr condition;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  std::vector<std::pair<std::string, ExprPtr>> params;  // Macro: name, default (or null); With
};

struct Program {
  SourceText source;
  Body body;
};

}  // namespace tokenfab::jinja
