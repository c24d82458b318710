#include "text/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "text/utf8.h"

namespace asynct::jinja {

std::string type_name(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return "undefined";
    case Value::Kind::Namespace: return "namespace";
    case Value::Kind::Loop: return "loop";
    case Value::Kind::Data: break;
  }
  switch (v.shape()) {
    case Value::Shape::Tuple: return "tuple";
    case Value::Shape::Generator: return "generator";
    case Value::Shape::DictItems: return "dict_items";
    case Value::Shape::DictKeys: return "dict_keys";
    case Value::Shape::DictValues: return "dict_values";
    case Value::Shape::Plain: break;
  }
  const Json& j = v.json();
  if (j.is_null()) return "NoneType";
  if (j.is_boolean()) return "bool";
  if (j.is_number_integer()) return "int";
  if (j.is_number_float()) return "float";
  if (j.is_string()) return "str";
  if (j.is_array()) return "list";
  return "dict";
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return false;
    case Value::Kind::Namespace:
    case Value::Kind::Loop: return true;
    case Value::Kind::Data: break;
  }
  if (v.is_generator()) return true;  // a generator object is true even when it yields nothing
  const Json& j = v.json();
  if (j.is_null()) return false;
  if (j.is_boolean()) return j.get<bool>();
  if (j.is_number_float()) return j.get<double>() != 0.0;
  if (j.is_number()) return as_double(j) != 0.0;
  if (j.is_string()) return !j.get_ref<const std::string&>().empty();
  return !j.empty();
}

bool as_int(const Json& j, std::int64_t& out) {
  if (j.is_boolean()) {
    out = j.get<bool>() ? 1 : 0;
    return true;
  }
  if (j.is_number_unsigned()) {
    auto u = j.get<std::uint64_t>();
    check(u <= std::uint64_t(INT64_MAX), "integer ", u, " is larger than asynct's templates handle (int64)");
    out = std::int64_t(u);
    return true;
  }
  if (j.is_number_integer()) {
    out = j.get<std::int64_t>();
    return true;
  }
  return false;
}

double as_double(const Json& j) {
  if (j.is_boolean()) return j.get<bool>() ? 1.0 : 0.0;
  if (j.is_number_unsigned()) return double(j.get<std::uint64_t>());
  if (j.is_number_integer()) return double(j.get<std::int64_t>());
  return j.get<double>();
}

// Python's repr(float): the shortest digits that round-trip, fixed notation for exponents
// -4..15, else d.ddde+XX.
std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  auto e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  int exponent = std::stoi(sci.substr(e + 1));
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out += "0." + std::string(std::size_t(-exponent - 1), '0') + digits;
    } else if (std::size_t(exponent) + 1 >= digits.size()) {
      out += digits + std::string(std::size_t(exponent) + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, std::size_t(exponent) + 1) + "." + digits.substr(std::size_t(exponent) + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp_buf[16];
  std::snprintf(exp_buf, sizeof exp_buf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + exp_buf;
}

namespace {

std::string int_str(const Json& j) {
  if (j.is_number_unsigned()) return std::to_string(j.get<std::uint64_t>());
  return std::to_string(j.get<std::int64_t>());
}

// Python's str.isprintable() for the code points repr() keeps as they are; the rest are escaped.
bool py_printable(char32_t c) {
  if (c < 0x20 || c == 0x7f) return false;
  if (c >= 0x80 && c <= 0xa0) return false;  // C1 controls and NBSP (category Zs)
  if (c == 0xad) return false;                // soft hyphen (Cf)
  if (c >= 0x2000 && c <= 0x200f) return false;  // spaces (Zs) and format characters
  if (c >= 0x2028 && c <= 0x202f) return false;
  if (c >= 0x205f && c <= 0x206f) return false;
  if (c == 0x3000 || c == 0xfeff || c == 0x1680) return false;
  if (c >= 0xd800 && c <= 0xdfff) return false;
  if (c >= 0xe000 && c <= 0xf8ff) return false;  // private use
  return true;
}

std::string py_str_repr(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : utf8_decode(s)) {
    if (c == char32_t(quote) || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (!py_printable(c)) {
      char buf[16];
      if (c < 0x100) std::snprintf(buf, sizeof buf, "\\x%02x", unsigned(c));
      else if (c < 0x10000) std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(c));
      else std::snprintf(buf, sizeof buf, "\\U%08x", unsigned(c));
      out += buf;
    } else {
      utf8_append(out, c);
    }
  }
  out += quote;
  return out;
}

}  // namespace

std::string py_repr(const Json& j) {
  if (j.is_string()) return py_str_repr(j.get_ref<const std::string&>());
  if (j.is_array()) {
    std::string out = "[";
    bool first = true;
    for (const auto& item : j) {
      if (!first) out += ", ";
      first = false;
      out += py_repr(item);
    }
    return out + "]";
  }
  if (j.is_object()) {
    std::string out = "{";
    bool first = true;
    for (const auto& [key, item] : j.items()) {
      if (!first) out += ", ";
      first = false;
      out += py_str_repr(key) + ": " + py_repr(item);
    }
    return out + "}";
  }
  return py_str(j);
}

std::string py_str(const Json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_null()) return "None";
  if (j.is_boolean()) return j.get<bool>() ? "True" : "False";
  if (j.is_number_float()) return py_float_repr(j.get<double>());
  if (j.is_number()) return int_str(j);
  return py_repr(j);
}

