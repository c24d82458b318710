// The parsed template: expressions and statements of the Jinja subset chat templates use.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/lexer.h"
#include "text/jinja/value.h"

namespace asynct::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    Literal,    // literal
    Name,       // name
    List,       // items
    Tuple,      // items (a tuple evaluates to a list)
    Dict,       // keyed: (key expression, value expression) in items pairs
    Attribute,  // a.name
    Index,      // a[b]
    Slice,      // a[items[0]:items[1]:items[2]], each may be null
    Call,       // a(items, keywords)
    Filter,     // a | name(items, keywords)
    Test,       // a is [not] name(items)
    Unary,      // op a  (op: "-", "+", "not")
    Binary,     // a op b (arithmetic, comparison, in, not in, ~)
    And,
    Or,
    Conditional,  // a if b else c (c may be null)
  };
  Kind kind;
  Pos pos;
  Json literal;
  std::string name;  // variable, attribute, filter, test or operator
  bool negated = false;
  ExprPtr a, b, c;
  std::vector<ExprPtr> items;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum class Kind { Text, Output, If, For, Set, SetBlock, Break, Continue };
  Kind kind;
  Pos pos;
  std::string text;                                // Text
  ExprPtr expr;                                    // Output, Set (value), For (iterable)
  std::vector<std::pair<ExprPtr, Body>> branches;  // If: condition and body of if / elif
  Body body;                                       // For, SetBlock
  Body else_body;                                  // If, For
  std::vector<std::string> targets;                // For, Set, SetBlock: names (several: unpacking)
  std::string attribute;                           // Set: `set ns.attribute = ...` (targets[0] is ns)
  ExprPtr filter;                                  // For: `for x in xs if filter`
};

// Parses a template; throws asynct::Error naming an unsupported or malformed construct and its
// line:column.
Body parse(const std::string& source);

}  // namespace asynct::jinja
