#include "text/jinja/interpreter.h"

#include <unordered_map>

#include "core/error.h"
#include "text/jinja/builtins.h"

namespace asynct::jinja {
namespace {

// An error that already carries its template position.
class PositionedError : public Error {
 public:
  using Error::Error;
};

class Interpreter {
 public:
  explicit Interpreter(const Json& variables) {
    scopes_.emplace_back();
    Value root = Value::of(variables);
    for (const auto& [key, item] : root.json().items()) scopes_.back()[key] = root.child(item);
    scopes_.emplace_back();  // the template's own top-level {% set %}s
  }

  std::string run(const Body& body) {
    exec(body);
    if (flow_ != Flow::Normal) throw Error("chat template: '{% break %}' or '{% continue %}' outside a for loop");
    return std::move(out_);
  }

 private:
  enum class Flow { Normal, Break, Continue };

  [[noreturn]] static void fail(Pos pos, const std::string& message) {
    throw PositionedError("chat template " + describe(pos) + ": " + message);
  }

  // Runs f, giving an error from the value layer this position.
  template <typename F>
  static auto at(Pos pos, F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const PositionedError&) {
      throw;
    } catch (const Error& e) {
      fail(pos, e.what());
    } catch (const nlohmann::json::exception& e) {
      fail(pos, e.what());
    }
  }

  Value lookup(const std::string& name) const {
    for (auto scope = scopes_.rbegin(); scope != scopes_.rend(); ++scope) {
      auto it = scope->find(name);
      if (it != scope->end()) return it->second;
    }
    return Value::undefined(name);
  }

  void assign(const std::vector<std::string>& targets, const Value& value, Pos pos) {
    auto& scope = scopes_.back();
    if (targets.size() == 1) {
      scope[targets[0]] = value;
      return;
    }
    std::vector<Value> items = at(pos, [&] { return iterate(value); });
    if (value.is_undefined() || items.size() != targets.size())
      fail(pos, detail::concat("cannot unpack ", items.size(), " value(s) into ", targets.size(), " names"));
    for (std::size_t i = 0; i < targets.size(); ++i) scope[targets[i]] = items[i];
  }

  Args arguments(const Expr& e) {
    Args args;
    for (const auto& item : e.items) args.positional.push_back(eval(*item));
    for (const auto& [key, item] : e.keywords) args.named.emplace_back(key, eval(*item));
    return args;
  }

