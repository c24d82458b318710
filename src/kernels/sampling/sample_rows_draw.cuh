// The draw of a processed row (temperature > 0): the head walked in block 0 (step 3), the small
// top-k path (the k best gathered at or above step 1's bound), the histogram's places (step 4),
// the bisection fallback (step 5).
// Included once, by sample_rows.cu, inside its anonymous namespace and its sm_90 section (it uses
// that file's constants and Shared): one job of the sampling kernel, not a header of its own.
#pragma once

// The head: the tokens of bins 0..head_bin(), which hold every place the draw needs: top-k's
// k-th token when top-k cuts (top-p's and min-p's cuts and the draw come after it in the order);
// else top-p's cut and min-p's (a bin more for expf's rounding), whichever comes first; with no
// cut, the draw itself. A k-th token past 48 nats (a peaked row's) ends the head at the last bin
// but one: draw_on_head treats the tokens beyond as weightless (each < e^-48 of the top token).
// Block 0, on the prefix sums (with top-k, of the counts alone).
__device__ int head_bin(const Shared& sh, const SamplingParams& p, double u, double total, int vocab) {
  if (p.top_k > 0 && p.top_k < vocab) {
    const int bin = bin_reaching_count(sh, u64(p.top_k));
    return bin == kBins - 1 && sh.bin_count[kBins - 2] <= unsigned(kMaxCandidates) ? kBins - 2 : bin;
  }
  int last = kBins - 1;
  if (p.top_p < 1.0f) last = bin_reaching_mass(sh, double(p.top_p) * total, false);
  if (p.min_p > 0.0f) last = min(last, min(bin_of_depth(-logf(p.min_p)) + 1, kBins - 1));
  if (p.top_p >= 1.0f && p.min_p <= 0.0f) last = bin_reaching_mass(sh, u * total, true);
  return last;
}

// Who walks the head in block 0: the whole block (any head), or its first warp (a head of at most
// 64 tokens, with no block barriers). Member m holds the sorted head's tokens 2m and 2m + 1.
struct BlockTeam {
  Shared& sh;
  static constexpr int kMaxHead = 2 * kThreads;
  __device__ int member() const { return int(threadIdx.x); }
  __device__ void sort(int c) const { sort_candidates(sh, c); }
  __device__ u64 sum(u64 v) const { return block_allreduce(v, SumOp{}, sh); }
  __device__ double exclusive_sum(double v) const { return exclusive_block_scan(CountWeight{0, v}, sh).mass; }
  __device__ double from(double v, int m) const {  // member m's v
    __syncthreads();
    if (m == member()) sh.scratch = u64(__double_as_longlong(v));
    __syncthreads();
    return __longlong_as_double((long long)(sh.scratch));
  }
};
static_assert(BlockTeam::kMaxHead == kMaxCandidates, "the block walks any head the gather holds");
struct WarpTeam {
  Shared& sh;
  static constexpr int kMaxHead = 64;
  __device__ int member() const { return int(threadIdx.x % 32); }
  __device__ void sort(int c) const { rank_sort<32>(sh, c, member(), [] { __syncwarp(); }); }
  __device__ u64 sum(u64 v) const {
#pragma unroll
    for (int mask = 16; mask > 0; mask /= 2) v += shuffle_xor(v, mask);
    return v;
  }
  __device__ double exclusive_sum(double v) const {
    const int lane = member();
    double inclusive = v;
#pragma unroll
    for (int offset = 1; offset < 32; offset *= 2) {
      const double up = shuffle_from(inclusive, lane >= offset ? lane - offset : lane);
      if (lane >= offset) inclusive += up;
    }
    return inclusive - v;
  }
  __device__ double from(double v, int m) const { return shuffle_from(v, m); }
};

