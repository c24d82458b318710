// The values a chat template computes with, and Python's rules for them (str(), repr(),
// json.dumps, ==, <, truthiness), since jinja2 evaluates templates as Python.
//
// Data is nlohmann::ordered_json: key order must survive (tojson of a tool definition prints
// keys in the order the caller gave them, as Python dicts do). A Value refers into a shared,
// immutable JSON tree, so `messages[i].content` costs no copy. Besides data a Value can be
// jinja's Undefined (a missing variable, key or index), a namespace() object or a loop object.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace asynct::jinja {

using Json = nlohmann::ordered_json;

class Value;

// namespace(...): the one mutable object a template can make (`{% set ns.x = ... %}`).
struct Namespace {
  std::map<std::string, Value> attributes;
};

// What `loop` refers to inside a for loop.
struct LoopState {
  std::size_t index0 = 0;
  std::size_t length = 0;
  std::shared_ptr<const std::vector<Value>> items;  // for previtem / nextitem
};

class Value {
 public:
  enum class Kind { Undefined, Data, Namespace, Loop };
  // What Python type a JSON list stands for. jinja2's selectattr/map/items/reverse filters
  // return generators (always true, no len(), not printable), dict.items()/keys()/values()
  // return views, and a tuple prints as (a, b). tuple_items: the elements are tuples (pairs
  // from items()).
  enum class Shape { Plain, Tuple, Generator, DictItems, DictKeys, DictValues };

  Value() = default;  // Undefined
  static Value undefined(std::string what = {}) {
    Value v;
    v.what_ = std::move(what);
    return v;
  }
  static Value of(Json j) {
    auto owner = std::make_shared<const Json>(std::move(j));
    Value v;
    v.kind_ = Kind::Data;
    v.json_ = owner.get();
    v.owner_ = std::move(owner);
    return v;
  }
  static Value of_namespace(std::shared_ptr<Namespace> ns) {
    Value v;
    v.kind_ = Kind::Namespace;
    v.ns_ = std::move(ns);
    return v;
  }
  static Value of_loop(std::shared_ptr<const LoopState> loop) {
    Value v;
    v.kind_ = Kind::Loop;
    v.loop_ = std::move(loop);
    return v;
  }
  // A value inside this one's JSON tree (an element or a member), sharing its storage.
  Value child(const Json& inside) const {
    Value v;
    v.kind_ = Kind::Data;
    v.owner_ = owner_;
    v.json_ = &inside;
    if (tuple_items_) v.shape_ = Shape::Tuple;
    return v;
  }
  Value with_shape(Shape shape, bool tuple_items) const {
    Value v = *this;
    v.shape_ = shape;
    v.tuple_items_ = tuple_items;
    if (shape == Shape::Generator) v.generator_used_ = std::make_shared<bool>(false);
    return v;
  }
  // A Python generator runs once; a second use would see nothing. Marks this one used and
  // tells whether it already was (copies share the mark).
  bool use_generator() const {
    bool was = *generator_used_;
    *generator_used_ = true;
    return was;
  }
  Shape shape() const { return shape_; }
  bool tuple_items() const { return tuple_items_; }
  bool is_generator() const { return is_data() && shape_ == Shape::Generator; }

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_data() const { return kind_ == Kind::Data; }
  const Json& json() const { return *json_; }  // only for Kind::Data
  Namespace& ns() const { return *ns_; }
  const std::shared_ptr<Namespace>& ns_ptr() const { return ns_; }
  const LoopState& loop() const { return *loop_; }
  const std::string& what() const { return what_; }  // for Undefined: the name that was missing

  bool is_string() const { return is_data() && json_->is_string(); }
  bool is_none() const { return is_data() && json_->is_null(); }
  bool is_bool() const { return is_data() && json_->is_boolean(); }
  bool is_int() const { return is_data() && json_->is_number_integer(); }  // no bool
  bool is_float() const { return is_data() && json_->is_number_float(); }
  bool is_number() const { return is_data() && (json_->is_number() || json_->is_boolean()); }
  bool is_list() const { return is_data() && json_->is_array(); }
  bool is_dict() const { return is_data() && json_->is_object(); }
  const std::string& str() const { return json_->get_ref<const std::string&>(); }

 private:
  Kind kind_ = Kind::Undefined;
  std::shared_ptr<const Json> owner_;
  const Json* json_ = nullptr;
  std::shared_ptr<Namespace> ns_;
  std::shared_ptr<const LoopState> loop_;
  std::string what_;
  Shape shape_ = Shape::Plain;
  bool tuple_items_ = false;
  std::shared_ptr<bool> generator_used_;
};

// Python's type name of a value, for messages ("str", "dict", "undefined", ...).
std::string type_name(const Value& v);

// Python's bool(value); Undefined is false.
bool truthy(const Value& v);

// Python's str(value) (what {{ }} prints) and repr(value). Undefined prints as "".
// Throws asynct::Error (without a position; the caller adds it) for namespace/loop objects.
std::string py_str(const Value& v);
std::string py_str(const Json& j);
std::string py_repr(const Json& j);
std::string py_float_repr(double d);

// Python's == and < (TypeError -> asynct::Error).
bool py_equal(const Value& a, const Value& b);
bool py_equal(const Json& a, const Json& b);
bool py_less(const Value& a, const Value& b);

// The integer or float value of a number (bool counts as 0/1, as in Python).
bool as_int(const Json& j, std::int64_t& out);
double as_double(const Json& j);

// json.dumps(value, ensure_ascii, indent, separators, sort_keys) as Python writes it.
struct DumpOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // None, or the string one level indents by
  std::optional<std::pair<std::string, std::string>> separators;
  bool sort_keys = false;
};
std::string py_json_dumps(const Json& j, const DumpOptions& options);

// UTF-8 <-> code points (Python strings index code points). Invalid UTF-8 throws.
std::u32string utf8_decode(const std::string& s);
std::string utf8_encode(const std::u32string& s);
void utf8_append(std::string& out, char32_t c);
// Python's str.isspace() for one code point.
bool py_isspace(char32_t c);

}  // namespace asynct::jinja
