// Dense layers on the GPU through cuBLASLt: y[rows, out] = x[rows, in] W^T with W [out, in]
// row-major (PyTorch's nn.Linear layout), bf16 inputs, fp32 accumulation, bf16 or fp32 output.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <tuple>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "kernels/attention_args.h"  // bf16

namespace asynct::kernels {

class Gemm {
 public:
  Gemm();
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // out_fp32 selects a float output (the LM head's logits); otherwise bf16.
  void linear(const bf16* x, const bf16* weight, void* y, int rows, int in, int out, bool out_fp32,
              cudaStream_t stream);

 private:
  struct Plan;  // descriptors and the chosen algorithm for one shape
  using Key = std::tuple<int, int, int, bool>;
  Plan& plan(int rows, int in, int out, bool out_fp32);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 32u << 20;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace asynct::kernels