// The team, with the head's c tokens (at most Team::kMaxHead) gathered into block 0: sorts them
// (unless `sorted`) and takes every cut and the draw on them, in the host sampler's order. Each token weighs
// its bin's fixed-point share, as the histogram sums it. `total` is the row's weight (without
// top-k). With top-k the kept weights are the head's own: top-k's tokens past the head (past 48
// nats) count as weightless. Returns -1 when a place the draw needs lies past the head (the
// histogram's and the head's sums round apart); every member returns the same.
template <typename Team>
__device__ int draw_on_head(const Team& team, const SamplingParams& p, double u, float peak, double total, int c, int vocab,
                            bool sorted = false) {
  const u64* head = team.sh.candidates;
  if (!sorted) team.sort(c);
  const float t = p.temperature;
  const int m = team.member();
  double w[2];
  for (int k = 0; k < 2; ++k) {
    const int i = 2 * m + k;
    w[k] = 0.0;
    if (i < c) {
      const float d = depth(value_of(head[i]), peak, t);
      const int bin = bin_of_depth(d);
      w[k] = double(fixed_in_bin(d, bin)) * bin_unit(bin);
    }
  }
  const double start = team.exclusive_sum(w[0] + w[1]);
  const double through[2] = {start + w[0], start + w[0] + w[1]};
  // The index of the first token whose weight through it reaches x (>= x; > x when strict); c if none.
  const auto first_reaching = [&](double x, bool strict) {
    u64 below = 0;
    for (int k = 0; k < 2; ++k) below += 2 * m + k < c && (strict ? through[k] <= x : through[k] < x) ? 1 : 0;
    return int(team.sum(below));
  };
  const auto through_token = [&](int j) { return team.from(through[j % 2], j / 2); };
  const bool top_k = p.top_k > 0 && p.top_k < vocab;
  bool cut = top_k;  // else the kept set is the whole row
  int keep = top_k ? min(p.top_k, c) : c;
  if (p.top_p < 1.0f) {
    const double base = top_k ? through_token(keep - 1) : total;
    const int j = first_reaching(double(p.top_p) * base, false);
    if (j < keep) keep = j + 1, cut = true;
    else if (!top_k && p.min_p <= 0.0f) return -1;
  }
  if (p.min_p > 0.0f) {  // the heavy tokens are a prefix of the order, the top one among them
    u64 heavy = 0;
    for (int k = 0; k < 2; ++k) heavy += 2 * m + k < c && expf(-depth(value_of(head[2 * m + k]), peak, t)) >= p.min_p ? 1 : 0;
    const int at_least = max(1, int(team.sum(heavy)));
    keep = cut ? min(keep, at_least) : at_least;
    cut = true;
  }
  const double kept = cut ? through_token(keep - 1) : total;
  const int j = first_reaching(u * kept, true);
  if (!cut && j >= c) return -1;
  return id_of(head[cut ? min(j, keep - 1) : j]);
}

// The small top-k path (step 2), in step 1: this thread's share of the bound on the row's k-th
// logit, from the block's thread maxima (`thread_max`, -FLT_MAX for a thread without tokens).
// Each warp sorts its maxima (a bitonic network over the lanes) and puts its 8 largest in shared
// memory; a value among those 128 with k of them at or above it is held by k threads, so k of the
// block's tokens lie at or above it. The largest such value, over the cluster (StatsOp's max),
// bounds the row's k-th logit from below. Every thread of the block calls it; -inf from the
// threads that hold no such value.
__device__ float small_top_k_bound(Row& row, float thread_max, int k) {
  Shared& sh = row.sh;
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32);
  __syncthreads();  // an earlier call's readers of bounds are done
  float v = thread_max;
#pragma unroll
  for (int size = 2; size <= 32; size *= 2)
#pragma unroll
    for (int stride = size / 2; stride > 0; stride /= 2) {
      const float other = __shfl_xor_sync(0xffffffffu, v, stride);
      v = ((lane & stride) == 0) == ((lane & size) == 0) ? fmaxf(v, other) : fminf(v, other);  // descending by lane
    }
  if (lane < kBoundsPerWarp) sh.bounds[warp * kBoundsPerWarp + lane] = v;
  __syncthreads();
  float share = -INFINITY;
  if (threadIdx.x < unsigned(kWarps * kBoundsPerWarp)) {
    const float value = sh.bounds[threadIdx.x];
    int at_or_above = 0;
    const float4* all = reinterpret_cast<const float4*>(sh.bounds);
#pragma unroll 8
    for (int i = 0; i < kWarps * kBoundsPerWarp / 4; ++i) {
      const float4 q = all[i];
      at_or_above += (q.x >= value) + (q.y >= value) + (q.z >= value) + (q.w >= value);
    }
    if (at_or_above >= k) share = value;
  }
  return share;  // (the cluster reduction's block barriers come before bounds is written again)
}

