#include "kernels/gemm.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/cuda_check.h"
#include "kernels/skinny_gemm.h"

namespace asynct::kernels {
namespace {
void lt_check(cublasStatus_t status, const char* what) {
  check(status == CUBLAS_STATUS_SUCCESS, "cuBLASLt ", what, " failed with status ", int(status));
}
}  // namespace

struct Gemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
  }
};

Gemm::Gemm() {
  lt_check(cublasLtCreate(&handle_), "create");
  ASYNCT_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
  const char* skinny = std::getenv("ASYNCT_SKINNY_GEMM");
  use_skinny_ = skinny && std::strcmp(skinny, "1") == 0;
  if (use_skinny_) {
    skinny_workspace_bytes_ = skinny_gemm_max_workspace_bytes();
    ASYNCT_CUDA_CHECK(cudaMalloc(&skinny_workspace_, skinny_workspace_bytes_));
    ASYNCT_CUDA_CHECK(cudaMemset(skinny_workspace_, 0, skinny_workspace_bytes_));  // tile counters
  }
}

Gemm::~Gemm() {
  plans_.clear();
  if (workspace_) cudaFree(workspace_);
  if (skinny_workspace_) cudaFree(skinny_workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

// cuBLASLt is column-major. Row-major y = x W^T is column-major y^T = W x^T: A is the weight
// buffer read as [in, out] and transposed, B the input buffer as [in, rows], C as [out, rows].
Gemm::Plan& Gemm::plan(int rows, int in, int out, bool out_fp32) {
  auto& slot = plans_[Key{rows, in, out, out_fp32}];
  if (slot) return *slot;
  auto p = std::make_unique<Plan>();
  lt_check(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
  const cublasOperation_t transpose = CUBLAS_OP_T, none = CUBLAS_OP_N;
  lt_check(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose), "transa");
  lt_check(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &none, sizeof none), "transb");
  lt_check(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, in, out, in), "layout a");
  lt_check(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, in, rows, in), "layout b");
  lt_check(cublasLtMatrixLayoutCreate(&p->c, out_fp32 ? CUDA_R_32F : CUDA_R_16BF, out, rows, out), "layout c");
  cublasLtMatmulPreference_t pref = nullptr;
  lt_check(cublasLtMatmulPreferenceCreate(&pref), "preference");
  lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                                                sizeof workspace_bytes_), "workspace preference");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(handle_, p->desc, p->a, p->b, p->c, p->c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  lt_check(status, "heuristic");
  check(found > 0, "cuBLASLt has no algorithm for a [", rows, " x ", in, "] x [", in, " x ", out, "] product");
  p->algo = result.algo;
  slot = std::move(p);
  return *slot;
}

void Gemm::linear(const bf16* x, const bf16* weight, void* y, int rows, int in, int out, bool out_fp32,
                  cudaStream_t stream) {
  check(rows >= 1 && in >= 1 && out >= 1, "linear: empty product [", rows, " x ", in, "] -> ", out);
  if (use_skinny_ && skinny_gemm_supports(x, weight, rows, in))
    return launch_skinny_gemm(x, weight, y, rows, in, out, out_fp32, skinny_workspace_, skinny_workspace_bytes_,
                              stream);
  const Plan& p = plan(rows, in, out, out_fp32);
  const float one = 1.0f, zero = 0.0f;
  lt_check(cublasLtMatmul(handle_, p.desc, &one, weight, p.a, x, p.b, &zero, y, p.c, y, p.c, &p.algo, workspace_,
                          workspace_bytes_, stream),
           "matmul");
}

}  // namespace asynct::kernels
