// The paged cache's element type as the device reads and writes it (KvElement, common/kv_element.h):
// the one load/store pair the cache's readers and writers share. A lane handles 8 consecutive
// values of a row: Raw is how they are stored; encode8 makes it from floats (the e4m3 cache holds
// value / scale), decode8 turns it into bf16 exactly (every e4m3 value is a bf16 value). The
// decode kernel's reads, read8 (of a Raw), load8 (from shared memory) and stream8 (from global
// memory past L1), give the stored values divided by kReadUnit: e4m3 skips the exact decode's
// multiply and NaN test there (a third of a tile's instructions [C36H]), its NaN reading as 480;
// a NaN K or V has made the step that wrote it non-finite already. Readers fold the scales into
// their arithmetic (decode: the key scale into q, kReadUnit into each finished score on the CUDA
// cores, both into the output; its tensor-core scores convert exactly).
#pragma once

#include <cstring>

#include "kernels/common/bf16.cuh"
#include "kernels/common/fp8.cuh"

namespace asynct::kernels {

struct KvBf16 {
  static constexpr int kBytes = 2;
  static constexpr bool kIsBf16 = true;
  static constexpr float kReadUnit = 1.0f;
  using Raw = uint4;
  __device__ static Raw encode8(const float in[8], float /*scale*/) {
    const Bf16x8 v = from_float8(in);
    Raw raw;
    memcpy(&raw, &v, 16);
    return raw;
  }
  __device__ static Bf16x8 decode8(Raw raw) {
    Bf16x8 v;
    memcpy(&v, &raw, 16);
    return v;
  }
  __device__ static Bf16x8 read8(Raw raw) { return decode8(raw); }
  __device__ static Bf16x8 load8(const unsigned char* p) { return *reinterpret_cast<const Bf16x8*>(p); }
  __device__ static Bf16x8 stream8(const unsigned char* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return decode8(v);
  }
};
struct KvFp8 {
  static constexpr int kBytes = 1;
  static constexpr bool kIsBf16 = false;
  static constexpr float kReadUnit = 0x1p120f;  // e4m3's bits in a bf16's places: the value times 2^-120
  using Raw = uint2;
  __device__ static Raw encode8(const float in[8], float scale) { return float8_to_e4m3x8(in, scale); }
  __device__ static Bf16x8 decode8(Raw raw) { return e4m3x8_to_bf16x8(raw); }
  __device__ static Bf16x8 read8(Raw raw) { return e4m3x8_to_bf16x8<false>(raw); }
  __device__ static Bf16x8 load8(const unsigned char* p) { return read8(*reinterpret_cast<const uint2*>(p)); }
  __device__ static Bf16x8 stream8(const unsigned char* p) {
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return read8(v);
  }
};

}  // namespace asynct::kernels
