// The device sampler: one kernel, its launch and layout, and the row's walk through the steps
// below; its pieces by job in sample_rows_row.cuh (the cluster's collectives), _histogram.cuh
// (places in the order), _draw.cuh (the draw), _logprobs.cuh and _process.cuh (bias, penalties,
// mask; a slice's best and sums).
// One thread-block cluster per row: its 8 blocks (7 when 8-block clusters would leave rows
// waiting: the H200 holds 30 such clusters, 32 of 7) each load their share of the row into
// shared memory (76 KB at Qwen3's 151,936 tokens in eighths, 87 KB in sevenths), so the row is
// read from global memory once, and every later pass runs over shared memory, the blocks
// agreeing through distributed shared memory at a few cluster barriers. For a row, in the
// host sampler's order (engine/sampler.h):
//   1. one pass: the raw row's maximum, argmax, first non-finite logit and (for logprobs) its
//      sum of exponentials; the logit bias, penalties and allowed-token mask, applied to the
//      shared-memory copy (the row in global memory stays raw); the processed row's maximum and
//      argmax. One cluster reduction.
//      With top-n logprobs the raw statistics are reduced first and the top-n found before the
//      penalties change the copy (the n best as the small top-k path below takes its k best).
//   2. temperature 0: the processed argmax. With 1 <= top-k <= 64 (the serving case) the draw
//      needs only the k best tokens: step 1 also bounds the row's k-th logit from below by the
//      threads' maxima (k threads' maxima at or above a value are k tokens at or above it); each
//      block adds its tokens at or above the bound to block 0 (about 6k for k = 50 on N(0, s^2)
//      rows), which ranks them, keeps the k best in order and walks them as step 3 does. More
//      than the gather holds (a flat row) falls through to the histogram.
//      Otherwise a histogram of the tokens by how far below the maximum their tempered logit
//      lies, d = (max - x) / T, 1/32 nat a bin, with each bin's count and mass. A token's weight exp(-d) is kept in its bin's fixed point:
//      q = round(exp(b/32 - d) * 2^16) in bin b, worth q * 2^-16 * exp(-b/32) (relative error
//      <= 1.6e-5): 32-bit shared-memory atomics, and sums that do not depend on their order.
//      With top-k, counts alone (the head's weights are its own; step 4 builds them again).
//   3. The head: the bins up to the one holding the first place that bounds the kept set
//      (top-k's k-th token, else top-p's or min-p's cut, else the draw). When it fits the
//      gather (kMaxCandidates tokens, as with top-k 50 on any row), block 0 gathers, sorts and
//      walks it exactly as the host walks the order, every cut and the draw in one go.
//   4. Otherwise positions in the order (logit desc, id asc) are found one by one from the
//      histogram's prefix sums: top-k's k-th token, top-p's cut over what top-k kept, min-p's,
//      the kept mass, the draw. Only the bins a cut or the draw falls in are gathered.
//   5. A bin of more than kMaxCandidates tokens (a nearly flat row): every cut and the draw by
//      bisection on the tokens' order keys instead (exact, 64 passes over shared memory each).
// Needs sm_90 (clusters); the runners sample on the host elsewhere.
#include "kernels/sampling/sample_rows.h"

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <map>
#include <mutex>
#include <tuple>

#include <cooperative_groups.h>

#include "core/uniform_draw.h"
#include "kernels/common/bulk_copy.cuh"
#include "kernels/common/cuda_check.h"
#include "kernels/common/dependent_launch.cuh"
#include "kernels/common/device_info.h"

