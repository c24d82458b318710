// Dense layers on the GPU: y[rows, out] = x[rows, in] W^T with W [out, in] row-major (PyTorch's
// nn.Linear layout), bf16 inputs, fp32 accumulation, bf16 or fp32 output. Three ways to run one
// (GemmPath), compared per shape by bench/bench_gemm.py:
//   * CublasLt: cuBLASLt's first heuristic choice;
//   * CublasLtTuned: for few rows (decode steps, where the heuristic's choice reads the weights
//     far below the memory's rate), the fastest of cuBLASLt's candidates, timed once per shape
//     on the first eager call (a call inside a graph capture takes the heuristic's choice);
//   * Skinny: the split-K kernel of skinny_gemm.h, for up to 64 rows.
// Default is what the engine uses: the skinny kernel for up to kSkinnyDefaultMaxRows rows on
// sm_90, cuBLASLt otherwise; KernelTuning::gemm (common/tuning.h, ASYNCT_GEMM) overrides it.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <tuple>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "kernels/common/bf16.h"
#include "kernels/common/tuning.h"  // GemmPath, gemm_path_from_name
#include "kernels/gemm/linear_output.h"

namespace asynct::kernels {

class Gemm {
 public:
  Gemm();
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // out_fp32 selects a float output (the LM head's logits); otherwise bf16.
  // A path the product cannot take (Skinny beyond 64 rows) falls back to CublasLt.
  void linear(const bf16* x, const bf16* weight, void* y, int rows, int in, int out, bool out_fp32,
              cudaStream_t stream, GemmPath path = GemmPath::Default);

  // The product y = x W^T for a kernel that can add split partial sums as it reads (see
  // linear_output.h): with at most kSkinnyFormsMaxRows rows on a device where the skinny kernel
  // runs at speed, and no path other than skinny forced by KernelTuning::gemm, it is left as fp32
  // partials in `partials` (partial_floats floats); otherwise it is a dense bf16 product in y.
  LinearOutput linear_for_reader(const bf16* x, const bf16* weight, bf16* y, float* partials,
                                 std::size_t partial_floats, int rows, int in, int out, cudaStream_t stream);

  // act [rows][inter] = SiLU(x Wg^T) * (x Wu^T), W the merged gate/up projection [2 inter][in] in
  // the kGluBlock order (linear_output.h). Under the same conditions as above one skinny kernel
  // with the SiLU in its epilogue; otherwise the product into gate_up [rows][2 inter] and
  // launch_silu_and_mul.
  void gated_linear(const bf16* x, const bf16* weight, bf16* gate_up, bf16* act, int rows, int in, int inter,
                    cudaStream_t stream);

  // The skinny kernel's split-partial and gated forms serve products of at most this many rows:
  // the decode batch the engine was measured at (32; 1.7B decode_heavy step 2.41 -> 2.30 ms with
  // the split partials). Past it cuBLASLt's products pull ahead (bench/RESULTS.md).
  static constexpr int kSkinnyFormsMaxRows = 32;

  // On the default path, products of at most this many rows take the skinny kernel (on sm_90):
  // at 1-4 rows it reads the weights faster than cuBLASLt on every decode shape but the fused
  // qkv (a tie), and single-stream decode measured 1.746 -> 1.681 ms per 1.7B step with it.
  static constexpr int kSkinnyDefaultMaxRows = 4;

  // Products of at most this many rows are tuned on the CublasLtTuned path.
  static constexpr int kTunedMaxRows = 256;

 private:
  struct Plan;  // descriptors and the chosen algorithm for one shape
  using Key = std::tuple<int, int, int, bool, bool>;  // rows, in, out, out_fp32, tuned
  Plan& plan(int rows, int in, int out, bool out_fp32, bool tuned);
  void tune(Plan& p, const bf16* x, const bf16* weight, void* y, cudaStream_t stream);
  bool skinny_forms_here(const bf16* x, const bf16* weight, int rows, int in) const;
  cublasStatus_t try_matmul(const Plan& p, const cublasLtMatmulAlgo_t& algo, const bf16* x, const bf16* weight,
                            void* y, cudaStream_t stream);
  void matmul(const Plan& p, const cublasLtMatmulAlgo_t& algo, const bf16* x, const bf16* weight, void* y,
              cudaStream_t stream);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 32u << 20;
  void* skinny_scratch_ = nullptr;  // the skinny kernel's SkinnyWorkspace (partials, then counters)
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace asynct::kernels
