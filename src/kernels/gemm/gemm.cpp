#include "kernels/gemm/gemm.h"

#include <algorithm>
#include <vector>

#include "kernels/common/cuda_check.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/gemm/skinny_gemm.h"

namespace asynct::kernels {
namespace {
void lt_check(cublasStatus_t status, const char* what) {
  check(status == CUBLAS_STATUS_SUCCESS, "cuBLASLt ", what, " failed with status ", int(status));
}
}  // namespace

struct Gemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  std::vector<cublasLtMatmulAlgo_t> candidates;  // the heuristic's, best guess first
  cublasLtMatmulAlgo_t algo{};                    // the one in use
  bool tuned = false;
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
  // The skinny kernel's split scratch: its counters start at zero and every launch leaves them so.
  ASYNCT_CUDA_CHECK(cudaMalloc(&skinny_scratch_, kSkinnyPartialBytes + kSkinnyCounters * sizeof(unsigned)));
  ASYNCT_CUDA_CHECK(cudaMemset(static_cast<char*>(skinny_scratch_) + kSkinnyPartialBytes, 0,
                               kSkinnyCounters * sizeof(unsigned)));
}

Gemm::~Gemm() {
  plans_.clear();
  if (workspace_) cudaFree(workspace_);
  if (skinny_scratch_) cudaFree(skinny_scratch_);
  if (handle_) cublasLtDestroy(handle_);
}