  Value eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::Literal: return Value::of(e.literal);
      case Expr::Kind::Name: return lookup(e.name);
      case Expr::Kind::List:
      case Expr::Kind::Tuple: {
        Json list = Json::array();
        bool all_tuples = !e.items.empty();
        for (const auto& item : e.items) {
          Value v = eval(*item);
          all_tuples = all_tuples && v.is_data() && v.shape() == Value::Shape::Tuple;
          list.push_back(data(v, item->pos, "a list"));
        }
        auto shape = e.kind == Expr::Kind::Tuple ? Value::Shape::Tuple : Value::Shape::Plain;
        return Value::of(std::move(list)).with_shape(shape, all_tuples);
      }
      case Expr::Kind::Dict: {
        Json dict = Json::object();
        for (std::size_t i = 0; i + 1 < e.items.size(); i += 2) {
          Value key = eval(*e.items[i]);
          if (!key.is_string()) fail(e.items[i]->pos, "dict keys must be strings here (JSON), got " + type_name(key));
          dict[key.str()] = data(eval(*e.items[i + 1]), e.items[i + 1]->pos, "a dict");
        }
        return Value::of(std::move(dict));
      }
      case Expr::Kind::Attribute: {
        Value object = eval(*e.a);
        return at(e.pos, [&] { return get_attribute(object, e.name); });
      }
      case Expr::Kind::Index: {
        Value object = eval(*e.a);
        Value key = eval(*e.b);
        return at(e.pos, [&] { return get_item(object, key); });
      }
      case Expr::Kind::Slice: {
        Value object = eval(*e.a);
        Value parts[3];
        for (int i = 0; i < 3; ++i) parts[i] = e.items[std::size_t(i)] ? eval(*e.items[std::size_t(i)]) : Value::of(Json(nullptr));
        return at(e.pos, [&] { return get_slice(object, parts[0], parts[1], parts[2]); });
      }
      case Expr::Kind::Call: return call(e);
      case Expr::Kind::Filter: {
        Value input = eval(*e.a);
        Args args = arguments(e);
        return at(e.pos, [&] { return apply_filter(e.name, input, args); });
      }
      case Expr::Kind::Test: {
        Value input = eval(*e.a);
        Args args = arguments(e);
        bool result = at(e.pos, [&] { return apply_test(e.name, input, args); });
        return Value::of(Json(result != e.negated));
      }
      case Expr::Kind::Unary: {
        Value a = eval(*e.a);
        if (e.name == "not") return Value::of(Json(!truthy(a)));
        return at(e.pos, [&] { return unary_operation(e.name, a); });
      }
      case Expr::Kind::Binary: {
        Value a = eval(*e.a);
        Value b = eval(*e.b);
        return at(e.pos, [&] { return binary(e.name, a, b); });
      }
      case Expr::Kind::And: {  // Python's `and`/`or` give an operand, not a bool
        Value a = eval(*e.a);
        return truthy(a) ? eval(*e.b) : a;
      }
      case Expr::Kind::Or: {
        Value a = eval(*e.a);
        return truthy(a) ? a : eval(*e.b);
      }
      case Expr::Kind::Conditional: {
        if (truthy(eval(*e.b))) return eval(*e.a);
        return e.c ? eval(*e.c) : Value::undefined("the missing else branch");
      }
    }
    fail(e.pos, "unknown expression");
  }

  static Json data(const Value& v, Pos pos, const char* where) {
    if (v.is_data() && (v.shape() == Value::Shape::Plain || v.shape() == Value::Shape::Tuple)) return v.json();
    if (v.is_data()) fail(pos, "a " + type_name(v) + " cannot be put in " + std::string(where) + " here; add |list");
    if (v.is_undefined()) fail(pos, "an undefined value cannot be put in " + std::string(where));
    fail(pos, "a " + type_name(v) + " object cannot be put in " + std::string(where));
  }

  static Value binary(const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return Value::of(Json(py_equal(a, b)));
    if (op == "!=") return Value::of(Json(!py_equal(a, b)));
    if (op == "<") return Value::of(Json(py_less(a, b)));
    if (op == ">") return Value::of(Json(py_less(b, a)));
    if (op == "<=") return Value::of(Json(!py_less(b, a)));
    if (op == ">=") return Value::of(Json(!py_less(a, b)));
    if (op == "in") return Value::of(Json(contains(b, a)));
    if (op == "not in") return Value::of(Json(!contains(b, a)));
    return binary_operation(op, a, b);
  }

  Value call(const Expr& e) {
    if (e.a->kind == Expr::Kind::Attribute) {
      Value object = eval(*e.a->a);
      Args args = arguments(e);
      return at(e.a->pos, [&] { return call_method(object, e.a->name, args); });
    }
    if (e.a->kind == Expr::Kind::Name) {
      Value bound = lookup(e.a->name);
      if (!bound.is_undefined()) fail(e.pos, "'" + e.a->name + "' is a " + type_name(bound) + ", not a function");
      Args args = arguments(e);
      return at(e.a->pos, [&] { return call_global(e.a->name, args); });
    }
    fail(e.pos, "unsupported: calling the result of an expression");
  }

  void exec(const Body& body) {
    for (const auto& node : body) {
      exec(*node);
      if (flow_ != Flow::Normal) return;
    }
  }

  void exec(const Node& node) {
    switch (node.kind) {
      case Node::Kind::Text: out_ += node.text; return;
      case Node::Kind::Output: {
        Value v = eval(*node.expr);
        out_ += at(node.pos, [&] { return py_str(v); });
        return;
      }
      case Node::Kind::If:
        for (const auto& [condition, body] : node.branches) {
          if (truthy(eval(*condition))) {
            exec(body);
            return;
          }
        }
        exec(node.else_body);
        return;
      case Node::Kind::For: run_for(node); return;
      case Node::Kind::Set: {
        Value value = eval(*node.expr);
        if (node.attribute.empty()) {
          assign(node.targets, value, node.pos);
          return;
        }
        Value ns = lookup(node.targets[0]);
        if (ns.kind() != Value::Kind::Namespace)
          fail(node.pos, "'{% set " + node.targets[0] + "." + node.attribute + " %}' needs a namespace(), and '" +
                             node.targets[0] + "' is a " + type_name(ns));
        ns.ns().attributes[node.attribute] = value;
        return;
      }
      case Node::Kind::SetBlock: {
        std::string saved = std::move(out_);
        out_.clear();
        exec(node.body);
        std::string captured = std::move(out_);
        out_ = std::move(saved);
        assign(node.targets, Value::of(Json(std::move(captured))), node.pos);
        return;
      }
      case Node::Kind::Break:
      case Node::Kind::Continue:
        if (loop_depth_ == 0) fail(node.pos, "'{% break %}' or '{% continue %}' outside a for loop");
        flow_ = node.kind == Node::Kind::Break ? Flow::Break : Flow::Continue;
        return;
    }
  }

  void run_for(const Node& node) {
    Value iterable = eval(*node.expr);
    auto items = std::make_shared<std::vector<Value>>(at(node.expr->pos, [&] { return iterate(iterable); }));
    if (node.filter) {  // `for x in xs if cond`: the loop sees only the items that pass
      auto kept = std::make_shared<std::vector<Value>>();
      for (const Value& item : *items) {
        scopes_.emplace_back();
        assign(node.targets, item, node.pos);
        bool keep = truthy(eval(*node.filter));
        scopes_.pop_back();
        if (keep) kept->push_back(item);
      }
      items = kept;
    }
    if (items->empty()) {
      exec(node.else_body);
      return;
    }
    ++loop_depth_;
    for (std::size_t i = 0; i < items->size(); ++i) {
      // Each iteration has its own scope: a {% set %} in the body does not outlive it.
      scopes_.emplace_back();
      auto state = std::make_shared<LoopState>();
      state->index0 = i;
      state->length = items->size();
      state->items = items;
      scopes_.back()["loop"] = Value::of_loop(state);
      assign(node.targets, (*items)[i], node.pos);
      exec(node.body);
      scopes_.pop_back();
      Flow flow = flow_;
      flow_ = Flow::Normal;
      if (flow == Flow::Break) break;
    }
    --loop_depth_;
  }

  std::vector<std::unordered_map<std::string, Value>> scopes_;
  std::string out_;
  Flow flow_ = Flow::Normal;
  int loop_depth_ = 0;
};

}  // namespace

std::string render(const Body& body, const Json& variables) {
  check(variables.is_object(), "chat template variables must be a JSON object, got ", variables.type_name());
  return Interpreter(variables).run(body);
}

}  // namespace asynct::jinja
