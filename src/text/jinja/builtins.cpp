// Over 500 lines: every filter, test, string/dict method and global the chat templates use,
// each a few lines, beside the one dispatch that names them; the string helpers come first.
#include "text/jinja/builtins.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <optional>
#include <set>

#include "core/error.h"

namespace asynct::jinja {
namespace {

using Optional = std::optional<Value>;

[[noreturn]] void type_error(const std::string& message) { throw Error(message); }

std::string describe_undefined(const Value& v) {
  if (v.what().empty()) return "an undefined value";
  if (v.what()[0] == '[') return "the undefined value of " + v.what();  // an index out of range
  return "'" + v.what() + "' (undefined)";
}

void require_defined(const Value& v, const std::string& use) {
  if (v.is_undefined()) throw Error(describe_undefined(v) + " used in " + use);
}

// Binds positional and keyword arguments to named parameters, as Python does.
std::vector<Optional> bind(const Args& args, std::initializer_list<const char*> params, const std::string& what) {
  std::vector<Optional> out(params.size());
  std::vector<std::string> names(params.begin(), params.end());
  if (args.positional.size() > names.size())
    throw Error(detail::concat(what, " takes at most ", names.size(), " argument(s), got ", args.positional.size()));
  for (std::size_t i = 0; i < args.positional.size(); ++i) out[i] = args.positional[i];
  for (const auto& [key, value] : args.named) {
    std::size_t i = 0;
    while (i < names.size() && names[i] != key) ++i;
    if (i == names.size()) throw Error(what + " got an unexpected keyword argument '" + key + "'");
    if (out[i]) throw Error(what + " got multiple values for argument '" + key + "'");
    out[i] = value;
  }
  return out;
}

bool given(const Optional& o) { return o.has_value(); }

const std::string& string_arg(const Optional& o, const std::string& what) {
  if (!o || !o->is_string()) type_error(what + " must be a string, got " + (o ? type_name(*o) : std::string("nothing")));
  return o->str();
}

std::int64_t int_arg(const Value& v, const std::string& what) {
  std::int64_t i;
  if (!v.is_data() || !(v.json().is_number_integer() || v.json().is_boolean()) || !as_int(v.json(), i))
    type_error(what + " must be an integer, got " + type_name(v));
  return i;
}

Value str_value(std::string s) { return Value::of(Json(std::move(s))); }

// --- strings -------------------------------------------------------------------------------

bool caseless(char32_t c) {
  return (c >= 0x0590 && c < 0x0e80) || (c >= 0x2000 && c < 0x2100) || (c >= 0x2190 && c < 0x24b6) ||
         (c >= 0x2500 && c < 0x2c00) || (c >= 0x2e80 && c < 0xa640) || (c >= 0xac00 && c < 0xd7a4) ||
         (c >= 0xf900 && c < 0xfb00) || (c >= 0xfe30 && c < 0xff21) || (c >= 0xff5b && c < 0xfff0) ||
         (c >= 0x1f000 && c < 0x1fb00) || (c >= 0x20000 && c < 0x40000);
}

// ASCII case mapping; letters of other scripts would need Unicode's tables, so they are refused
// rather than left unchanged.
char32_t change_case(char32_t c, bool upper) {
  if (c < 0x80) return upper ? char32_t(std::toupper(int(c))) : char32_t(std::tolower(int(c)));
  if (caseless(c)) return c;
  char buf[16];
  std::snprintf(buf, sizeof buf, "U+%04X", unsigned(c));
  throw Error(std::string("changing the case of non-ASCII text is not supported (") + buf + ")");
}
bool is_ascii_letter(char32_t c) { return c < 0x80 && std::isalpha(int(c)); }

std::string to_case(const std::string& s, bool upper) {
  std::u32string t = utf8_decode(s);
  for (auto& c : t) c = change_case(c, upper);
  return utf8_encode(t);
}

std::string title(const std::string& s) {
  std::u32string t = utf8_decode(s);
  bool previous_cased = false;
  for (auto& c : t) {
    char32_t mapped = change_case(c, !previous_cased);
    previous_cased = is_ascii_letter(c);
    c = mapped;
  }
  return utf8_encode(t);
}

// jinja2's title filter (not str.title()): pieces between runs of whitespace and -({[<
// start upper-case and continue lower-case.
std::string title_filter(const std::string& s) {
  std::u32string t = utf8_decode(s);
  auto separator = [](char32_t c) { return py_isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<'; };
  bool start = true;
  for (auto& c : t) {
    if (separator(c)) {
      start = true;
      continue;
    }
    c = change_case(c, start);
    start = false;
  }
  return utf8_encode(t);
}

std::string capitalize(const std::string& s) {
  std::u32string t = utf8_decode(s);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = change_case(t[i], i == 0);
  return utf8_encode(t);
}

std::string strip(const std::string& s, const Optional& chars, bool left, bool right) {
  std::u32string t = utf8_decode(s);
  std::u32string set;
  bool whitespace = !chars || chars->is_none();
  if (!whitespace) set = utf8_decode(string_arg(chars, "strip()'s argument"));
  auto strip_it = [&](char32_t c) { return whitespace ? py_isspace(c) : set.find(c) != std::u32string::npos; };
  std::size_t b = 0, e = t.size();
  if (left)
    while (b < e && strip_it(t[b])) ++b;
  if (right)
    while (e > b && strip_it(t[e - 1])) --e;
  return utf8_encode(t.substr(b, e - b));
}

Json split(const std::string& s, const Optional& sep, const Optional& maxsplit_arg) {
  std::int64_t maxsplit = maxsplit_arg ? int_arg(*maxsplit_arg, "split()'s maxsplit") : -1;
  Json out = Json::array();
  if (!sep || sep->is_none()) {  // runs of whitespace, no empty strings
    std::u32string t = utf8_decode(s);
    std::size_t i = 0;
    while (true) {
      while (i < t.size() && py_isspace(t[i])) ++i;
      if (i == t.size()) break;
      if (maxsplit >= 0 && std::int64_t(out.size()) == maxsplit) {
        std::size_t e = t.size();
        while (e > i && py_isspace(t[e - 1])) --e;
        out.push_back(utf8_encode(t.substr(i, e - i)));
        break;
      }
      std::size_t j = i;
      while (j < t.size() && !py_isspace(t[j])) ++j;
      out.push_back(utf8_encode(t.substr(i, j - i)));
      i = j;
    }
    return out;
  }
  const std::string& d = string_arg(sep, "split()'s separator");
  if (d.empty()) throw Error("split(): empty separator");
  std::size_t start = 0;
  while (maxsplit < 0 || std::int64_t(out.size()) < maxsplit) {
    std::size_t at = s.find(d, start);
    if (at == std::string::npos) break;
    out.push_back(s.substr(start, at - start));
    start = at + d.size();
  }
  out.push_back(s.substr(start));
  return out;
}

std::string replace(const std::string& s, const std::string& old, const std::string& with, std::int64_t count) {
  std::string out;
  if (old.empty()) {  // Python inserts `with` around every character
    std::u32string t = utf8_decode(s);
    std::int64_t done = 0;
    for (std::size_t i = 0; i <= t.size(); ++i) {
      if (count < 0 || done < count) {
        out += with;
        ++done;
      }
      if (i < t.size()) utf8_append(out, t[i]);
    }
    return out;
  }
  std::size_t start = 0;
  std::int64_t done = 0;
  while (count < 0 || done < count) {
    std::size_t at = s.find(old, start);
    if (at == std::string::npos) break;
    out += s.substr(start, at - start) + with;
    start = at + old.size();
    ++done;
  }
  return out + s.substr(start);
}

// Index in code points of a byte offset (Python's str.find answers in characters).
std::int64_t char_index(const std::string& s, std::size_t byte) {
  std::int64_t n = 0;
  for (std::size_t i = 0; i < byte; ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xc0) != 0x80) ++n;
  return n;
}

bool affix_match(const std::string& s, const Value& affix, bool prefix, const std::string& what) {
  auto one = [&](const Value& v) {
    if (!v.is_string()) type_error(what + "'s argument must be a string or a list of strings, got " + type_name(v));
    const std::string& a = v.str();
    if (a.size() > s.size()) return false;
    return prefix ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0;
  };
  if (affix.is_list()) {
    for (const auto& item : affix.json())
      if (one(affix.child(item))) return true;
    return false;
  }
  return one(affix);
}

// --- data ----------------------------------------------------------------------------------

const std::set<std::string> kDictMethods = {"clear", "copy", "fromkeys", "get", "items", "keys",
                                            "pop", "popitem", "setdefault", "update", "values"};

Value attribute_path(const Value& v, const std::string& path) {
  Value cur = v;
  std::size_t start = 0;
  while (true) {
    std::size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    cur = numeric ? get_item(cur, Value::of(Json(std::stoll(part)))) : get_item(cur, str_value(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

Json to_json(const Value& v, const std::string& what) {
  if (v.is_data() && (v.shape() == Value::Shape::Plain || v.shape() == Value::Shape::Tuple)) return v.json();
  if (v.is_data()) throw Error("Object of type " + type_name(v) + " is not JSON serializable (in " + what + ")");
  if (v.is_undefined()) throw Error(describe_undefined(v) + " cannot be used in " + what);
  throw Error("a " + type_name(v) + " object cannot be used in " + what);
}

Json items_of(const Json& dict) {
  Json out = Json::array();
  for (const auto& [key, value] : dict.items()) out.push_back(Json::array({key, value}));
  return out;
}

Value select_or_reject(const Value& input, const Args& args, bool select, const std::string& name) {
  if (args.positional.empty() || !args.positional[0].is_string())
    throw Error(name + " needs an attribute name as its first argument");
  if (!args.named.empty()) throw Error(name + " takes no keyword arguments");
  std::string attribute = args.positional[0].str();
  std::string test;
  Args test_args;
  if (args.positional.size() > 1) {
    if (!args.positional[1].is_string()) throw Error(name + "'s test name must be a string");
    test = args.positional[1].str();
    test_args.positional.assign(args.positional.begin() + 2, args.positional.end());
  }
  Json out = Json::array();
  for (const Value& item : iterate(input)) {
    Value field = attribute_path(item, attribute);
    bool ok = test.empty() ? truthy(field) : apply_test(test, field, test_args);
    if (ok == select) out.push_back(item.json());
  }
  return Value::of(std::move(out)).with_shape(Value::Shape::Generator, input.tuple_items());
}

}  // namespace

// --- access --------------------------------------------------------------------------------

Value get_attribute(const Value& object, const std::string& name) {
  switch (object.kind()) {
    case Value::Kind::Undefined:
      throw Error(describe_undefined(object) + " has no attribute '" + name + "'");
    case Value::Kind::Namespace: {
      auto it = object.ns().attributes.find(name);
      return it == object.ns().attributes.end() ? Value::undefined(name) : it->second;
    }
    case Value::Kind::Loop: {
      const LoopState& l = object.loop();
      auto n = [](std::size_t x) { return Value::of(Json(std::int64_t(x))); };
      if (name == "index0") return n(l.index0);
      if (name == "index") return n(l.index0 + 1);
      if (name == "revindex") return n(l.length - l.index0);
      if (name == "revindex0") return n(l.length - l.index0 - 1);
      if (name == "first") return Value::of(Json(l.index0 == 0));
      if (name == "last") return Value::of(Json(l.index0 + 1 == l.length));
      if (name == "length") return n(l.length);
      if (name == "depth") return n(1);
      if (name == "depth0") return n(0);
      if (name == "previtem") return l.index0 > 0 ? (*l.items)[l.index0 - 1] : Value::undefined("loop.previtem");
      if (name == "nextitem") return l.index0 + 1 < l.length ? (*l.items)[l.index0 + 1] : Value::undefined("loop.nextitem");
      throw Error("unsupported: loop." + name);
    }
    case Value::Kind::Data: break;
  }
  const Json& j = object.json();
  if (j.is_object()) {
    // jinja2 tries Python's getattr first: `d.items` is the dict method, not d['items'].
    if (kDictMethods.count(name))
      throw Error("'." + name + "' on a mapping is the dict method in Jinja, which is not supported; call it, or write ['" + name + "'] for the key");
    auto it = j.find(name);
    return it == j.end() ? Value::undefined(name) : object.child(*it);
  }
  return Value::undefined(name);
}

Value get_item(const Value& object, const Value& key) {
  if (object.is_undefined()) throw Error(describe_undefined(object) + " cannot be subscripted");
  if (!object.is_data()) {
    if (key.is_string()) return get_attribute(object, key.str());
    throw Error("a " + type_name(object) + " object cannot be subscripted with " + type_name(key));
  }
  if (object.shape() != Value::Shape::Plain && object.shape() != Value::Shape::Tuple) return Value::undefined();
  const Json& j = object.json();
  if (j.is_object()) {
    if (!key.is_string()) return Value::undefined();
    auto it = j.find(key.str());
    return it == j.end() ? Value::undefined(key.str()) : object.child(*it);
  }
  if (j.is_array() || j.is_string()) {
    std::int64_t i;
    if (!key.is_data() || !(key.json().is_number_integer() || key.json().is_boolean()) || !as_int(key.json(), i))
      return Value::undefined();
    if (j.is_array()) {
      std::int64_t n = std::int64_t(j.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined("[" + std::to_string(i) + "] (out of range)");
      return object.child(j[std::size_t(i)]);
    }
    std::u32string t = utf8_decode(j.get_ref<const std::string&>());
    std::int64_t n = std::int64_t(t.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined("[" + std::to_string(i) + "] (out of range)");
    return str_value(utf8_encode(t.substr(std::size_t(i), 1)));
  }
  return Value::undefined();
}

Value get_slice(const Value& object, const Value& start_v, const Value& stop_v, const Value& step_v) {
  if (object.is_list() && object.shape() != Value::Shape::Plain && object.shape() != Value::Shape::Tuple)
    return Value::undefined();
  if (!object.is_list() && !object.is_string())
    throw Error("slicing a " + type_name(object) + " is not supported");
  auto bound = [](const Value& v, const char* what) -> std::optional<std::int64_t> {
    if (v.is_none()) return std::nullopt;
    return int_arg(v, std::string("a slice's ") + what);
  };
  std::int64_t step = bound(step_v, "step").value_or(1);
  if (step == 0) throw Error("slice step cannot be zero");
  std::u32string text;
  std::int64_t n;
  if (object.is_string()) {
    text = utf8_decode(object.str());
    n = std::int64_t(text.size());
  } else {
    n = std::int64_t(object.json().size());
  }
  // Python's PySlice_AdjustIndices.
  std::int64_t lower = step > 0 ? 0 : -1, upper = step > 0 ? n : n - 1;
  auto adjust = [&](std::optional<std::int64_t> b, std::int64_t dflt) {
    if (!b) return dflt;
    std::int64_t x = *b;
    if (x < 0) x = std::max(x + n, lower);
    return std::min(x, upper);
  };
  std::int64_t start = adjust(bound(start_v, "start"), step > 0 ? lower : upper);
  std::int64_t stop = adjust(bound(stop_v, "stop"), step > 0 ? upper : lower);
  if (object.is_string()) {
    std::u32string out;
    for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out += text[std::size_t(i)];
    return str_value(utf8_encode(out));
  }
  Json out = Json::array();
  for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(object.json()[std::size_t(i)]);
  return Value::of(std::move(out)).with_shape(object.shape(), object.tuple_items());
}

std::vector<Value> iterate(const Value& v) {
  std::vector<Value> out;
  if (v.is_undefined()) return out;
  if (v.is_generator() && v.use_generator())
    throw Error("unsupported: using a generator (from selectattr, rejectattr, map, items or reverse) twice; Python's would be empty the second time");
  if (v.is_list()) {
    for (const auto& item : v.json()) out.push_back(v.child(item));
    return out;
  }
  if (v.is_dict()) {
    for (const auto& [key, item] : v.json().items()) out.push_back(str_value(key));
    return out;
  }
  if (v.is_string()) {
    for (char32_t c : utf8_decode(v.str())) {
      std::string s;
      utf8_append(s, c);
      out.push_back(str_value(std::move(s)));
    }
    return out;
  }
  throw Error("'" + type_name(v) + "' object is not iterable");
}

bool contains(const Value& container, const Value& item) {
  if (container.is_undefined()) return false;
  if (container.is_string()) {
    if (!item.is_string()) throw Error("'in <string>' needs a string on the left, got " + type_name(item));
    return container.str().find(item.str()) != std::string::npos;
  }
  if (container.is_list()) {
    if (container.is_generator() && container.use_generator())
      throw Error("unsupported: using a generator (from selectattr, rejectattr, map, items or reverse) twice");
    for (const auto& x : container.json())
      if (py_equal(item, container.child(x))) return true;
    return false;
  }
  if (container.is_dict()) {
    if (item.is_list() || item.is_dict()) throw Error("unhashable type: '" + type_name(item) + "'");
    return item.is_string() && container.json().contains(item.str());
  }
  throw Error("argument of type '" + type_name(container) + "' is not iterable");
}

// --- operators -----------------------------------------------------------------------------

namespace {

Value int_value(std::int64_t i) { return Value::of(Json(i)); }
Value float_value(double d) { return Value::of(Json(d)); }

bool both_int(const Value& a, const Value& b, std::int64_t& x, std::int64_t& y) {
  return a.is_data() && b.is_data() && (a.json().is_number_integer() || a.is_bool()) &&
         (b.json().is_number_integer() || b.is_bool()) && as_int(a.json(), x) && as_int(b.json(), y);
}

[[noreturn]] void overflow() { throw Error("integer overflow (asynct's templates compute with int64)"); }
std::int64_t add(std::int64_t x, std::int64_t y) {
  std::int64_t r;
  if (__builtin_add_overflow(x, y, &r)) overflow();
  return r;
}
std::int64_t sub(std::int64_t x, std::int64_t y) {
  std::int64_t r;
  if (__builtin_sub_overflow(x, y, &r)) overflow();
  return r;
}
std::int64_t mul(std::int64_t x, std::int64_t y) {
  std::int64_t r;
  if (__builtin_mul_overflow(x, y, &r)) overflow();
  return r;
}

Value repeat(const Value& seq, std::int64_t times) {
  if (seq.is_string()) {
    std::string out;
    for (std::int64_t i = 0; i < times; ++i) out += seq.str();
    return str_value(std::move(out));
  }
  if (seq.shape() != Value::Shape::Plain && seq.shape() != Value::Shape::Tuple)
    throw Error("unsupported operand types for *: '" + type_name(seq) + "' and 'int'");
  Json out = Json::array();
  for (std::int64_t i = 0; i < times; ++i)
    for (const auto& x : seq.json()) out.push_back(x);
  return Value::of(std::move(out)).with_shape(seq.shape(), seq.tuple_items());
}

}  // namespace

Value binary_operation(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") return str_value(py_str(a) + py_str(b));
  require_defined(a, "'" + op + "'");
  require_defined(b, "'" + op + "'");
  auto unsupported = [&]() -> Value {
    throw Error("unsupported operand types for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
  };
  if (!a.is_data() || !b.is_data()) return unsupported();
  std::int64_t x, y;
  bool ints = both_int(a, b, x, y);
  bool nums = a.is_number() && b.is_number();
  if (op == "+") {
    if (ints) return int_value(add(x, y));
    if (nums) return float_value(as_double(a.json()) + as_double(b.json()));
    if (a.is_string() && b.is_string()) return str_value(a.str() + b.str());
    if (a.is_list() && b.is_list() && a.shape() == b.shape() &&
        (a.shape() == Value::Shape::Plain || a.shape() == Value::Shape::Tuple)) {
      Json out = a.json();
      for (const auto& item : b.json()) out.push_back(item);
      return Value::of(std::move(out)).with_shape(a.shape(), a.tuple_items() && b.tuple_items());
    }
    return unsupported();
  }
  if (op == "-") {
    if (ints) return int_value(sub(x, y));
    if (nums) return float_value(as_double(a.json()) - as_double(b.json()));
    return unsupported();
  }
  if (op == "*") {
    if (ints) return int_value(mul(x, y));
    if (nums) return float_value(as_double(a.json()) * as_double(b.json()));
    std::int64_t times;
    if ((a.is_string() || a.is_list()) && (b.json().is_number_integer() || b.is_bool()) && as_int(b.json(), times))
      return repeat(a, times);
    if ((b.is_string() || b.is_list()) && (a.json().is_number_integer() || a.is_bool()) && as_int(a.json(), times))
      return repeat(b, times);
    return unsupported();
  }
  if (op == "%" && a.is_string()) throw Error("unsupported: printf-style string formatting with %");
  if (!nums) return unsupported();
  double p = as_double(a.json()), q = as_double(b.json());
  if (op == "/") {
    if (q == 0) throw Error("division by zero");
    return float_value(p / q);
  }
  if (op == "//" || op == "%") {
    if (q == 0) throw Error(op == "//" ? "integer division by zero" : "modulo by zero");
    if (ints) {
      if (x == INT64_MIN && y == -1) throw Error("integer overflow (asynct's templates compute with int64)");
      std::int64_t d = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --d;
        m += y;
      }
      return int_value(op == "//" ? d : m);
    }
    // Python's float_floor_div / float_rem.
    double mod = std::fmod(p, q);
    double div = (p - mod) / q;
    if (mod != 0) {
      if ((q < 0) != (mod < 0)) {
        mod += q;
        div -= 1.0;
      }
    } else {
      mod = std::copysign(0.0, q);
    }
    if (op == "%") return float_value(mod);
    double floordiv;
    if (div != 0) {
      floordiv = std::floor(div);
      if (div - floordiv > 0.5) floordiv += 1.0;
    } else {
      floordiv = std::copysign(0.0, p / q);
    }
    return float_value(floordiv);
  }
  if (op == "**") {
    if (ints && y >= 0) {
      std::int64_t result = 1, base = x;
      for (std::int64_t e = y; e > 0; e >>= 1) {  // squaring: the base only grows while bits remain
        if (e & 1) result = mul(result, base);
        if (e > 1) base = mul(base, base);
      }
      return int_value(result);
    }
    if (p == 0 && q < 0) throw Error("0.0 cannot be raised to a negative power");
    return float_value(std::pow(p, q));
  }
  throw Error("unsupported operator '" + op + "'");
}

Value unary_operation(const std::string& op, const Value& a) {
  require_defined(a, "unary '" + op + "'");
  if (!a.is_number()) throw Error("bad operand type for unary " + op + ": '" + type_name(a) + "'");
  std::int64_t x;
  if (as_int(a.json(), x)) {
    if (op == "+") return int_value(x);
    if (x == INT64_MIN) throw Error("integer overflow (asynct's templates compute with int64)");
    return int_value(-x);
  }
  double d = a.json().get<double>();
  return float_value(op == "-" ? -d : d);
}

// --- filters -------------------------------------------------------------------------------

Value apply_filter(const std::string& name, const Value& input, const Args& args) {
  const std::string what = "filter '" + name + "'";
  if (name == "length" || name == "count") {
    bind(args, {}, what);
    if (input.is_undefined()) return int_value(0);
    if (input.is_generator()) throw Error("object of type 'generator' has no len(); add |list before |" + name);
    if (input.is_string()) return int_value(std::int64_t(utf8_decode(input.str()).size()));
    if (input.is_list() || input.is_dict()) return int_value(std::int64_t(input.json().size()));
    throw Error("object of type '" + type_name(input) + "' has no len()");
  }
  if (name == "tojson") {
    auto a = bind(args, {"ensure_ascii", "indent", "separators", "sort_keys"}, what);
    DumpOptions o;
    if (given(a[0])) o.ensure_ascii = truthy(*a[0]);
    if (given(a[1]) && !a[1]->is_none()) {
      if (a[1]->is_string()) o.indent = a[1]->str();
      else o.indent = std::string(std::size_t(std::max<std::int64_t>(0, int_arg(*a[1], "tojson's indent"))), ' ');
    }
    if (given(a[2]) && !a[2]->is_none()) {
      if (!a[2]->is_list() || a[2]->json().size() != 2 || !a[2]->json()[0].is_string() || !a[2]->json()[1].is_string())
        throw Error("tojson's separators must be a pair of strings");
      o.separators = {a[2]->json()[0].get<std::string>(), a[2]->json()[1].get<std::string>()};
    }
    if (given(a[3])) o.sort_keys = truthy(*a[3]);
    return str_value(py_json_dumps(to_json(input, "tojson"), o));
  }
  if (name == "string") return bind(args, {}, what), str_value(py_str(input));
  if (name == "safe") return bind(args, {}, what), str_value(py_str(input));
  if (name == "trim") {
    auto a = bind(args, {"chars"}, what);
    return str_value(strip(py_str(input), a[0], true, true));
  }
  if (name == "lower" || name == "upper") return bind(args, {}, what), str_value(to_case(py_str(input), name == "upper"));
  if (name == "title") return bind(args, {}, what), str_value(title_filter(py_str(input)));
  if (name == "capitalize") return bind(args, {}, what), str_value(capitalize(py_str(input)));
  if (name == "default" || name == "d") {
    auto a = bind(args, {"default_value", "boolean"}, what);
    bool boolean = given(a[1]) && truthy(*a[1]);
    if (input.is_undefined() || (boolean && !truthy(input))) return given(a[0]) ? *a[0] : str_value("");
    return input;
  }
  if (name == "join") {
    auto a = bind(args, {"d", "attribute"}, what);
    std::string sep = given(a[0]) ? py_str(*a[0]) : "";
    std::string out;
    bool first = true;
    for (const Value& item : iterate(input)) {
      if (!first) out += sep;
      first = false;
      out += py_str(given(a[1]) && !a[1]->is_none() ? attribute_path(item, py_str(*a[1])) : item);
    }
    return str_value(std::move(out));
  }
  if (name == "first" || name == "last") {
    bind(args, {}, what);
    if (name == "last" && input.is_generator()) throw Error("'generator' object is not reversible; add |list before |last");
    std::vector<Value> items = iterate(input);
    if (items.empty()) return Value::undefined("no " + name + " item");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "items") {
    bind(args, {}, what);
    if (input.is_undefined()) return Value::of(Json::array());
    if (!input.is_dict()) throw Error("filter 'items' needs a mapping, got " + type_name(input));
    return Value::of(items_of(input.json())).with_shape(Value::Shape::Generator, true);
  }
  if (name == "list" || name == "reverse") {
    bind(args, {}, what);
    if (name == "reverse" && input.is_string()) {
      std::u32string t = utf8_decode(input.str());
      return str_value(utf8_encode(std::u32string(t.rbegin(), t.rend())));
    }
    Json out = Json::array();
    for (const Value& item : iterate(input)) out.push_back(to_json(item, what));
    if (name == "reverse") std::reverse(out.begin(), out.end());
    bool tuples = input.is_list() && input.tuple_items();
    return Value::of(std::move(out)).with_shape(name == "reverse" ? Value::Shape::Generator : Value::Shape::Plain, tuples);
  }
  if (name == "selectattr" || name == "rejectattr") return select_or_reject(input, args, name == "selectattr", what);
  if (name == "map") {
    Json out = Json::array();
    if (args.positional.empty()) {
      auto a = bind(args, {"attribute", "default"}, what);
      if (!given(a[0])) throw Error("filter 'map' needs a filter name or attribute=");
      for (const Value& item : iterate(input)) {
        Value v = attribute_path(item, py_str(*a[0]));
        if (v.is_undefined() && given(a[1])) v = *a[1];
        out.push_back(to_json(v, what));
      }
    } else {
      if (!args.positional[0].is_string()) throw Error("filter 'map' needs a filter name");
      Args rest{{args.positional.begin() + 1, args.positional.end()}, args.named};
      for (const Value& item : iterate(input)) out.push_back(to_json(apply_filter(args.positional[0].str(), item, rest), what));
    }
    return Value::of(std::move(out)).with_shape(Value::Shape::Generator, false);
  }
  if (name == "replace") {
    auto a = bind(args, {"old", "new", "count"}, what);
    std::int64_t count = given(a[2]) && !a[2]->is_none() ? int_arg(*a[2], "replace's count") : -1;
    return str_value(replace(py_str(input), py_str(a[0].value_or(str_value(""))), py_str(a[1].value_or(str_value(""))), count));
  }
  if (name == "int") {
    auto a = bind(args, {"default", "base"}, what);
    Value dflt = given(a[0]) ? *a[0] : int_value(0);
    if (given(a[1])) throw Error("filter 'int': base= is not supported");
    if (input.is_data() && (input.json().is_number() || input.is_bool())) {
      std::int64_t i;
      if (as_int(input.json(), i)) return int_value(i);
      double d = input.json().get<double>();
      if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return dflt;
      return int_value(std::int64_t(std::trunc(d)));
    }
    if (input.is_string()) {
      std::string s = strip(input.str(), std::nullopt, true, true);
      s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
      try {
        std::size_t used;
        std::int64_t i = std::stoll(s, &used);
        if (used == s.size()) return int_value(i);
        double d = std::stod(s, &used);
        if (used == s.size() && std::isfinite(d)) return int_value(std::int64_t(std::trunc(d)));
      } catch (const std::exception&) {
      }
    }
    return dflt;
  }
  if (name == "float") {
    auto a = bind(args, {"default"}, what);
    Value dflt = given(a[0]) ? *a[0] : float_value(0.0);
    if (input.is_number()) return float_value(as_double(input.json()));
    if (input.is_string()) {
      try {
        std::string s = strip(input.str(), std::nullopt, true, true);
        std::size_t used;
        double d = std::stod(s, &used);
        if (used == s.size()) return float_value(d);
      } catch (const std::exception&) {
      }
    }
    return dflt;
  }
  if (name == "abs") {
    bind(args, {}, what);
    if (!input.is_number()) throw Error("bad operand type for abs(): '" + type_name(input) + "'");
    std::int64_t i;
    if (as_int(input.json(), i)) return int_value(i < 0 ? sub(0, i) : i);
    return float_value(std::fabs(input.json().get<double>()));
  }
  throw Error("unsupported filter '" + name + "'");
}

// --- tests ---------------------------------------------------------------------------------

bool apply_test(const std::string& name, const Value& v, const Args& args) {
  const std::string what = "test '" + name + "'";
  auto one = [&]() -> const Value& {
    if (args.positional.size() != 1 || !args.named.empty()) throw Error(what + " takes one argument");
    return args.positional[0];
  };
  auto none = [&]() {
    if (!args.positional.empty() || !args.named.empty()) throw Error(what + " takes no arguments");
  };
  if (name == "defined") return none(), !v.is_undefined();
  if (name == "undefined") return none(), v.is_undefined();
  if (name == "none") return none(), v.is_none();
  if (name == "string") return none(), v.is_string();
  if (name == "mapping") return none(), v.is_dict();
  if (name == "number") return none(), v.is_number();
  if (name == "integer") return none(), v.is_int();
  if (name == "float") return none(), v.is_float();
  if (name == "boolean") return none(), v.is_bool();
  if (name == "true") return none(), v.is_bool() && v.json().get<bool>();
  if (name == "false") return none(), v.is_bool() && !v.json().get<bool>();
  // Undefined counts as iterable (it iterates as empty) and, by jinja2's check, a sequence.
  if (name == "iterable")
    return none(), v.is_undefined() || v.kind() == Value::Kind::Loop || v.is_string() || v.is_list() || v.is_dict();
  if (name == "sequence")
    return none(), v.is_undefined() || v.is_string() || v.is_dict() ||
                       (v.is_list() && (v.shape() == Value::Shape::Plain || v.shape() == Value::Shape::Tuple));
  if (name == "eq" || name == "equalto" || name == "==") return py_equal(v, one());
  if (name == "ne" || name == "!=") return !py_equal(v, one());
  if (name == "lt" || name == "lessthan" || name == "<") return py_less(v, one());
  if (name == "gt" || name == "greaterthan" || name == ">") return py_less(one(), v);
  if (name == "le" || name == "<=") return !py_less(one(), v);
  if (name == "ge" || name == ">=") return !py_less(v, one());
  if (name == "in") return contains(one(), v);
  if (name == "odd" || name == "even") {
    none();
    std::int64_t i = int_arg(v, what + "'s value");
    return (i % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    std::int64_t i = int_arg(v, what + "'s value"), d = int_arg(one(), what + "'s argument");
    if (d == 0) throw Error("modulo by zero");
    return i % d == 0;
  }
  if (name == "sameas") {
    const Value& other = one();
    if (!(other.is_none() || other.is_bool()) && !(v.is_none() || v.is_bool()))
      throw Error("unsupported: 'sameas' except against none, true or false");
    return v.is_data() && other.is_data() && v.json().type() == other.json().type() && v.json() == other.json();
  }
  throw Error("unsupported test '" + name + "'");
}

// --- methods and globals -------------------------------------------------------------------

Value call_method(const Value& object, const std::string& name, const Args& args) {
  const std::string what = type_name(object) + "." + name + "()";
  if (object.is_undefined()) throw Error(describe_undefined(object) + " has no method '" + name + "'");
  if (object.is_string()) {
    const std::string& s = object.str();
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      auto a = bind(args, {"chars"}, what);
      return str_value(strip(s, a[0], name != "rstrip", name != "lstrip"));
    }
    if (name == "split") {
      auto a = bind(args, {"sep", "maxsplit"}, what);
      return Value::of(split(s, a[0], a[1]));
    }
    if (name == "startswith" || name == "endswith") {
      auto a = bind(args, {"prefix"}, what);
      if (!given(a[0])) throw Error(what + " needs an argument");
      return Value::of(Json(affix_match(s, *a[0], name == "startswith", what)));
    }
    if (name == "replace") {
      auto a = bind(args, {"old", "new", "count"}, what);
      std::int64_t count = given(a[2]) ? int_arg(*a[2], what + "'s count") : -1;
      return str_value(replace(s, string_arg(a[0], what + "'s old"), string_arg(a[1], what + "'s new"), count));
    }
    if (name == "lower" || name == "upper") return bind(args, {}, what), str_value(to_case(s, name == "upper"));
    if (name == "title") return bind(args, {}, what), str_value(title(s));
    if (name == "capitalize") return bind(args, {}, what), str_value(capitalize(s));
    if (name == "find" || name == "rfind" || name == "count") {
      auto a = bind(args, {"sub"}, what);
      const std::string& sub = string_arg(a[0], what + "'s argument");
      if (name == "count") {
        if (sub.empty()) return int_value(std::int64_t(utf8_decode(s).size()) + 1);
        std::int64_t n = 0;
        for (std::size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
        return int_value(n);
      }
      std::size_t at = name == "find" ? s.find(sub) : s.rfind(sub);
      return int_value(at == std::string::npos ? -1 : char_index(s, at));
    }
    if (name == "join") {
      auto a = bind(args, {"iterable"}, what);
      std::string out;
      bool first = true;
      for (const Value& item : iterate(a[0].value_or(Value()))) {
        if (!item.is_string()) throw Error(what + ": sequence item is a " + type_name(item) + ", not a str");
        if (!first) out += s;
        first = false;
        out += item.str();
      }
      return str_value(std::move(out));
    }
    throw Error("unsupported string method '" + name + "'");
  }
  if (object.is_dict()) {
    const Json& d = object.json();
    if (name == "items") return bind(args, {}, what), Value::of(items_of(d)).with_shape(Value::Shape::DictItems, true);
    if (name == "keys" || name == "values") {
      bind(args, {}, what);
      Json out = Json::array();
      for (const auto& [key, item] : d.items()) out.push_back(name == "keys" ? Json(key) : item);
      return Value::of(std::move(out)).with_shape(name == "keys" ? Value::Shape::DictKeys : Value::Shape::DictValues, false);
    }
    if (name == "get") {
      auto a = bind(args, {"key", "default"}, what);
      if (!given(a[0])) throw Error(what + " needs a key");
      Value found = a[0]->is_string() ? get_item(object, *a[0]) : Value::undefined();
      if (!found.is_undefined()) return found;
      return given(a[1]) ? *a[1] : Value::of(Json(nullptr));
    }
    throw Error("unsupported dict method '" + name + "'");
  }
  if (object.kind() == Value::Kind::Loop) throw Error("unsupported: loop." + name + "()");
  throw Error("unsupported method '" + name + "' on a " + type_name(object));
}

Value call_global(const std::string& name, const Args& args) {
  if (name == "raise_exception") {
    auto a = bind(args, {"message"}, name);
    throw Error("raise_exception: " + py_str(a[0].value_or(Value())));
  }
  if (name == "namespace" || name == "dict") {
    if (args.positional.size() > 1) throw Error(name + "() takes at most one positional argument");
    auto ns = std::make_shared<Namespace>();
    Json dict = Json::object();
    auto put = [&](const std::string& key, const Value& value) {
      if (name == "dict") dict[key] = to_json(value, "dict()");
      else ns->attributes[key] = value;
    };
    if (!args.positional.empty()) {
      if (!args.positional[0].is_dict()) throw Error(name + "()'s positional argument must be a mapping");
      for (const auto& [key, item] : args.positional[0].json().items()) put(key, args.positional[0].child(item));
    }
    for (const auto& [key, value] : args.named) put(key, value);
    return name == "dict" ? Value::of(std::move(dict)) : Value::of_namespace(ns);
  }
  if (name == "range") {
    if (!args.named.empty() || args.positional.empty() || args.positional.size() > 3)
      throw Error("range() takes 1 to 3 positional arguments");
    std::int64_t start = 0, stop, step = 1;
    if (args.positional.size() == 1) {
      stop = int_arg(args.positional[0], "range()'s argument");
    } else {
      start = int_arg(args.positional[0], "range()'s start");
      stop = int_arg(args.positional[1], "range()'s stop");
      if (args.positional.size() == 3) step = int_arg(args.positional[2], "range()'s step");
    }
    if (step == 0) throw Error("range() step must not be zero");
    Json out = Json::array();
    for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (out.size() >= 100000) throw Error("range() of more than 100000 items");
      out.push_back(i);
    }
    return Value::of(std::move(out));
  }
  if (name == "strftime_now") {
    auto a = bind(args, {"format"}, name);
    std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buf[512];
    std::size_t n = std::strftime(buf, sizeof buf, string_arg(a[0], "strftime_now's format").c_str(), &local);
    return str_value(std::string(buf, n));
  }
  throw Error("unsupported function '" + name + "()'");
}

}  // namespace asynct::jinja
