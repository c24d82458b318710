// Where the order (logit desc, id asc) reaches a count or a mass: step 2's histogram of depths,
// the gather and sort of a bin's (or sub-bin's) tokens into block 0, the place-finding walk over
// the prefix sums, and step 5's bisection on order keys.
// Included once, by sample_rows.cu, inside its anonymous namespace and its sm_90 section (it uses
// that file's constants and Shared): one job of the sampling kernel, not a header of its own.
#pragma once

// Step 2's histogram by bin_of, with each bin's mass when `mass`, merged over the cluster into
// block 0 as prefix sums (bin_count[b]: tokens in bins 0..b; bin_mass[b]: their weight). The last
// bin's tokens (a peaked row's most) are summed in registers and added once a warp. Block r
// merges bins [r * range, (r + 1) * range) of every block, one bin a thread, and stores their
// prefix sums into block 0. Every block returns after a cluster barrier.
__device__ void build_histogram(Row& row, float peak, float temperature, bool mass) {
  Shared& sh = row.sh;
  for (int b = int(threadIdx.x); b < kBins; b += kThreads) sh.bin_count[b] = 0, sh.bin_fixed[b] = 0;
  __syncthreads();
  unsigned deep = 0, deep_fixed = 0;
  for_each_logit(row, [&](float x, int) {
    const float d = depth(x, peak, temperature);
    const int bin = bin_of_depth(d);
    const unsigned fixed = mass ? fixed_in_bin(d, bin) : 0u;
    if (bin == kBins - 1) {
      deep += 1, deep_fixed += fixed;
      return;
    }
    atomicAdd(&sh.bin_count[bin], 1u);
    if (mass) atomicAdd(&sh.bin_fixed[bin], fixed);
  });
#pragma unroll
  for (int mask = 16; mask > 0; mask /= 2) {
    deep += __shfl_xor_sync(0xffffffffu, deep, mask);
    deep_fixed += __shfl_xor_sync(0xffffffffu, deep_fixed, mask);
  }
  if (threadIdx.x % 32 == 0 && deep != 0) atomicAdd(&sh.bin_count[kBins - 1], deep), atomicAdd(&sh.bin_fixed[kBins - 1], deep_fixed);
  mark(row, SampleRowsPhase::kHistogramPass);
  row.cluster.sync();
  mark(row, SampleRowsPhase::kHistogramMet);
  const int range = (kBins + row.blocks - 1) / row.blocks;
  const int bin = int(row.rank) * range + int(threadIdx.x);
  CountWeight own{0, 0.0};
  if (int(threadIdx.x) < range && bin < kBins) {
    unsigned counts[kMaxClusterBlocks], fixed[kMaxClusterBlocks];  // every load issued before any is used
#pragma unroll
    for (int r = 0; r < kMaxClusterBlocks; ++r) {
      counts[r] = r < row.blocks ? row.cluster.map_shared_rank(sh.bin_count, r)[bin] : 0u;
      fixed[r] = mass && r < row.blocks ? row.cluster.map_shared_rank(sh.bin_fixed, r)[bin] : 0u;
    }
    u64 mass_fixed = 0;
#pragma unroll
    for (int r = 0; r < kMaxClusterBlocks; ++r) own.count += counts[r], mass_fixed += fixed[r];
    own.mass = double(mass_fixed) * bin_unit(bin);
  }
  const CountWeight in_range = exclusive_block_scan(own, sh);
  // The range's total as its last bin's prefix sum (the same additions, so the prefix sums rise).
  __syncthreads();  // the scan's readers of warp_partial are done
  if (int(threadIdx.x) == range - 1)
    *reinterpret_cast<CountWeight*>(&sh.warp_partial[0][0]) = CountWeight{in_range.count + own.count, in_range.mass + own.mass};
  __syncthreads();
  const CountWeight range_total = *reinterpret_cast<const CountWeight*>(&sh.warp_partial[0][0]);
  // Every block's reads of the bins are done after it: block 0's become its prefix sums.
  const CountWeight before = cluster_exclusive_scan(range_total, row);
  mark(row, SampleRowsPhase::kHistogramScan);
  if (int(threadIdx.x) < range && bin < kBins) {
    row.cluster.map_shared_rank(sh.bin_count, 0)[bin] = unsigned(before.count + in_range.count + own.count);
    row.cluster.map_shared_rank(sh.bin_mass, 0)[bin] = before.mass + in_range.mass + own.mass;
  }
  row.cluster.sync();
}

