// What a template can do with values: attribute and item access, iteration, the filters,
// tests, str/dict methods and globals of HuggingFace's jinja2 environment. These throw
// asynct::Error without a position; the interpreter adds the line:column of the expression.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "text/jinja/value.h"

namespace asynct::jinja {

struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> named;
};

// jinja2's environment.getattr / getitem: a missing key or index is Undefined; any access on
// Undefined is an error.
Value get_attribute(const Value& object, const std::string& name);
Value get_item(const Value& object, const Value& key);
Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step);

// The items a for loop or filter walks: list elements, dict keys, string characters;
// Undefined walks nothing.
std::vector<Value> iterate(const Value& v);

Value apply_filter(const std::string& name, const Value& input, const Args& args);
bool apply_test(const std::string& name, const Value& input, const Args& args);
Value call_method(const Value& object, const std::string& name, const Args& args);
// raise_exception, namespace, range, dict, strftime_now.
Value call_global(const std::string& name, const Args& args);

// Python's a + b, a - b, ... (op: + - * / // % ** ~) and unary - +.
Value binary_operation(const std::string& op, const Value& a, const Value& b);
Value unary_operation(const std::string& op, const Value& a);
// `a in b`.
bool contains(const Value& container, const Value& item);

}  // namespace asynct::jinja