namespace {
std::string sequence_repr(const Json& list, bool tuple_items, bool as_tuple) {
  std::string out = as_tuple ? "(" : "[";
  bool first = true;
  for (const auto& item : list) {
    if (!first) out += ", ";
    first = false;
    out += tuple_items && item.is_array() ? sequence_repr(item, false, true) : py_repr(item);
  }
  if (as_tuple && list.size() == 1) out += ",";
  return out + (as_tuple ? ")" : "]");
}
}  // namespace

std::string py_str(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return "";
    case Value::Kind::Data:
      switch (v.shape()) {
        case Value::Shape::Plain:
          return v.tuple_items() && v.json().is_array() ? sequence_repr(v.json(), true, false) : py_str(v.json());
        case Value::Shape::Tuple: return sequence_repr(v.json(), v.tuple_items(), true);
        case Value::Shape::Generator:
          throw Error("printing a generator (what selectattr, rejectattr, map, items and reverse return) is not supported; add |list");
        case Value::Shape::DictItems: return "dict_items(" + sequence_repr(v.json(), true, false) + ")";
        case Value::Shape::DictKeys: return "dict_keys(" + sequence_repr(v.json(), false, false) + ")";
        case Value::Shape::DictValues: return "dict_values(" + sequence_repr(v.json(), false, false) + ")";
      }
      return "";
    case Value::Kind::Namespace: throw Error("printing a namespace() object is not supported");
    case Value::Kind::Loop: throw Error("printing the loop object is not supported");
  }
  return "";
}

bool py_equal(const Json& a, const Json& b) {
  bool a_num = a.is_number() || a.is_boolean(), b_num = b.is_number() || b.is_boolean();
  if (a_num && b_num) {
    std::int64_t x, y;
    if (as_int(a, x) && as_int(b, y)) return x == y;
    return as_double(a) == as_double(b);
  }
  if (a.type() != b.type()) return false;
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
      if (!py_equal(a[i], b[i])) return false;
    return true;
  }
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (const auto& [key, item] : a.items()) {
      auto it = b.find(key);
      if (it == b.end() || !py_equal(item, *it)) return false;
    }
    return true;
  }
  return a == b;
}

bool py_equal(const Value& a, const Value& b) {
  if (a.is_undefined() || b.is_undefined()) return a.is_undefined() && b.is_undefined();
  if (a.kind() == Value::Kind::Namespace || b.kind() == Value::Kind::Namespace)
    return a.kind() == b.kind() && a.ns_ptr() == b.ns_ptr();
  if (a.kind() == Value::Kind::Loop || b.kind() == Value::Kind::Loop) return false;
  if (a.json().is_array() && b.json().is_array()) {
    // A tuple never equals a list; generators and views compare by identity in Python.
    using S = Value::Shape;
    if (a.shape() != b.shape() || (a.shape() != S::Plain && a.shape() != S::Tuple))
      return a.shape() == b.shape() && a.shape() != S::Generator && &a.json() == &b.json();
  }
  return py_equal(a.json(), b.json());
}