// The warp's takers append their keys (key(), made by the takers only) to out, one counter
// update a warp; past kMaxCandidates they are only counted. Every lane of the warp calls it.
template <typename Key>
__device__ __forceinline__ void warp_append(bool take, Key&& key, u64* out, int* counter) {
  const unsigned takers = __ballot_sync(0xffffffffu, take);
  if (takers == 0) return;
  const unsigned lane = threadIdx.x % 32;
  int base = 0;
  if (lane == 0) base = atomicAdd(counter, __popc(takers));
  base = __shfl_sync(0xffffffffu, base, 0);
  const int at = base + __popc(takers & ((1u << lane) - 1u));
  if (take && at < kMaxCandidates) out[at] = key();
}

// Every block: the order keys of its tokens at or above `bound`, gathered in its own shared
// memory, then appended to block 0's candidates (one cluster-wide counter update a block); block
// 0's counter (its copy of `counter`, zero before) may pass kMaxCandidates. Returns the count,
// the same in every block, after a cluster barrier.
__device__ int gather_at_or_above(Row& row, float bound, int& own_counter) {
  Shared& sh = row.sh;
  if (threadIdx.x == 0) sh.own_count = 0;
  __syncthreads();
  const int quads = row.n / 4;
  for (int j0 = 0; j0 < quads; j0 += kThreads) {  // the same trip count in every warp
    const int j = j0 + int(threadIdx.x);
    float4 q = make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
    if (j < quads) q = reinterpret_cast<const float4*>(row.x)[j];
    const int id = row.base + 4 * j;
    warp_append(q.x >= bound, [&] { return order_key(q.x, id); }, sh.own, &sh.own_count);
    warp_append(q.y >= bound, [&] { return order_key(q.y, id + 1); }, sh.own, &sh.own_count);
    warp_append(q.z >= bound, [&] { return order_key(q.z, id + 2); }, sh.own, &sh.own_count);
    warp_append(q.w >= bound, [&] { return order_key(q.w, id + 3); }, sh.own, &sh.own_count);
  }
  const int i = 4 * quads + int(threadIdx.x);  // the last n % 4 tokens
  const float x = i < row.n ? row.x[i] : -INFINITY;
  warp_append(x >= bound, [&] { return order_key(x, row.base + i); }, sh.own, &sh.own_count);
  __syncthreads();
  int* counter = row.cluster.map_shared_rank(&own_counter, 0);
  const int own = sh.own_count;
  if (threadIdx.x == 0) sh.own_base = own ? atomicAdd(counter, own) : 0;
  __syncthreads();
  u64* out = row.cluster.map_shared_rank(sh.candidates, 0);
  for (int k = int(threadIdx.x); k < min(own, kMaxCandidates); k += kThreads)
    if (sh.own_base + k < kMaxCandidates) out[sh.own_base + k] = sh.own[k];
  row.cluster.sync();
  return *counter;
}

