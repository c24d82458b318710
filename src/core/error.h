// Errors that reach the user. Every check in asynct throws asynct::Error with a message that
// names what was wrong and what was expected, so that bad input never becomes a crash.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace asynct {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}
}  // namespace detail

// check(condition, "what", value, "more") throws Error with the parts concatenated.
template <typename... Parts>
void check(bool condition, const Parts&... parts) {
  if (!condition) throw Error(detail::concat(parts...));
}

}  // namespace asynct
