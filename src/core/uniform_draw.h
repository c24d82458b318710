// The uniform number a sampled token is drawn with: it depends only on (seed, step), so a
// request draws the same numbers on any machine and on either backend (host and device code).
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace asynct {

// splitmix64's finaliser.
ASYNCT_HOST_DEVICE inline std::uint64_t splitmix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// In [0, 1), with 53 random bits.
ASYNCT_HOST_DEVICE inline double uniform_draw(std::uint64_t seed, std::uint64_t step) {
  const std::uint64_t bits = splitmix64(splitmix64(seed) ^ step);
  return double(bits >> 11) * 0x1.0p-53;
}

}  // namespace asynct
