// How tests compare an output with its reference: the relative Frobenius error
// ||out - ref|| / ||ref||, with any NaN or infinity in the output a failure of its own.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/tensor.h"

namespace asynct::testing {

struct Comparison {
  double relative_error = 0.0;   // ||out - ref|| / ||ref|| (absolute when ref is all zero)
  std::int64_t non_finite = 0;   // NaN or inf entries in out (unwritten, poisoned outputs)
  std::int64_t first_non_finite = -1;
};

inline Comparison compare(const std::vector<float>& out, const std::vector<float>& ref) {
  Comparison c;
  double diff = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < out.size() && i < ref.size(); ++i) {
    if (!std::isfinite(out[i])) {
      if (c.non_finite++ == 0) c.first_non_finite = std::int64_t(i);
      continue;
    }
    diff += (double(out[i]) - ref[i]) * (double(out[i]) - ref[i]);
    norm += double(ref[i]) * ref[i];
  }
  c.relative_error = norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
  return c;
}

// EXPECT-style: sizes equal, no non-finite entry, relative error <= tolerance.
inline ::testing::AssertionResult close_to(const std::vector<float>& out,
                                           const std::vector<float>& ref, double tolerance) {
  if (out.size() != ref.size())
    return ::testing::AssertionFailure()
           << "size " << out.size() << " differs from the reference's " << ref.size();
  Comparison c = compare(out, ref);
  if (c.non_finite)
    return ::testing::AssertionFailure() << c.non_finite << " non-finite entries, the first at "
                                         << c.first_non_finite << " (unwritten output?)";
  if (!(c.relative_error <= tolerance))
    return ::testing::AssertionFailure() << "relative error " << c.relative_error
                                         << " > tolerance " << tolerance;
  return ::testing::AssertionSuccess() << "relative error " << c.relative_error;
}

inline ::testing::AssertionResult close_to(const Tensor& out, const Tensor& ref,
                                           double tolerance) {
  if (out.shape() != ref.shape())
    return ::testing::AssertionFailure() << "shape " << shape_string(out.shape())
                                         << " differs from the reference's "
                                         << shape_string(ref.shape());
  return close_to(out.to_float_vector(), ref.to_float_vector(), tolerance);
}

}  // namespace asynct::testing
