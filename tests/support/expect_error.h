// expect_error(f, "fragment"): f must throw asynct::Error whose message contains the fragment.
#pragma once

#include <functional>
#include <string>

#include <gtest/gtest.h>

#include "core/error.h"

namespace asynct::testing {

inline void expect_error(const std::function<void()>& f, const std::string& fragment) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

}  // namespace asynct::testing
