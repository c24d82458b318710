// What the norm kernels (norms.cu: the row norms; qk_norm_rope.cu: per-head q/k norm and RoPE)
// share on the host: block shapes and the pointer checks.
#pragma once

#include <initializer_list>
#include <utility>

namespace asynct::kernels::norms {

constexpr int kWarp = 32;
constexpr int kMaxThreads = 256;

constexpr int round_up(int n, int m) { return (n + m - 1) / m * m; }

// Each pointer non-null and 16-byte aligned (the kernels move 8 bf16 per 16-byte access); throws
// asynct::Error naming the first that is not.
using NamedPointer = std::pair<const void*, const char*>;
void check_pointers(const char* who, std::initializer_list<NamedPointer> pointers);

}  // namespace asynct::kernels::norms
