// Tensor maps (the descriptors of Hopper's tensor copies, bulk_copy.cuh) for tensors in
// global memory, through the driver's encoder (reached once through the runtime: no libcuda
// link). Host code; the maps travel to a kernel as __grid_constant__ parameters.
#pragma once

#include <cuda.h>  // CUtensorMap

namespace asynct::kernels {

// The shape of a map of rank 2..5, innermost dimension first, as cuTensorMapEncodeTiled takes it:
// each dimension's size in elements, the byte strides of dimensions 1.. (multiples of 16), the
// box copied at a time. Boxes are zero-filled past the dimensions' sizes.
struct TensorMapShape {
  int rank = 2;
  cuuint64_t dims[5] = {};
  cuuint64_t strides[4] = {};
  cuuint32_t box[5] = {};
};

enum class TensorMapElement { kBf16, kByte, kFloat };

// Encodes `shape` over `base` into `map`; false (and the driver's result in *result) where the
// driver refuses the shape. With `swizzle`, boxes land in shared memory with the 128-byte swizzle
// (the innermost box dimension spans 128 bytes: 64 bf16, 128 bytes); L2 promotion of 256 bytes
// (whole swizzle rows and their neighbours).
bool encode_tensor_map(CUtensorMap& map, const void* base, const TensorMapShape& shape, TensorMapElement element,
                       bool swizzle, CUresult* result = nullptr);

// A bf16 tensor read with the 128-byte swizzle.
inline bool encode_bf16_tensor_map(CUtensorMap& map, const void* base, const TensorMapShape& shape,
                                   CUresult* result = nullptr) {
  return encode_tensor_map(map, base, shape, TensorMapElement::kBf16, true, result);
}

}  // namespace asynct::kernels