namespace {
bool json_less(const Json& a, const Json& b) {
  bool a_num = a.is_number() || a.is_boolean(), b_num = b.is_number() || b.is_boolean();
  if (a_num && b_num) {
    std::int64_t x, y;
    if (as_int(a, x) && as_int(b, y)) return x < y;
    return as_double(a) < as_double(b);
  }
  // UTF-8 byte order is code point order, which is how Python orders str.
  if (a.is_string() && b.is_string()) return a.get_ref<const std::string&>() < b.get_ref<const std::string&>();
  if (a.is_array() && b.is_array()) {
    for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
      if (!py_equal(a[i], b[i])) return json_less(a[i], b[i]);
    }
    return a.size() < b.size();
  }
  throw Error(detail::concat("'<' is not supported between ", type_name(Value::of(a)), " and ", type_name(Value::of(b))));
}
}  // namespace

bool py_less(const Value& a, const Value& b) {
  if (!a.is_data() || !b.is_data())
    throw Error(detail::concat("'<' is not supported between ", type_name(a), " and ", type_name(b)));
  return json_less(a.json(), b.json());
}

namespace {

void dump_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (char32_t c : utf8_decode(s)) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default: {
        char buf[16];
        if (c < 0x20 || (ensure_ascii && c >= 0x7f)) {
          if (c >= 0x10000) {
            char32_t v = c - 0x10000;
            std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", unsigned(0xd800 + (v >> 10)), unsigned(0xdc00 + (v & 0x3ff)));
          } else {
            std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(c));
          }
          out += buf;
        } else {
          utf8_append(out, c);
        }
      }
    }
  }
  out += '"';
}

void dump(std::string& out, const Json& j, const DumpOptions& o, const std::string& item_sep,
          const std::string& key_sep, int depth) {
  auto newline = [&](int level) {
    out += '\n';
    for (int i = 0; i < level; ++i) out += *o.indent;
  };
  if (j.is_string()) {
    dump_string(out, j.get_ref<const std::string&>(), o.ensure_ascii);
  } else if (j.is_null()) {
    out += "null";
  } else if (j.is_boolean()) {
    out += j.get<bool>() ? "true" : "false";
  } else if (j.is_number_float()) {
    double d = j.get<double>();
    out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : py_float_repr(d);
  } else if (j.is_number()) {
    out += int_str(j);
  } else if (j.is_array()) {
    if (j.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    bool first = true;
    for (const auto& item : j) {
      if (!first) out += item_sep;
      first = false;
      if (o.indent) newline(depth + 1);
      dump(out, item, o, item_sep, key_sep, depth + 1);
    }
    if (o.indent) newline(depth);
    out += ']';
  } else {
    if (j.empty()) {
      out += "{}";
      return;
    }
    std::vector<std::pair<const std::string*, const Json*>> members;
    for (const auto& [key, item] : j.items()) members.emplace_back(&key, &item);
    if (o.sort_keys)
      std::stable_sort(members.begin(), members.end(), [](const auto& x, const auto& y) { return *x.first < *y.first; });
    out += '{';
    bool first = true;
    for (const auto& [key, item] : members) {
      if (!first) out += item_sep;
      first = false;
      if (o.indent) newline(depth + 1);
      dump_string(out, *key, o.ensure_ascii);
      out += key_sep;
      dump(out, *item, o, item_sep, key_sep, depth + 1);
    }
    if (o.indent) newline(depth);
    out += '}';
  }
}

}  // namespace

std::string py_json_dumps(const Json& j, const DumpOptions& options) {
  // Python's defaults: (', ', ': '), and (',', ': ') when indenting.
  std::string item_sep = options.indent ? "," : ", ", key_sep = ": ";
  if (options.separators) std::tie(item_sep, key_sep) = *options.separators;
  std::string out;
  dump(out, j, options, item_sep, key_sep, 0);
  return out;
}

std::u32string utf8_decode(const std::string& s) {
  const auto bad = text::find_invalid_utf8(s);
  check(!bad, "invalid UTF-8 in template text or data at byte ", bad.value_or(0));
  return text::decode_utf8(s);
}

void utf8_append(std::string& out, char32_t c) { text::append_utf8(out, c); }

std::string utf8_encode(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) text::append_utf8(out, c);
  return out;
}

bool py_isspace(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

}  // namespace asynct::jinja