// Block 0, on the prefix sums: the first bin whose cumulative count reaches `count`.
__device__ int bin_reaching_count(const Shared& sh, u64 count) {
  int lo = 0, hi = kBins - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (u64(sh.bin_count[mid]) >= count) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}
// ... the first bin whose cumulative mass reaches `mass` (>=), or passes it (> when strict).
__device__ int bin_reaching_mass(const Shared& sh, double mass, bool strict) {
  int lo = 0, hi = kBins - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (strict ? sh.bin_mass[mid] > mass : sh.bin_mass[mid] >= mass) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}
__device__ CountWeight before_bin(const Shared& sh, int bin) {
  return bin == 0 ? CountWeight{0, 0.0} : CountWeight{sh.bin_count[bin - 1], sh.bin_mass[bin - 1]};
}

__device__ __forceinline__ int sub_of(float d, int bin) {
  return min(max(int((d * kBinsPerNat - float(bin)) * float(kSubBins)), 0), kSubBins - 1);
}

// Gathers the order keys of the tokens whose bin lies in [lo, hi] (and, with sub >= 0, whose
// sub-bin of bin lo is sub) into block 0's candidates, their number known beforehand (at most
// kMaxCandidates). Every block adds to block 0's counter, which is zero before.
__device__ void gather(Row& row, float peak, float temperature, int lo, int hi, int sub) {
  u64* out = row.cluster.map_shared_rank(row.sh.candidates, 0);
  int* counter = row.cluster.map_shared_rank(&row.sh.gathered, 0);
  for_each_logit(row, [&](float v, int i) {
    const float d = depth(v, peak, temperature);
    const int bin = bin_of_depth(d);
    if (bin >= lo && bin <= hi && (sub < 0 || sub_of(d, bin) == sub)) out[atomicAdd(counter, 1)] = order_key(v, row.base + i);
  });
  row.cluster.sync();  // block 0 holds them all
}

// Sorts the c gathered keys in place, largest first, by a team of kSize threads (block 0's
// whole block, or its first warp) whose barrier is sync: each key's rank is the number of keys
// above it (keys are unique), found by the thread holding it (two a thread).
template <int kSize, typename Sync>
__device__ void rank_sort(Shared& sh, int c, int member, Sync sync) {
  u64 key[2];
  int rank[2] = {0, 0};
  for (int j = 0; j < 2; ++j) key[j] = member + j * kSize < c ? sh.candidates[member + j * kSize] : 0;
  for (int m = 0; m < c; ++m) {
    const u64 other = sh.candidates[m];
    rank[0] += other > key[0] ? 1 : 0;
    rank[1] += other > key[1] ? 1 : 0;
  }
  sync();
  for (int j = 0; j < 2; ++j)
    if (member + j * kSize < c) sh.candidates[rank[j]] = key[j];
  if (member == 0) sh.gathered = 0;  // for the next gather (after a barrier)
  sync();
}
__device__ void sort_candidates(Shared& sh, int c) {
  static_assert(kMaxCandidates == 2 * kThreads, "two keys a thread");
  rank_sort<kThreads>(sh, c, int(threadIdx.x), [] { __syncthreads(); });
}

// Bin `bin`'s tokens by sub-bin, merged into block 0 as prefix sums in the bin's fixed point
// (like build_histogram, one level down); overwrites the candidates.
__device__ void build_sub_histogram(Row& row, float peak, float temperature, int bin) {
  Shared& sh = row.sh;
  const int range = (kSubBins + row.blocks - 1) / row.blocks;
  for (int b = int(threadIdx.x); b < kSubBins; b += kThreads) sh.sub.count[b] = 0, sh.sub.fixed[b] = 0;
  __syncthreads();
  for (int i = int(threadIdx.x); i < row.n; i += kThreads) {
    const float d = depth(row.x[i], peak, temperature);
    if (bin_of_depth(d) != bin) continue;
    const int sub = sub_of(d, bin);
    atomicAdd(&sh.sub.count[sub], 1u);
    atomicAdd(&sh.sub.fixed[sub], fixed_in_bin(d, bin));
  }
  row.cluster.sync();
  const int sub = int(row.rank) * range + int(threadIdx.x);
  CountMass own{0, 0};
  if (int(threadIdx.x) < range && sub < kSubBins)
    for (int r = 0; r < row.blocks; ++r) {
      own.count += row.cluster.map_shared_rank(sh.sub.count, r)[sub];
      own.mass += row.cluster.map_shared_rank(sh.sub.fixed, r)[sub];
    }
  const CountMass in_range = exclusive_block_scan(own, sh);
  __syncthreads();
  if (int(threadIdx.x) == range - 1)
    *reinterpret_cast<CountMass*>(&sh.warp_partial[0][0]) = CountMass{in_range.count + own.count, in_range.mass + own.mass};
  __syncthreads();
  const CountMass range_total = *reinterpret_cast<const CountMass*>(&sh.warp_partial[0][0]);
  const CountWeight before = cluster_exclusive_scan(CountWeight{range_total.count, double(range_total.mass)}, row);
  if (int(threadIdx.x) < range && sub < kSubBins) {
    row.cluster.map_shared_rank(sh.sub.cum_count, 0)[sub] = unsigned(before.count + in_range.count + own.count);
    row.cluster.map_shared_rank(sh.sub.cum_fixed, 0)[sub] = u64(before.mass) + in_range.mass + own.mass;
  }
  row.cluster.sync();
}