// Block 0: the k best of its c gathered candidates (k <= c <= kMaxCandidates), in order, as the
// first k candidates. The candidates are counted into 256 bins of value between the row's
// maximum and the bound; those up to the bin that reaches k hold the k best (a higher bin holds
// only lower values), ~k of them. Each of those is ranked by the number above it (keys are
// unique), over segments of them so that ~2 (key, segment) pairs fall to each thread.
__device__ void select_best(Shared& sh, int c, int k, float peak, float bound) {
  constexpr int kSelectBins = 256;
  static_assert(kSelectBins == 8 * 32 && kSelectBins <= kMaxCandidates, "one warp scans the bins, 8 a lane");
  unsigned* bins = sh.candidate_rank;
  for (int b = int(threadIdx.x); b < kSelectBins; b += kThreads) bins[b] = 0;
  float scale = peak > bound ? float(kSelectBins) / (peak - bound) : 0.0f;
  if (!isfinite(scale)) scale = 0.0f;  // a bound of -FLT_MAX: one bin (a small vocabulary)
  const auto bin_of = [&](u64 key) { return min(int((peak - value_of(key)) * scale), kSelectBins - 1); };
  __syncthreads();
  for (int i = int(threadIdx.x); i < c; i += kThreads) atomicAdd(&bins[bin_of(sh.candidates[i])], 1u);
  __syncthreads();
  if (threadIdx.x < 32) {  // the first bin whose prefix count reaches k
    const int lane = int(threadIdx.x);
    unsigned own = 0;
    for (int b = 8 * lane; b < 8 * lane + 8; ++b) own += bins[b];
    unsigned inclusive = own;
#pragma unroll
    for (int offset = 1; offset < 32; offset *= 2) {
      const unsigned up = __shfl_up_sync(0xffffffffu, inclusive, offset);
      if (lane >= offset) inclusive += up;
    }
    const unsigned reached = __ballot_sync(0xffffffffu, inclusive >= unsigned(k));  // the last lane always reaches
    const int first = __ffs(int(reached)) - 1;
    if (lane == first) {
      unsigned cumulative = inclusive - own;
      int b = 8 * lane;
      while ((cumulative += bins[b]) < unsigned(k)) ++b;
      sh.scratch = u64(b);
    }
    if (lane == 0) sh.own_count = 0;
  }
  __syncthreads();
  const int last_bin = int(sh.scratch);
  for (int i0 = 0; i0 < c; i0 += kThreads) {  // the same trip count in every warp
    const int i = i0 + int(threadIdx.x);
    const u64 key = i < c ? sh.candidates[i] : 0;
    warp_append(i < c && bin_of(key) <= last_bin, [&] { return key; }, sh.select.kept, &sh.own_count);
  }
  __syncthreads();
  const int n = sh.own_count;
  unsigned* rank = sh.candidate_rank;  // (the bins are done with)
  for (int i = int(threadIdx.x); i < n; i += kThreads) rank[i] = 0;
  __syncthreads();
  const int segments = max(1, 2 * kThreads / n), length = (n + segments - 1) / segments;
  for (int item = int(threadIdx.x); item < n * segments; item += kThreads) {
    const int i = item % n, from = (item / n) * length, to = min(n, from + length);
    const u64 key = sh.select.kept[i];
    unsigned above = 0;
    for (int m = from; m < to; ++m) above += sh.select.kept[m] > key ? 1u : 0u;
    if (above) atomicAdd(&rank[i], above);
  }
  __syncthreads();
  for (int i = int(threadIdx.x); i < n; i += kThreads)
    if (rank[i] < unsigned(k)) sh.select.best[rank[i]] = sh.select.kept[i];
  __syncthreads();
  if (int(threadIdx.x) < k) sh.candidates[threadIdx.x] = sh.select.best[threadIdx.x];
  __syncthreads();
}

// The small top-k path's draw (1 <= top_k <= kMaxSmallTopK, top_k < vocab): every block gathers
// its tokens at or above the bound from step 1; block 0 keeps the k best in order and its first
// warp walks them as draw_on_head does the histogram's head, with the same weights, so the two
// paths draw the same token. A k-th token past 48 nats ends the head before the last bin, as
// head_bin does. Returns the token in every block, or -1 when the candidates do not fit the
// gather (every block then goes on to the histogram).
__device__ int draw_small_top_k(Row& row, const SamplingParams& p, double u, float peak, float bound, int vocab) {
  Shared& sh = row.sh;
  const bool zero = row.rank == 0;
  const int c = gather_at_or_above(row, bound, sh.gathered);
  mark(row, SampleRowsPhase::kCandidates);
  if (c < p.top_k || c > kMaxCandidates) {
    row.cluster.sync();  // every block has read the count
    if (zero && threadIdx.x == 0) sh.gathered = 0;
    __syncthreads();
    return -1;
  }
  int token = 0;
  if (zero) {
    select_best(sh, c, p.top_k, peak, bound);
    mark(row, SampleRowsPhase::kSelected);
    if (threadIdx.x < 32) {
      int head = 0;
      for (int k = 0; k < 2; ++k) {
        const int i = 2 * int(threadIdx.x) + k;
        head += i < p.top_k && bin_of_depth(depth(value_of(sh.candidates[i]), peak, p.temperature)) < kBins - 1 ? 1 : 0;
      }
#pragma unroll
      for (int mask = 16; mask > 0; mask /= 2) head += __shfl_xor_sync(0xffffffffu, head, mask);
      token = draw_on_head(WarpTeam{sh}, p, u, peak, 0.0, head, vocab, true);
    }
  }
  mark(row, SampleRowsPhase::kHeadDrawn);
  token = int(unsigned(share_from_block0(row, u64(unsigned(token)))));
  if (token < 0 && zero && threadIdx.x == 0) sh.gathered = 0;  // (every block has read the count)
  __syncthreads();
  return token;
}

