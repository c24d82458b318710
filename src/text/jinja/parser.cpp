// Over 500 lines: the whole of jinja2's grammar that templates use, one function per rule.
// A recursive-descent parser with jinja2's grammar and operator precedence (lowest first):
// `x if c else y`, or, and, not, comparisons and `in`, + -, ~, * / // %, **, unary - +,
// then primaries with their postfixes (.attr, [index], [a:b:c], (call)) and filters/tests.
#include <set>

#include "core/error.h"
#include "text/jinja/ast.h"

namespace asynct::jinja {
namespace {

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Body parse_template() {
    std::string end;
    Body body = parse_body({}, end);
    return body;
  }

 private:
  const Token& cur() const { return tokens_[pos_]; }
  const Token& next() { return tokens_[pos_++]; }
  bool is_op(const char* op) const { return cur().type == Token::Type::Operator && cur().value == op; }
  bool is_name(const char* name) const { return cur().type == Token::Type::Name && cur().value == name; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    ++pos_;
    return true;
  }
  bool skip_name(const char* name) {
    if (!is_name(name)) return false;
    ++pos_;
    return true;
  }

  [[noreturn]] void fail(Pos pos, const std::string& message) const {
    throw Error(detail::concat("chat template ", describe(pos), ": ", message));
  }
  std::string show(const Token& t) const {
    switch (t.type) {
      case Token::Type::End: return "the end of the template";
      case Token::Type::Text: return "template text";
      case Token::Type::BlockEnd: return "'%}'";
      case Token::Type::VariableEnd: return "'}}'";
      case Token::Type::String: return "a string";
      default: return "'" + t.value + "'";
    }
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(cur().pos, detail::concat("expected '", op, "', found ", show(cur())));
  }
  std::string expect_name() {
    if (cur().type != Token::Type::Name) fail(cur().pos, "expected a name, found " + show(cur()));
    return next().value;
  }
  void expect_block_end() {
    if (cur().type != Token::Type::BlockEnd) fail(cur().pos, "expected '%}', found " + show(cur()));
    ++pos_;
  }

