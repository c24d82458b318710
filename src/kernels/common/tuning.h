// Every override of the kernels' own choices, in one place. The defaults are what the engine
// runs; each field below says what it overrides and why the default is what it is (measured on
// an H200, bench/RESULTS.md). Nothing under src/kernels reads the environment: the command line
// (ASYNCT_* variables, parse_kernel_tuning), the C API (asynct_set_tuning) and tests fill this
// and call set_kernel_tuning().
//
// When a change takes effect: every field is read where the choice is made, at each launch or
// product (kernel_tuning() is a plain read), so a change applies to the launches after it on
// every thread. Not to work already captured: a CUDA graph replays the kernels, paths and plans
// chosen while it was captured. set_kernel_tuning() is not synchronised with concurrent
// launches: set it before starting work on other threads (or between their launches).
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace asynct::kernels {

// The ways to run a dense product (gemm.h).
enum class GemmPath { Default, CublasLt, CublasLtTuned, Skinny };

// Which prefill kernel launch_prefill runs (prefill.h).
enum class PrefillKernel { kAuto, kPortable, kHopper };

struct KernelTuning {
  // ASYNCT_GEMM = cublaslt | tuned | skinny: the path of every Gemm::linear call that asks for
  // GemmPath::Default, and whether the skinny kernel's fused forms (split partials for the
  // reading kernel, the gate/up product with its SiLU) may be used: only when this is Default or
  // Skinny. Default: the skinny kernel for products of at most Gemm::kSkinnyDefaultMaxRows rows
  // on sm_90 (single-stream 1.7B decode step 1.746 -> 1.681 ms), cuBLASLt otherwise; its fused
  // forms up to Gemm::kSkinnyFormsMaxRows rows (decode_heavy step 2.41 -> 2.30 ms). All of
  // cuBLASLt (cublaslt): AsyncT / Qwen3 decode step 2.406 / 2.519 ms.
  GemmPath gemm = GemmPath::Default;

  // ASYNCT_PREFILL = portable | hopper: which prefill kernel runs. kAuto: the wgmma kernel for
  // head_dim 128 on a Hopper device with this build's sm_90a code, the portable one otherwise
  // (1.02-1.19x the portable kernel's TFLOP/s for the async gate, 0.97-1.09x for softmax,
  // long_prefill_b4 0.963x against 0.984x the baseline). kHopper only where it applies.
  PrefillKernel prefill = PrefillKernel::kAuto;

  // ASYNCT_PREFILL_SPLITS: how many CTAs share each query tile's keys in either prefill kernel
  // (1..16; 0 leaves it to their rule: split only when the query tiles fill less than half of
  // the GPU's places for them, as a short prompt after a long cached prefix does). Tests force it.
  int prefill_kv_splits = 0;

  // ASYNCT_PREFILL_GROUP: sequences a group in either prefill kernel's tile order (tile_order.cuh:
  // a group's tiles run before the next group's); 0 leaves it to their rule, one sequence (Hopper
  // kernel 1.06x / 1.10x / 1.05x the plain order's async TFLOP/s at 16 x 1024 / 8 x 2048 / 4 x 4096,
  // 1.10x varlen; groups of three 0.97x of one at 16 x 1024); a count past the batch is the plain
  // order (every sequence's heaviest tile first). Tests force 1 and 2.
  int prefill_seq_group = 0;

  // ASYNCT_PREFILL_CTAS: persistent CTAs for the Hopper prefill kernel when it does not split the
  // keys: at most this many (and at most one a multiprocessor, one a pair of query tiles), each
  // taking pairs of tiles in turn, the next tile's Q and first keys copied while the current
  // one's last products run. 0 (the default): one CTA a query tile, which measured faster (async
  // 358 against 309 TFLOP/s at 16 x 1024, 577 against 573 at 1 x 16384). Tests force 1, 3 and
  // one a multiprocessor.
  int prefill_ctas = 0;

  // The skinny kernel's plan (skinny_gemm.h), for measuring and tests.
  struct Skinny {
    enum Wgmma { kAuto, kOff, kOn };
    // ASYNCT_SKINNY_TILE: the column tile width of every product (<= 64: 64 columns, else 128);
    // 0 leaves it to the cost model, which picks 64 for gate_up at 32 rows (decode step 2.098
    // ms against 2.202 with 128 everywhere).
    int tile_n = 0;
    // ASYNCT_SKINNY_SPLITS: the split-K count of every product (clamped to what it allows); 0
    // leaves it to the cost model (split products forced to 2 / 4 / 8: AsyncT step 2.385 /
    // 2.184 / 2.218 ms).
    int splits = 0;
    // ASYNCT_SKINNY_WGMMA = 0 | 1: the consumer warps' instructions on a Hopper device (from a
    // build for sm_90a). kAuto: wgmma for more than 16 rows, mma.sync below (decode step at 32
    // rows 2.019 ms with wgmma against 2.081; at 1 row 1.555 against 1.533).
    Wgmma wgmma = kAuto;
  } skinny;

  // ASYNCT_PDL = 0 | 1: whether kernels launched with launch_dependent (dependent_launch.cuh)
  // may start before their predecessor ends, on sm_90 and later. On by default: decode step
  // 1.99 ms with it, 2.348 ms without.
  bool dependent_launch = true;
  // ASYNCT_GRAPH_PREFILL: the most new tokens a sequence of a step's prefill part may have for
  // the CUDA runner to replay the step from a graph (models/cuda/graph_cache.h), and, when over
  // 64, its prefill tokens in all (else 64); 0 leaves it to the runner's default (64: a question
  // after a cached prefix, AsyncT's 3.5 -> 3.0 ms at the server [W35H]). Larger parts run eagerly.
  int graph_prefill_len = 0;
};

// The tuning in force (defaults until set_kernel_tuning).
const KernelTuning& kernel_tuning();
void set_kernel_tuning(const KernelTuning& tuning);

// The ASYNCT_* names parse_kernel_tuning reads, in the order of the fields above.
const std::vector<std::string>& kernel_tuning_names();

// `base` with every field whose ASYNCT_* name `lookup` has a value for (non-null, non-empty)
// replaced by that value; lookup returns null for a name that is not set. A value that is not
// one of the field's forms throws asynct::Error naming the variable, its value and the forms.
KernelTuning parse_kernel_tuning(const std::function<const char*(const char* name)>& lookup,
                                 const KernelTuning& base = KernelTuning{});

// The path named by `name` (cublaslt, tuned, skinny); an unknown name is an error.
GemmPath gemm_path_from_name(const char* name);

}  // namespace asynct::kernels