// A place in the order (logit desc, id asc): the token at `index` (from 0), its id, and the
// weight of the tokens up to and including it.
struct Place {
  u64 index;
  int id;
  double through;
};

// What block 0 has gathered and sorted: bin `bin`'s tokens (sub < 0) or those of one sub-bin,
// `count` of them after `before_count` tokens of weight `before` in the order; thread t holds
// the prefix weights of the set's tokens 2t and 2t + 1, in the bin's fixed point.
struct Loaded {
  int bin = -1, sub = -2, count = 0;
  u64 before_count = 0;
  double before = 0.0;
  u64 prefix[2] = {0, 0};
};

// Every block: where the order reaches `value` tokens (by_count: the value-th token) or a
// cumulative weight `value` (>= it, or > it when strict): block 0 finds the bin from the
// histogram, and within it the sub-bin when the bin holds more than the gather does; gathers
// and sorts that set (unless loaded already) and walks it. Returns false when even the sub-bin
// is too full (the caller falls back to bisection); the Place is block 0's.
__device__ bool locate(Row& row, float peak, float temperature, bool by_count, double value, bool strict, Loaded& loaded,
                       Place* place) {
  Shared& sh = row.sh;
  const bool zero = row.rank == 0;
  // Block 0 picks the bin and says how full it is.
  int bin = 0;
  u64 in_bin = 0;
  if (zero) {
    bin = by_count ? bin_reaching_count(sh, u64(value)) : bin_reaching_mass(sh, value, strict);
    in_bin = sh.bin_count[bin] - (bin ? sh.bin_count[bin - 1] : 0u);
  }
  const u64 choice = share_from_block0(row, u64(bin) | (in_bin << 32));
  bin = int(choice & 0xffffffffu);
  in_bin = choice >> 32;
  const CountWeight bin_before = zero ? before_bin(sh, bin) : CountWeight{0, 0.0};
  int sub = -1;
  u64 count = in_bin, before_count = bin_before.count;
  double before = bin_before.mass;
  if (in_bin > kMaxCandidates && bin == kBins - 1 && by_count) {
    // The last bin holds every token beyond 48 nats: a place there by count (top-k's k-th, the
    // kept set's last) needs only the weight through it, all but e^-64 of the total; its id is
    // never asked for (the draw cannot land there). A peaked row has most of its tokens there: the
    // random 1.7B model's logits spread ~45 (sqrt(2048) for unit-scale LM-head rows), 200 nats
    // deep at temperature 0.8.
    if (zero) *place = Place{u64(value) - 1, -1, sh.bin_mass[kBins - 1]};
    return true;
  }
  if (in_bin > kMaxCandidates) {  // the sub-bin holding the place
    build_sub_histogram(row, peak, temperature, bin);  // over the candidates: whatever was loaded is gone
    loaded.bin = -1;
    u64 sub_choice = 0;
    if (zero) {
      const double unit = bin_unit(bin);
      int lo = 0, hi = kSubBins - 1;
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        const bool reached = by_count ? before_count + sh.sub.cum_count[mid] >= u64(value)
                                      : (strict ? before + double(sh.sub.cum_fixed[mid]) * unit > value
                                                : before + double(sh.sub.cum_fixed[mid]) * unit >= value);
        if (reached) hi = mid;
        else lo = mid + 1;
      }
      const u64 sub_before_count = lo ? sh.sub.cum_count[lo - 1] : 0, sub_before_fixed = lo ? sh.sub.cum_fixed[lo - 1] : 0;
      count = sh.sub.cum_count[lo] - sub_before_count;
      before_count += sub_before_count;
      before += double(sub_before_fixed) * unit;
      sub_choice = u64(lo) | (count << 32);
    }
    sub_choice = share_from_block0(row, sub_choice);
    sub = int(sub_choice & 0xffffffffu);
    count = sub_choice >> 32;
    if (count > kMaxCandidates) return false;
  }
  if (loaded.bin != bin || loaded.sub != sub) {
    gather(row, peak, temperature, bin, bin, sub);
    loaded.bin = bin, loaded.sub = sub, loaded.count = int(count);
    if (zero) {
      sort_candidates(sh, int(count));
      const int i = 2 * int(threadIdx.x);
      const auto fixed = [&](int k) {
        return k < int(count) ? u64(fixed_in_bin(depth(value_of(sh.candidates[k]), peak, temperature), bin)) : 0;
      };
      const u64 w0 = fixed(i), w1 = fixed(i + 1);
      const u64 start = exclusive_block_scan(CountMass{0, w0 + w1}, sh).mass;
      loaded.prefix[0] = start + w0;
      loaded.prefix[1] = start + w0 + w1;
      loaded.before_count = before_count;
      loaded.before = before;
    }
  }
  if (!zero) return true;
  // Block 0: the set's token at the place, and the weight through it.
  const double unit = bin_unit(bin);
  int j = 0;
  if (by_count) {
    j = int(u64(value) - 1 - loaded.before_count);
  } else {
    u64 below = 0;
    for (int k = 0; k < 2; ++k) {
      const int i = 2 * int(threadIdx.x) + k;
      const double w = loaded.before + double(loaded.prefix[k]) * unit;
      below += i < loaded.count && (strict ? w <= value : w < value) ? 1 : 0;
    }
    j = min(int(block_allreduce(below, SumOp{}, sh)), loaded.count - 1);  // not reached (rounding): the set's last
  }
  __syncthreads();
  if (j / 2 == int(threadIdx.x)) sh.scratch = loaded.prefix[j % 2];
  __syncthreads();
  *place = Place{loaded.before_count + u64(j), id_of(sh.candidates[j]), loaded.before + double(sh.scratch) * unit};
  __syncthreads();
  return true;
}