// cuBLASLt is column-major. Row-major y = x W^T is column-major y^T = W x^T: A is the weight
// buffer read as [in, out] and transposed, B the input buffer as [in, rows], C as [out, rows].
Gemm::Plan& Gemm::plan(int rows, int in, int out, bool out_fp32, bool tuned) {
  auto& slot = plans_[Key{rows, in, out, out_fp32, tuned}];
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
  constexpr int kCandidates = 16;
  cublasLtMatmulHeuristicResult_t results[kCandidates]{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle_, p->desc, p->a, p->b, p->c, p->c, pref,
                                                               kCandidates, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  lt_check(status, "heuristic");
  check(found > 0, "cuBLASLt has no algorithm for a [", rows, " x ", in, "] x [", in, " x ", out, "] product");
  for (int i = 0; i < found; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS) p->candidates.push_back(results[i].algo);
  check(!p->candidates.empty(), "cuBLASLt's algorithms all fail for a [", rows, " x ", in, "] product");
  p->algo = p->candidates.front();
  slot = std::move(p);
  return *slot;
}

cublasStatus_t Gemm::try_matmul(const Plan& p, const cublasLtMatmulAlgo_t& algo, const bf16* x, const bf16* weight,
                                void* y, cudaStream_t stream) {
  const float one = 1.0f, zero = 0.0f;
  return cublasLtMatmul(handle_, p.desc, &one, weight, p.a, x, p.b, &zero, y, p.c, y, p.c, &algo, workspace_,
                        workspace_bytes_, stream);
}

void Gemm::matmul(const Plan& p, const cublasLtMatmulAlgo_t& algo, const bf16* x, const bf16* weight, void* y,
                  cudaStream_t stream) {
  lt_check(try_matmul(p, algo, x, weight, y, stream), "matmul");
}

// Times every candidate on the call's own operands (y is overwritten by the real call that
// follows) and keeps the fastest: the median of a few runs after one untimed run.
void Gemm::tune(Plan& p, const bf16* x, const bf16* weight, void* y, cudaStream_t stream) {
  p.tuned = true;
  if (p.candidates.size() < 2) return;
  cudaEvent_t start, stop;
  ASYNCT_CUDA_CHECK(cudaEventCreate(&start));
  ASYNCT_CUDA_CHECK(cudaEventCreate(&stop));
  float best_ms = 0.0f;
  for (const cublasLtMatmulAlgo_t& algo : p.candidates) {
    if (try_matmul(p, algo, x, weight, y, stream) != CUBLAS_STATUS_SUCCESS)
      continue;  // a candidate that cannot run is skipped, not an error
    std::vector<float> times;
    for (int rep = 0; rep < 5; ++rep) {
      ASYNCT_CUDA_CHECK(cudaEventRecord(start, stream));
      matmul(p, algo, x, weight, y, stream);
      ASYNCT_CUDA_CHECK(cudaEventRecord(stop, stream));
      ASYNCT_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0.0f;
      ASYNCT_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      times.push_back(ms);
    }
    std::nth_element(times.begin(), times.begin() + 2, times.end());
    if (best_ms == 0.0f || times[2] < best_ms) {
      best_ms = times[2];
      p.algo = algo;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

void Gemm::linear(const bf16* x, const bf16* weight, void* y, int rows, int in, int out, bool out_fp32,
                  cudaStream_t stream, GemmPath path) {
  check(rows >= 1 && in >= 1 && out >= 1, "linear: empty product [", rows, " x ", in, "] -> ", out);
  if (path == GemmPath::Default) path = kernel_tuning().gemm;  // read at each call (common/tuning.h)
  if (path == GemmPath::Default)
    path = rows <= kSkinnyDefaultMaxRows && skinny_gemm_fast_here() ? GemmPath::Skinny : GemmPath::CublasLt;
  if (path == GemmPath::Skinny && skinny_gemm_supports(x, weight, rows, in)) {
    const SkinnyWorkspace scratch{static_cast<float*>(skinny_scratch_), kSkinnyPartialBytes,
                                  reinterpret_cast<unsigned*>(static_cast<char*>(skinny_scratch_) + kSkinnyPartialBytes),
                                  kSkinnyCounters};
    return launch_skinny_gemm(x, weight, y, rows, in, out, out_fp32, scratch, stream);
  }
  const bool tuned = path == GemmPath::CublasLtTuned && rows <= kTunedMaxRows;
  Plan& p = plan(rows, in, out, out_fp32, tuned);
  if (tuned && !p.tuned) {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    ASYNCT_CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
    if (capturing == cudaStreamCaptureStatusNone) tune(p, x, weight, y, stream);
  }
  matmul(p, p.algo, x, weight, y, stream);
}

LinearOutput Gemm::linear_for_reader(const bf16* x, const bf16* weight, bf16* y, float* partials,
                                     std::size_t partial_floats, int rows, int in, int out, cudaStream_t stream) {
  check(rows >= 1 && in >= 1 && out >= 1, "linear: empty product [", rows, " x ", in, "] -> ", out);
  if (skinny_forms_here(x, weight, rows, in) && partials != nullptr && partial_floats >= std::size_t(kSkinnyMaxRows) * out)
    return launch_skinny_gemm_partials(x, weight, partials, partial_floats, rows, in, out, stream);
  linear(x, weight, y, rows, in, out, false, stream);
  return LinearOutput::of(y);
}

void Gemm::gated_linear(const bf16* x, const bf16* weight, bf16* gate_up, bf16* act, int rows, int in, int inter,
                        cudaStream_t stream) {
  check(rows >= 1 && in >= 1 && inter >= 1, "gated_linear: empty product [", rows, " x ", in, "] -> 2 x ", inter);
  if (skinny_forms_here(x, weight, rows, in)) return launch_skinny_gemm_glu(x, weight, act, rows, in, inter, stream);
  linear(x, weight, gate_up, rows, in, 2 * inter, false, stream);
  launch_silu_and_mul(gate_up, act, rows, inter, stream);
}

bool Gemm::skinny_forms_here(const bf16* x, const bf16* weight, int rows, int in) const {
  const GemmPath forced = kernel_tuning().gemm;
  return (forced == GemmPath::Default || forced == GemmPath::Skinny) && rows <= kSkinnyFormsMaxRows && skinny_gemm_supports(x, weight, rows, in) &&
         skinny_gemm_fast_here();
}

}  // namespace asynct::kernels