// The processed row's draw (temperature > 0), in the host sampler's order: the token id,
// in block 0 (the others may return anything). The kept set is the first `keep` tokens of the
// order; each cut and the draw is a place found by locate().
// With the small top-k path's bound from step 1 (> -inf), that path first.
__device__ int draw(Row& row, const SamplingParams& p, std::uint64_t step, float peak, float bound, int vocab) {
  Shared& sh = row.sh;
  const float t = p.temperature;
  const double u = uniform_draw(p.seed, step);
  const bool top_k = p.top_k > 0 && p.top_k < vocab;
  if (bound > -INFINITY) {
    const int token = draw_small_top_k(row, p, u, peak, bound, vocab);
    if (token >= 0) return token;
  }
  build_histogram(row, peak, t, !top_k);
  mark(row, SampleRowsPhase::kHistogram);
  const bool zero = row.rank == 0;
  double total = zero && !top_k ? sh.bin_mass[kBins - 1] : 0.0;
  u64 head = 0;  // the head's last bin, and its tokens
  if (zero) {
    const int last = head_bin(sh, p, u, total, vocab);
    head = u64(last) | (u64(sh.bin_count[last]) << 32);
  }
  head = share_from_block0(row, head);
  mark(row, SampleRowsPhase::kHeadChosen);
  if ((head >> 32) <= u64(kMaxCandidates)) {
    gather(row, peak, t, 0, int(head & 0xffffffffu), -1);
    mark(row, SampleRowsPhase::kHeadGathered);
    // Block 0's first warp walks a short head alone; share_from_block0 takes its first lane's token.
    const int c = int(head >> 32);
    int token = 0;
    if (zero && c <= WarpTeam::kMaxHead) {
      if (threadIdx.x < 32) token = draw_on_head(WarpTeam{sh}, p, u, peak, total, c, vocab);
    } else if (zero) {
      token = draw_on_head(BlockTeam{sh}, p, u, peak, total, c, vocab);
    }
    mark(row, SampleRowsPhase::kHeadDrawn);
    token = int(unsigned(share_from_block0(row, u64(unsigned(token)))));
    if (token >= 0) return token;
  }
  // A larger head, or a place past it: the places one by one, on the masses too.
  if (top_k) {
    build_histogram(row, peak, t, true);
    total = zero ? sh.bin_mass[kBins - 1] : 0.0;
  }
  Loaded loaded;
  Place place{};
  bool fits = true;

  // top-k: the first top_k tokens; their weight is top-p's base.
  u64 keep = u64(vocab);
  double base = total;
  if (top_k) {
    keep = u64(p.top_k);
    if (p.top_p < 1.0f) {
      fits = locate(row, peak, t, true, double(keep), false, loaded, &place);
      base = place.through;
    }
  }
  // top-p over what top-k kept: the shortest head whose weight reaches top_p of it.
  if (fits && p.top_p < 1.0f) {
    fits = locate(row, peak, t, false, double(p.top_p) * base, false, loaded, &place);
    keep = min(keep, place.index + 1);
  }
  // min-p: no token below min_p of the top one's weight (the top one always stays).
  if (fits && p.min_p > 0.0f) keep = min(keep, max(u64(1), count_heavy(row, peak, t, p.min_p)));
  keep = share_from_block0(row, keep);  // block 0's, for every block's control flow
  // The kept weight, then the first token whose cumulative weight passes u times it; past the
  // kept set (rounding), its last token, as the host.
  double kept = total;
  if (fits && keep < u64(vocab)) {
    fits = locate(row, peak, t, true, double(keep), false, loaded, &place);
    kept = place.through;
  }
  if (fits) fits = locate(row, peak, t, false, u * kept, true, loaded, &place);
  if (fits && share_from_block0(row, zero && place.index >= keep ? 1 : 0))
    fits = locate(row, peak, t, true, double(keep), false, loaded, &place);
  if (fits && share_from_block0(row, zero && place.id < 0 ? 1 : 0)) fits = false;  // (that place had no id)
  if (fits) return place.id;
  return draw_by_bisection(row, p, u, peak, vocab);
}