namespace asynct::kernels {
namespace {

namespace cg = cooperative_groups;

constexpr int kMaxClusterBlocks = 8;  // a row's blocks: 8, or 7 when 8-block clusters leave rows waiting (launch_sample_rows)
constexpr int kThreads = 512;         // two blocks per multiprocessor
constexpr int kWarps = kThreads / 32;
static_assert(kWarps <= 32 && (kWarps & (kWarps - 1)) == 0, "block_allreduce's tree");
constexpr int kBins = 1536;  // 1/32 nat each; the last also takes everything beyond 48 nats
constexpr int kMaxCandidates = 2 * kThreads;
constexpr int kSubBins = 256;  // a bin too full to gather is split this finely (1/8192 nat)
constexpr int kMaxSmallTopK = 64;  // the small top-k path's largest k: one warp walks the head
// Each warp's largest thread maxima that bound the k-th logit (step 1): 8 a warp, so the bound
// needs no warp to hold more than 8 of the block's k best maxima (16 warps, k <= 64).
constexpr int kBoundsPerWarp = 8;

using u64 = unsigned long long;

struct Shared {
  union {
    unsigned bin_count[kBins];  // a block's counts; then, in block 0, their prefix sums
    unsigned candidate_rank[kMaxCandidates];  // the small top-k path: how many candidates lie above each
  };
  union {
    unsigned bin_fixed[kBins];  // a block's bin masses in fixed point while the histogram is built
    double bin_mass[kBins];     // then, in block 0, the prefix sums of the bins' masses
    u64 own[kMaxCandidates];    // the small top-k path: a block's candidates before they go to block 0
    struct {                    // ... then block 0's candidates that may be among the k best, and the k best in order
      u64 kept[kMaxCandidates];
      u64 best[kMaxSmallTopK];
    } select;
  };
  // Block 0's gathered order keys, sorted in place (first = most likely).
  union {
    u64 candidates[kMaxCandidates];
    struct {  // one bin's tokens by sub-bin: a block's counts and weights; block 0's prefix sums
      unsigned count[kSubBins];
      unsigned fixed[kSubBins];
      unsigned cum_count[kSubBins];
      u64 cum_fixed[kSubBins];
    } sub;
  };
  u64 exchange[2][4];  // cluster_allreduce's and cluster_exclusive_scan's slots, used in turn
  u64 reduced[4];      // their result, for the block
  u64 warp_partial[kWarps][4];
  u64 decision[2];     // share_from_block0's slots, used in turn
  alignas(16) float bounds[kWarps * kBoundsPerWarp];  // the warps' largest thread maxima (the small top-k bound)
  u64 scratch;         // block 0's locate
  int gathered;        // in block 0: candidates gathered so far (every block adds to it)
  int gathered_top;    // ... by the small top-k path for top-n logprobs (a counter of its own: never reset)
  int own_count, own_base;  // the small top-k path: a block's candidates, and where they go in block 0's
  int newest_found;    // the row's input token was among its penalty entries
  int penalised_nonfinite;  // the lowest id whose raw logit the penalties changed and was not finite
};
// Two blocks a multiprocessor (228 KB) with a seventh of a 151,936-token row each (86,832 bytes),
// 1 KB reserved per block.
static_assert(sizeof(Shared) <= (233472 - 2 * 1024) / 2 - 86832, "two 7-way Qwen3 blocks fit a multiprocessor");
static_assert(kMaxCandidates <= kBins && kMaxSmallTopK <= 2 * 32 && kWarps * kBoundsPerWarp >= kMaxSmallTopK && kBoundsPerWarp % 4 == 0,
              "the small top-k path's arrays");
static_assert(sizeof(u64) * (kMaxCandidates + kMaxSmallTopK) <= sizeof(double) * kBins, "fits the union");
static_assert(3 * sizeof(unsigned) * kSubBins + sizeof(u64) * kSubBins <= sizeof(u64) * kMaxCandidates, "fits the union");

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

#include "kernels/sampling/sample_rows_row.cuh"
#include "kernels/sampling/sample_rows_histogram.cuh"
#include "kernels/sampling/sample_rows_draw.cuh"
#include "kernels/sampling/sample_rows_logprobs.cuh"
#include "kernels/sampling/sample_rows_process.cuh"

// What a row's sampling reads from global memory besides the logits, loaded while the slice
// copies in: its parameters, its input token and this thread's first penalty entry.
struct RowInputs {
  RowSampling rs;
  int newest = 0;
  PenaltyToken first{};
};
__device__ RowInputs load_row_inputs(const SampleRowsArgs& a, int r) {
  RowInputs in;
  in.rs = a.sampling[r];
  if (in.rs.params.has_penalties()) {
    in.newest = a.tokens[a.logit_rows[r]];
    const int e = in.rs.penalty_begin + int(threadIdx.x);
    if (e < in.rs.penalty_end) in.first = a.penalty_tokens[e];
  }
  return in;
}

__device__ void sample_row(Row& row, const SampleRowsArgs& a, int r, const float* logits, const RowInputs& in) {
  const RowSampling& rs = in.rs;
  const SamplingParams& p = rs.params;
  const std::uint32_t* allowed = rs.mask_offset >= 0 ? a.token_masks + rs.mask_offset : nullptr;
  // `penalties`: the copy is processed (a logit bias, penalties, an allowed-token mask) before the draw.
  const bool penalties = p.has_penalties() || rs.bias_end > rs.bias_begin || allowed != nullptr, top_n = p.logprobs > 0;
  const auto process = [&] {
    process_row(row, p, a.logit_bias + rs.bias_begin, rs.bias_end - rs.bias_begin, a.penalty_tokens + rs.penalty_begin,
                rs.penalty_end - rs.penalty_begin, in.newest, rs.newest_is_output != 0, in.first, allowed);
  };
  const bool small_top_k = a.small_top_k && p.temperature > 0.0f && p.top_k >= 1 && p.top_k <= kMaxSmallTopK && p.top_k < a.vocab;
  // A thread's processed maximum, before the reduction, gives its share of the small top-k bound.
  const auto with_bound = [&](RowStats local) {
    if (small_top_k) local.bound = small_top_k_bound(row, local.max, p.top_k);
    return local;
  };
  RowStats s;
  if (p.logprobs < 0) {
    // One pass over the processed row, the penalties first: the raw row's non-finite logits are
    // those the pass finds and those the penalties changed.
    if (penalties)
      process();
    RowStats local = best_and_nonfinite(row);
    if (penalties) local.nonfinite = min(local.nonfinite, row.sh.penalised_nonfinite);
    mark(row, SampleRowsPhase::kStatsPass);
    s = cluster_allreduce(with_bound(local), StatsOp{}, row);
  } else {
    s = raw_stats(row);
  }
  if (top_n) {  // the top-n raw logits before the penalties change the copy
    const int n = min(p.logprobs, a.vocab);
    s.max = s.raw_max, s.id = s.raw_id;
    // This thread's raw maximum bounds the top n, and without penalties the draw's k best too.
    if (a.small_top_k && n <= kMaxSmallTopK) s.top_bound = small_top_k_bound(row, s.raw_max, n);
    if (!penalties) s = with_bound(s);
    s = cluster_allreduce(s, StatsOp{}, row);
    if (s.nonfinite == INT_MAX)
      top_logprobs(row, n, s.raw_max, s.top_bound, s.raw_max + logf(s.raw_sum), a.top_logprobs + std::size_t(r) * kMaxTopLogprobs);
  }
  if (p.logprobs >= 0 && (s.nonfinite == INT_MAX || !top_n)) {
    if (penalties)
      process();
    if (penalties || !top_n) {
      RowStats local = top_n ? empty_stats() : s;
      if (penalties) processed_best(row, local);
      else local.max = local.raw_max, local.id = local.raw_id;
      const RowStats all = cluster_allreduce(with_bound(local), StatsOp{}, row);
      if (top_n) s.max = all.max, s.id = all.id, s.bound = all.bound;
      else s = all;
    }
  }
  LogitSummary summary{};
  if (s.nonfinite != INT_MAX) {
    summary.nonfinite = s.nonfinite;
    summary.nonfinite_value = logits[s.nonfinite];
    if (row.rank == 0 && threadIdx.x == 0) a.summaries[r] = summary;
    return;
  }
  mark(row, SampleRowsPhase::kStats);
  int token = p.temperature == 0.0f ? s.id : draw(row, p, rs.step, s.max, s.bound, a.vocab);
  // (a draw whose sums round past the allowed tokens' would land on a disallowed one of weight 0)
  if (allowed != nullptr && !(allowed[token / 32] >> (token % 32) & 1u)) token = s.id;
  mark(row, SampleRowsPhase::kDrawn);
  if (row.rank == 0 && threadIdx.x == 0) {
    summary.token = token;
    summary.logprob = p.logprobs >= 0 ? logits[token] - (s.raw_max + logf(s.raw_sum)) : 0.0f;
    a.summaries[r] = summary;
  }
}

#endif  // __CUDA_ARCH__ >= 900

__global__ void __launch_bounds__(kThreads, 2) sample_rows_kernel(SampleRowsArgs a, int slice_len) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ Shared sh;
  extern __shared__ float4 dynamic_smem[];
  wait_for_prior_grids();
  allow_next_grid();
  cg::cluster_group cluster = cg::this_cluster();
  const int blocks = int(cluster.num_blocks());
  const int r = int(blockIdx.x) / blocks;
  const unsigned rank = cluster.block_rank();
  Row row{cluster, rank, blocks, sh, reinterpret_cast<float*>(dynamic_smem), 0, int(rank) * slice_len, 0, 0,
          a.phase_clocks ? a.phase_clocks + std::size_t(r) * kSampleRowsPhases : nullptr};
  mark(row, SampleRowsPhase::kStart);
  row.n = max(0, min(slice_len, a.vocab - row.base));
  if (threadIdx.x == 0) sh.gathered = 0, sh.gathered_top = 0;
  const float* logits = a.logits + std::size_t(r) * std::size_t(a.vocab);
  RowInputs in;
  if (a.vocab % 4 == 0 && reinterpret_cast<std::uintptr_t>(a.logits) % 16 == 0) {
    // Slices start 16-byte aligned: the copy engine brings the slice in, 16 KB a copy.
    __shared__ SharedBarrier loaded;
    if (threadIdx.x == 0) {
      loaded.init(1);
      SharedBarrier::fence_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      const std::uint64_t policy = l2_evict_first_policy();  // read once
      const unsigned bytes = unsigned(row.n) * 4u;
      for (unsigned at = 0; at < bytes; at += 16384u)
        bulk_copy_to_shared(reinterpret_cast<char*>(row.x) + at, reinterpret_cast<const char*>(logits + row.base) + at,
                            min(16384u, bytes - at), loaded, policy);
      loaded.arrive_expecting(bytes);
    }
    in = load_row_inputs(a, r);
    loaded.wait(0);
  } else {
    in = load_row_inputs(a, r);
    for (int i = int(threadIdx.x); i < row.n; i += kThreads) row.x[i] = __ldcs(logits + row.base + i);
  }
  __syncthreads();
  mark(row, SampleRowsPhase::kLoaded);
  sample_row(row, a, r, logits, in);
  cluster.sync();  // no block leaves while another may still read its shared memory
  mark(row, SampleRowsPhase::kEnd);
#endif
}

// A block's slice of the row, rounded up to 16 bytes.
std::size_t slice_floats(int vocab, int blocks) { return std::size_t((vocab + blocks - 1) / blocks + 3) / 4 * 4; }

// Allows the kernel `smem` bytes of dynamic shared memory (once per size that grows), with the
// whole carveout as shared memory (two blocks of a Qwen3 row's eighth need 218 of its 228 KB).
void configure_kernel(std::size_t smem) {
  static std::mutex mutex;
  static std::size_t configured = 0;
  const std::lock_guard<std::mutex> lock(mutex);
  if (smem <= configured) return;
  ASYNCT_CUDA_CHECK(cudaFuncSetAttribute(sample_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  ASYNCT_CUDA_CHECK(cudaFuncSetAttribute(sample_rows_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
  configured = smem;
}

bool fits_shared_memory(int vocab, int blocks) {
  // A bin's fixed-point sum in one block stays below 2^32: at most 65,535 tokens a slice.
  return slice_floats(vocab, blocks) <= 65535 &&
         slice_floats(vocab, blocks) * sizeof(float) + sizeof(Shared) <= std::size_t(current_device_info().shared_memory_per_block_optin);
}

// How many clusters of `blocks` blocks fit the device at once (cudaOccupancyMaxActiveClusters:
// a cluster's blocks share one GPC), once per device, vocabulary and cluster size.
int resident_clusters(int vocab, int blocks) {
  static std::mutex mutex;
  static std::map<std::tuple<int, int, int>, int> known;
  int device = 0;
  ASYNCT_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(device, vocab, blocks);
  if (const auto it = known.find(key); it != known.end()) return it->second;
  const std::size_t smem = slice_floats(vocab, blocks) * sizeof(float);
  configure_kernel(smem);
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(blocks));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = unsigned(blocks);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  config.attrs = &attr;
  config.numAttrs = 1;
  int clusters = 0;
  ASYNCT_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, sample_rows_kernel, &config));
  return known[key] = clusters;
}

}  // namespace

bool device_sampling_supported(int vocab) {
  return current_device_info().major >= 9 && vocab >= 1 && fits_shared_memory(vocab, kMaxClusterBlocks);
}

SampleRowsLayout sample_rows_layout(int rows, int vocab) {
  check(rows >= 1, "sample_rows: bad row count ", rows);
  check(device_sampling_supported(vocab), "sample_rows: this device cannot sample a ", vocab,
        "-token vocabulary (needs sm_90 and the row in one cluster's shared memory)");
  // The fewest turns of rows, 8 blocks a row on ties. The H200's GPCs hold 30 eight-block
  // clusters at two blocks a multiprocessor, so 32 rows in 8-block clusters take two turns (32 seven-block clusters fit).
  const SampleRowsLayout eight{kMaxClusterBlocks, resident_clusters(vocab, kMaxClusterBlocks)};
  if (rows <= eight.resident_clusters || !fits_shared_memory(vocab, kMaxClusterBlocks - 1)) return eight;
  const SampleRowsLayout seven{kMaxClusterBlocks - 1, resident_clusters(vocab, kMaxClusterBlocks - 1)};
  const auto turns = [&](const SampleRowsLayout& l) { return l.resident_clusters > 0 ? (rows + l.resident_clusters - 1) / l.resident_clusters : INT_MAX; };
  return turns(seven) < turns(eight) ? seven : eight;
}

void launch_sample_rows(const SampleRowsArgs& a, cudaStream_t stream) {
  check(a.rows >= 0 && a.vocab >= 1, "sample_rows: bad sizes (rows ", a.rows, ", vocab ", a.vocab, ")");
  if (a.rows == 0) return;
  check(a.logits && a.sampling && a.tokens && a.logit_rows && a.summaries, "sample_rows: null pointer");
  check(a.cluster_blocks == 0 || a.cluster_blocks == kMaxClusterBlocks || a.cluster_blocks == kMaxClusterBlocks - 1,
        "sample_rows: cluster_blocks is 0, 7 or 8, not ", a.cluster_blocks);
  const int blocks = a.cluster_blocks ? a.cluster_blocks : sample_rows_layout(a.rows, a.vocab).cluster_blocks;
  check(device_sampling_supported(a.vocab) && fits_shared_memory(a.vocab, blocks), "sample_rows: this device cannot sample a ",
        a.vocab, "-token vocabulary in ", blocks, "-block clusters (needs sm_90 and the row in one cluster's shared memory)");
  const std::size_t smem = slice_floats(a.vocab, blocks) * sizeof(float);
  configure_kernel(smem);
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(a.rows) * unsigned(blocks));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attrs[2]{};
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = unsigned(blocks);
  attrs[0].val.clusterDim.y = 1;
  attrs[0].val.clusterDim.z = 1;
  attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[1].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attrs;
  config.numAttrs = dependent_launch_enabled() ? 2 : 1;
  ASYNCT_CUDA_CHECK(cudaLaunchKernelEx(&config, sample_rows_kernel, a, int(slice_floats(a.vocab, blocks))));
  check_launch("sample_rows");
}

}  // namespace asynct::kernels
