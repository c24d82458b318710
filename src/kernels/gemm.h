// Dense layers on the GPU: y[rows, out] = x[rows, in] W^T with W [out, in] row-major (PyTorch's
// nn.Linear layout), bf16 inputs, fp32 accumulation, bf16 or fp32 output, through cuBLASLt.
// ASYNCT_SKINNY_GEMM=1 in the environment sends products of up to 64 rows (decode steps) to
// the skinny kernel (skinny_gemm.h) instead. It is correct (tested) but not yet faster: on the
// H200 it made the 1.7B decode step at 32 sequences 4.9 ms against cuBLASLt's 3.1 ms (see
// bench/RESULTS.md), so it stays opt-in until it is tuned.
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
  bool use_skinny_ = false;
  void* skinny_workspace_ = nullptr;  // allocated once: graphs keep its address
  std::size_t skinny_workspace_bytes_ = 0;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 32u << 20;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace asynct::kernels
