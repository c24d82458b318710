// The top-n raw logprobs of a row, found before the penalties change its copy.
// Included once, by sample_rows.cu, inside its anonymous namespace and its sm_90 section (it uses
// that file's constants and Shared): one job of the sampling kernel, not a header of its own.
#pragma once

// The n largest raw logits (n <= kMaxTopLogprobs), written by block 0 as logprobs. With a bound
// from step 1 (> -inf) on the raw row's n-th logit, as the small top-k path takes its k best;
// otherwise, or when those candidates overflow the gather, the bins up to the one holding the
// n-th are gathered and sorted. Ends with a cluster barrier, after which block 0's candidates
// are free for the draw.
__device__ void top_logprobs(Row& row, int n, float peak, float bound, float log_sum, TopLogprob* out) {
  Shared& sh = row.sh;
  if (bound > -INFINITY) {
    const int c = gather_at_or_above(row, bound, sh.gathered_top);
    if (c >= n && c <= kMaxCandidates) {
      if (row.rank == 0) {
        select_best(sh, c, n, peak, bound);
        for (int j = int(threadIdx.x); j < n; j += kThreads)
          out[j] = TopLogprob{id_of(sh.candidates[j]), value_of(sh.candidates[j]) - log_sum};
      }
      row.cluster.sync();
      return;
    }
  }
  build_histogram(row, peak, 1.0f, false);
  const u64 hi = share_from_block0(row, row.rank == 0 ? u64(bin_reaching_count(sh, u64(n))) | (u64(sh.bin_count[bin_reaching_count(sh, u64(n))]) << 32) : 0);
  int c = int(hi >> 32);
  if (c <= kMaxCandidates) {
    gather(row, peak, 1.0f, 0, int(hi & 0xffffffffu), -1);
  } else {
    // Ties over a whole bin: the n-th key by bisection, then exactly the n keys from it.
    const u64 nth = largest_key_where(row, peak, 1.0f, 0.0f, [&](CountMass m) { return m.count >= u64(n); });
    u64* dst = row.cluster.map_shared_rank(sh.candidates, 0);
    int* counter = row.cluster.map_shared_rank(&sh.gathered, 0);
    for (int i = int(threadIdx.x); i < row.n; i += kThreads) {
      const u64 key = order_key(row.x[i], row.base + i);
      if (key >= nth) dst[atomicAdd(counter, 1)] = key;
    }
    row.cluster.sync();
    c = n;
  }
  if (row.rank == 0) {
    sort_candidates(sh, c);
    for (int j = int(threadIdx.x); j < n; j += kThreads)
      out[j] = TopLogprob{id_of(sh.candidates[j]), value_of(sh.candidates[j]) - log_sum};
    if (threadIdx.x == 0) sh.gathered = 0;
  }
  row.cluster.sync();
}