// Tokens with weight >= min_weight (a prefix of the order), over the row.
__device__ u64 count_heavy(Row& row, float peak, float temperature, float min_weight) {
  u64 n = 0;
  for (int i = int(threadIdx.x); i < row.n; i += kThreads) n += expf(-depth(row.x[i], peak, temperature)) >= min_weight ? 1 : 0;
  return cluster_allreduce(n, SumOp{}, row);
}

// Tokens of the slice with order key >= `at` (and weight >= min_weight when > 0): how many, and
// their weight in 40-bit fixed point. For the bisections.
__device__ CountMass count_from(Row& row, u64 at, float peak, float temperature, float min_weight) {
  CountMass c{0, 0};
  for (int i = int(threadIdx.x); i < row.n; i += kThreads) {
    const float v = row.x[i];
    if (order_key(v, row.base + i) < at) continue;
    const float w = expf(-depth(v, peak, temperature));
    if (min_weight > 0.0f && w < min_weight) continue;
    c.count += 1;
    c.mass += u64(double(w) * kFallbackOne + 0.5);
  }
  return cluster_allreduce(c, SumOp{}, row);
}

// The largest key K with pred(count_from(K)) (pred holds at K = 0 and fails as K grows).
template <typename Pred>
__device__ u64 largest_key_where(Row& row, float peak, float temperature, float min_weight, Pred pred) {
  u64 key = 0;
  for (int bit = 63; bit >= 0; --bit) {
    const u64 next = key | (u64(1) << bit);
    if (pred(count_from(row, next, peak, temperature, min_weight))) key = next;
  }
  return key;
}

// The draw by bisection (step 4).
__device__ int draw_by_bisection(Row& row, const SamplingParams& p, double u, float peak, int vocab) {
  const float t = p.temperature, no_min = 0.0f;
  const u64 k_key = p.top_k > 0 && p.top_k < vocab
                        ? largest_key_where(row, peak, t, no_min, [&](CountMass m) { return m.count >= u64(p.top_k); })
                        : 0;
  u64 cut_key = k_key;
  if (p.top_p < 1.0f) {
    const double needed = double(p.top_p) * double(count_from(row, k_key, peak, t, no_min).mass);
    cut_key = max(cut_key, largest_key_where(row, peak, t, no_min, [&](CountMass m) { return double(m.mass) >= needed; }));
  }
  const double target = u * double(count_from(row, cut_key, peak, t, p.min_p).mass);
  const u64 drawn = largest_key_where(row, peak, t, p.min_p, [&](CountMass m) { return double(m.mass) > target; });
  return id_of(max(drawn, cut_key));
}
