// Checks for numeric options that say what is wrong in the user's terms: "'abc' is not an
// integer", "'-1' is out of range 0..2147483647". (CLI11's Range and NonNegativeNumber print
// their bounds as doubles, DBL_MAX in 300 digits, and call a word "not in range".) A failed
// check is a CLI11 ValidationError, reported as "--option: message".
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <system_error>

#include <CLI/CLI.hpp>

namespace asynct::cli {

namespace detail {
// The whole text as one number of type T (no sign for unsigned, no spaces, no trailing text).
template <typename T>
bool parse_whole(const std::string& text, T* value) {
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, *value);
  return error == std::errc() && stop == end && !text.empty();
}
}  // namespace detail

// An integer option in [lo, hi].
template <typename T>
CLI::Validator integer_in(T lo, T hi) {
  const std::string range = std::to_string(lo) + ".." + std::to_string(hi);
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        // The widest type of T's signedness, so that a value past T's range is "out of range",
        // not "not an integer".
        using Wide = std::conditional_t<std::is_signed_v<T>, long long, unsigned long long>;
        Wide value = 0;
        if (!detail::parse_whole(text, &value)) {
          if constexpr (std::is_unsigned_v<T>) {
            long long negative = 0;
            if (detail::parse_whole(text, &negative)) return "'" + text + "' is out of range " + range;
          }
          const bool digits = !text.empty() && text.find_first_not_of("+-0123456789") == std::string::npos;
          return "'" + text + (digits ? "' is out of range " + range : "' is not an integer");
        }
        if (value < Wide(lo) || value > Wide(hi)) return "'" + text + "' is out of range " + range;
        return "";
      },
      range);
}

// A number option in [lo, hi] (a finite value; NaN is outside every range).
inline CLI::Validator number_in(double lo, double hi) {
  auto shown = [](double v) {
    std::string s = std::to_string(v);
    s.erase(s.find_last_not_of('0') + 1);
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  };
  const std::string range = shown(lo) + ".." + shown(hi);
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        double value = 0;
        if (!detail::parse_whole(text, &value)) return "'" + text + "' is not a number";
        if (!(value >= lo && value <= hi)) return "'" + text + "' is out of range " + range;
        return "";
      },
      range);
}

}  // namespace asynct::cli
