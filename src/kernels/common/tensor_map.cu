#include "kernels/common/tensor_map.h"

#include <cudaTypedefs.h>

#include "core/error.h"
#include "kernels/common/cuda_check.h"

namespace asynct::kernels {

bool encode_tensor_map(CUtensorMap& map, const void* base, const TensorMapShape& shape, TensorMapElement element,
                       bool swizzle, CUresult* result) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    ASYNCT_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    check(found == cudaDriverEntryPointSuccess && fn != nullptr, "tensor maps: the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  const cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
  const CUtensorMapDataType type = element == TensorMapElement::kBf16   ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                   : element == TensorMapElement::kByte ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                                                        : CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  const CUresult got = encode(&map, type, cuuint32_t(shape.rank), const_cast<void*>(base), shape.dims, shape.strides,
                              shape.box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              swizzle ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result) *result = got;
  return got == CUDA_SUCCESS;
}

}  // namespace asynct::kernels
