// A parsed chat template: expressions and statements (jinja_parse.cpp builds
// them, jinja_render.cpp runs them).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "template/jinja_value.h"

namespace phaselab::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
using KwArgs = std::vector<std::pair<std::string, ExprPtr>>;

struct Expr {
  enum class Op {
    literal,      // value
    name,         // name
    list,         // args: the elements (tuples are lists)
    dict,         // args: key, value, key, value, ...
    attr,         // args[0].name
    item,         // args[0][args[1]]
    slice,        // args[0][args[1]:args[2]:args[3]] (each may be null)
    call,         // args[0](args[1..], kwargs)
    filter,       // args[0] | name(args[1..], kwargs); args[0] null: a {% filter %} block's text
    test,         // args[0] is [not] name(args[1..])
    not_,         // not args[0]
    neg,          // -args[0]
    pos,          // +args[0]
    binary,       // args[0] name args[1]: + - * / // % ** ~
    compare,      // args[0] ops[0] args[1] ops[1] args[2] ...: == != < <= > >= in notin
    and_,         // args[0] and args[1]
    or_,          // args[0] or args[1]
    cond,         // args[0] if args[1] else args[2] (args[2] may be null)
  };
  Op op = Op::literal;
  int line = 0;
  Value value;
  std::string name;
  bool negated = false;  // test: "is not"
  std::vector<ExprPtr> args;
  std::vector<std::string> ops;
  KwArgs kwargs;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    text,          // text
    output,        // {{ expr }}
    if_,           // branches: (condition, body); the else branch has a null condition
    for_,          // for targets in expr [if cond]: body [else: else_body]
    set,           // set targets = expr; or set targets[0].attr = expr (attr non-empty)
    set_block,     // set targets[0] %} body {% endset
    macro,         // macro name(params) body
    call_block,    // call expr (the macro call) with body as caller()
    filter_block,  // filter expr (a filter chain over the body's text)
    break_,
    continue_,
    generation,    // {% generation %} body: rendered as it is
  };
  Kind kind = Kind::text;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;  // for: the loop filter
  std::vector<std::pair<ExprPtr, Body>> branches;
  std::vector<std::string> targets;
  std::string attr;
  std::string name;
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro parameters, default or null
  Body body;
  Body else_body;
};

// Parses a template with Hugging Face's settings (trim_blocks, lstrip_blocks,
// one trailing newline dropped). Throws Error naming the line.
Body parse_template(std::string_view source, int max_depth);

}  // namespace phaselab::jinja