  // Statements until a block tag whose keyword is in `ends` (returned in `end`, tag consumed up
  // to the keyword) or, with no ends, until the end of the template.
  Body parse_body(const std::set<std::string>& ends, std::string& end) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == Token::Type::End) {
        if (!ends.empty()) {
          std::string list;
          for (const auto& e : ends) list += (list.empty() ? "'" : " or '") + e + "'";
          fail(t.pos, "missing " + list + " before the end of the template");
        }
        return body;
      }
      if (t.type == Token::Type::Text) {
        auto node = std::make_unique<Node>();
        node->kind = Node::Kind::Text;
        node->pos = t.pos;
        node->text = t.value;
        body.push_back(std::move(node));
        ++pos_;
      } else if (t.type == Token::Type::VariableBegin) {
        ++pos_;
        auto node = std::make_unique<Node>();
        node->kind = Node::Kind::Output;
        node->pos = t.pos;
        node->expr = parse_expression();
        if (is_op(",")) fail(cur().pos, "printing a tuple is not supported");
        if (cur().type != Token::Type::VariableEnd) fail(cur().pos, "expected '}}', found " + show(cur()));
        ++pos_;
        body.push_back(std::move(node));
      } else if (t.type == Token::Type::BlockBegin) {
        ++pos_;
        Pos pos = cur().pos;
        std::string keyword = expect_name();
        if (ends.count(keyword)) {
          end = keyword;
          return body;
        }
        body.push_back(parse_statement(keyword, pos));
      } else {
        fail(t.pos, "unexpected " + show(t));
      }
    }
  }

  std::unique_ptr<Node> parse_statement(const std::string& keyword, Pos pos) {
    auto node = std::make_unique<Node>();
    node->pos = pos;
    if (keyword == "if") {
      node->kind = Node::Kind::If;
      ExprPtr condition = parse_expression();
      expect_block_end();
      while (true) {
        std::string end;
        Body body = parse_body({"elif", "else", "endif"}, end);
        node->branches.emplace_back(std::move(condition), std::move(body));
        if (end == "elif") {
          condition = parse_expression();
          expect_block_end();
          continue;
        }
        if (end == "else") {
          expect_block_end();
          node->else_body = parse_body({"endif"}, end);
        }
        expect_block_end();
        return node;
      }
    }
    if (keyword == "for") {
      node->kind = Node::Kind::For;
      node->targets = parse_targets();
      if (!skip_name("in")) fail(cur().pos, "expected 'in' in a for loop, found " + show(cur()));
      node->expr = parse_or();
      if (skip_name("if")) node->filter = parse_expression(false);
      if (is_name("recursive")) fail(cur().pos, "unsupported: recursive for loops");
      expect_block_end();
      std::string end;
      node->body = parse_body({"else", "endfor"}, end);
      if (end == "else") {
        expect_block_end();
        node->else_body = parse_body({"endfor"}, end);
      }
      expect_block_end();
      return node;
    }
    if (keyword == "set") {
      Pos target_pos = cur().pos;
      std::string first = expect_name();
      if (skip_op(".")) {
        node->kind = Node::Kind::Set;
        node->targets = {first};
        node->attribute = expect_name();
        expect_op("=");
        node->expr = parse_value_tuple();
        expect_block_end();
        return node;
      }
      node->targets = {first};
      while (skip_op(",")) node->targets.push_back(expect_name());
      if (cur().type == Token::Type::BlockEnd && node->targets.size() == 1) {
        ++pos_;
        node->kind = Node::Kind::SetBlock;
        std::string end;
        node->body = parse_body({"endset"}, end);
        expect_block_end();
        return node;
      }
      if (is_op("|")) fail(target_pos, "unsupported: filters on a {% set %} block");
      node->kind = Node::Kind::Set;
      expect_op("=");
      node->expr = parse_value_tuple();
      expect_block_end();
      return node;
    }
    if (keyword == "break" || keyword == "continue") {
      node->kind = keyword == "break" ? Node::Kind::Break : Node::Kind::Continue;
      expect_block_end();
      return node;
    }
    static const std::set<std::string> closers = {"elif", "else", "endif", "endfor", "endset", "endmacro", "endblock",
                                                  "endfilter", "endcall", "endwith", "endraw"};
    if (closers.count(keyword)) fail(pos, "unexpected '" + keyword + "' (no open block it closes)");
    fail(pos, "unsupported statement '{% " + keyword + " %}'");
  }

  std::vector<std::string> parse_targets() {
    bool paren = skip_op("(");
    std::vector<std::string> names = {expect_name()};
    while (skip_op(",")) {
      if (paren && is_op(")")) break;
      names.push_back(expect_name());
    }
    if (paren) expect_op(")");
    return names;
  }

  // `a` or `a, b` (a tuple without parentheses) on the right of `set`.
  ExprPtr parse_value_tuple() {
    Pos pos = cur().pos;
    ExprPtr first = parse_expression();
    if (!is_op(",")) return first;
    auto tuple = make(Expr::Kind::Tuple, pos);
    tuple->items.push_back(std::move(first));
    while (skip_op(",")) {
      if (cur().type == Token::Type::BlockEnd) break;
      tuple->items.push_back(parse_expression());
    }
    return tuple;
  }

  static ExprPtr make(Expr::Kind kind, Pos pos) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->pos = pos;
    return e;
  }
  static ExprPtr binary(Expr::Kind kind, std::string op, Pos pos, ExprPtr a, ExprPtr b) {
    auto e = make(kind, pos);
    e->name = std::move(op);
    e->a = std::move(a);
    e->b = std::move(b);
    return e;
  }

  ExprPtr parse_expression(bool with_conditional = true) {
    ExprPtr value = parse_or();
    if (!with_conditional) return value;
    while (is_name("if")) {
      Pos pos = next().pos;
      auto e = make(Expr::Kind::Conditional, pos);
      e->a = std::move(value);
      e->b = parse_or();
      if (skip_name("else")) e->c = parse_expression();
      value = std::move(e);
    }
    return value;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      Pos pos = next().pos;
      left = binary(Expr::Kind::Or, "or", pos, std::move(left), parse_and());
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      Pos pos = next().pos;
      left = binary(Expr::Kind::And, "and", pos, std::move(left), parse_not());
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      Pos pos = next().pos;
      auto e = make(Expr::Kind::Unary, pos);
      e->name = "not";
      e->a = parse_not();
      return e;
    }
    return parse_compare();
  }

  bool at_comparison() const {
    if (cur().type == Token::Type::Operator) {
      const std::string& v = cur().value;
      return v == "==" || v == "!=" || v == "<" || v == ">" || v == "<=" || v == ">=";
    }
    if (is_name("in")) return true;
    return is_name("not") && tokens_[pos_ + 1].type == Token::Type::Name && tokens_[pos_ + 1].value == "in";
  }

  ExprPtr parse_compare() {
    ExprPtr left = parse_math1();
    if (!at_comparison()) return left;
    Pos pos = cur().pos;
    std::string op = next().value;
    if (op == "not") {
      ++pos_;
      op = "not in";
    }
    left = binary(Expr::Kind::Binary, op, pos, std::move(left), parse_math1());
    if (at_comparison()) fail(cur().pos, "unsupported: chained comparisons (a < b < c)");
    return left;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      left = binary(Expr::Kind::Binary, t.value, t.pos, std::move(left), parse_concat());
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      const Token& t = next();
      left = binary(Expr::Kind::Binary, "~", t.pos, std::move(left), parse_math2());
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      left = binary(Expr::Kind::Binary, t.value, t.pos, std::move(left), parse_pow());
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const Token& t = next();
      left = binary(Expr::Kind::Binary, "**", t.pos, std::move(left), parse_unary(true));
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      node = make(Expr::Kind::Unary, t.pos);
      node->name = t.value;
      node->a = parse_unary(false);
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filters(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    switch (t.type) {
      case Token::Type::Name: {
        ++pos_;
        auto e = make(Expr::Kind::Literal, t.pos);
        if (t.value == "true" || t.value == "True") e->literal = true;
        else if (t.value == "false" || t.value == "False") e->literal = false;
        else if (t.value == "none" || t.value == "None") e->literal = nullptr;
        else {
          e->kind = Expr::Kind::Name;
          e->name = t.value;
        }
        return e;
      }
      case Token::Type::String: {
        auto e = make(Expr::Kind::Literal, t.pos);
        std::string s;
        while (cur().type == Token::Type::String) s += next().value;  // adjacent literals join
        e->literal = s;
        return e;
      }
      case Token::Type::Integer: {
        ++pos_;
        auto e = make(Expr::Kind::Literal, t.pos);
        try {
          e->literal = std::stoll(t.value);
        } catch (const std::exception&) {
          fail(t.pos, "integer literal " + t.value + " is out of range");
        }
        return e;
      }
      case Token::Type::Float: {
        ++pos_;
        auto e = make(Expr::Kind::Literal, t.pos);
        e->literal = std::stod(t.value);
        return e;
      }
      case Token::Type::Operator: {
        if (t.value == "(") {
          ++pos_;
          if (skip_op(")")) return make(Expr::Kind::Tuple, t.pos);
          ExprPtr first = parse_expression();
          if (skip_op(")")) return first;
          auto tuple = make(Expr::Kind::Tuple, t.pos);
          tuple->items.push_back(std::move(first));
          while (skip_op(",")) {
            if (is_op(")")) break;
            tuple->items.push_back(parse_expression());
          }
          expect_op(")");
          return tuple;
        }
        if (t.value == "[") {
          ++pos_;
          auto list = make(Expr::Kind::List, t.pos);
          while (!is_op("]")) {
            list->items.push_back(parse_expression());
            if (!skip_op(",")) break;
          }
          expect_op("]");
          return list;
        }
        if (t.value == "{") {
          ++pos_;
          auto dict = make(Expr::Kind::Dict, t.pos);
          while (!is_op("}")) {
            dict->items.push_back(parse_expression());
            expect_op(":");
            dict->items.push_back(parse_expression());
            if (!skip_op(",")) break;
          }
          expect_op("}");
          return dict;
        }
        break;
      }
      default: break;
    }
    fail(t.pos, "expected an expression, found " + show(t));
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".")) {
        Pos pos = next().pos;
        if (cur().type == Token::Type::Integer) {
          auto e = make(Expr::Kind::Index, pos);
          e->a = std::move(node);
          e->b = make(Expr::Kind::Literal, cur().pos);
          e->b->literal = std::stoll(next().value);
          node = std::move(e);
          continue;
        }
        auto e = make(Expr::Kind::Attribute, pos);
        e->a = std::move(node);
        e->name = expect_name();
        node = std::move(e);
      } else if (is_op("[")) {
        Pos pos = next().pos;
        node = parse_subscript(std::move(node), pos);
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node, Pos pos) {
    ExprPtr parts[3];
    int part = 0;
    bool slice = false;
    while (!is_op("]")) {
      if (skip_op(":")) {
        slice = true;
        if (++part > 2) fail(cur().pos, "too many ':' in a slice");
        continue;
      }
      if (is_op(",")) fail(cur().pos, "unsupported: tuple subscripts (a[x, y])");
      if (parts[part]) fail(cur().pos, "expected ']' or ':', found " + show(cur()));
      parts[part] = parse_expression();
    }
    expect_op("]");
    if (!slice) {
      if (!parts[0]) fail(pos, "empty subscript");
      auto e = make(Expr::Kind::Index, pos);
      e->a = std::move(node);
      e->b = std::move(parts[0]);
      return e;
    }
    auto e = make(Expr::Kind::Slice, pos);
    e->a = std::move(node);
    for (auto& p : parts) e->items.push_back(std::move(p));
    return e;
  }

  void parse_arguments(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (is_op("*") || is_op("**")) fail(cur().pos, "unsupported: *args / **kwargs in a call");
      if (cur().type == Token::Type::Name && tokens_[pos_ + 1].type == Token::Type::Operator &&
          tokens_[pos_ + 1].value == "=") {
        std::string key = next().value;
        ++pos_;
        e.keywords.emplace_back(key, parse_expression());
      } else {
        if (!e.keywords.empty()) fail(cur().pos, "a positional argument follows a keyword argument");
        e.items.push_back(parse_expression());
      }
      if (!skip_op(",")) break;
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = make(Expr::Kind::Call, cur().pos);
    e->a = std::move(callee);
    parse_arguments(*e);
    return e;
  }

  std::string dotted_name() {
    std::string name = expect_name();
    while (is_op(".") && tokens_[pos_ + 1].type == Token::Type::Name) {
      ++pos_;
      name += "." + next().value;
    }
    return name;
  }

  ExprPtr parse_filters(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        Pos pos = next().pos;
        auto e = make(Expr::Kind::Filter, pos);
        e->a = std::move(node);
        e->name = dotted_name();
        if (is_op("(")) parse_arguments(*e);
        node = std::move(e);
      } else if (is_name("is")) {
        Pos pos = next().pos;
        auto e = make(Expr::Kind::Test, pos);
        e->a = std::move(node);
        e->negated = skip_name("not");
        e->name = dotted_name();
        if (is_op("(")) {
          parse_arguments(*e);
        } else if ((cur().type == Token::Type::Name || cur().type == Token::Type::String ||
                    cur().type == Token::Type::Integer || cur().type == Token::Type::Float || is_op("(") ||
                    is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) fail(cur().pos, "tests cannot be chained with 'is'");
          e->items.push_back(parse_postfix(parse_primary()));
        }
        node = std::move(e);
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  std::vector<Token> tokens_;
  std::size_t pos_ = 0;
};

}  // namespace

Body parse(const std::string& source) { return Parser(tokenize(source)).parse_template(); }

}  // namespace asynct::jinja
