// What the kernel does to a row's shared-memory copy before the draw (the logit bias, the
// penalties, the allowed-token mask), and the slice's best and sums, raw or processed.
// Included once, by sample_rows.cu, inside its anonymous namespace and its sm_90 section (it uses
// that file's constants and Shared): one job of the sampling kernel, not a header of its own.
#pragma once

__device__ void penalise_row(Row& row, const SamplingParams& p, const PenaltyToken* entries, int count, int newest,
                             bool newest_is_output, const PenaltyToken& first);

// Applies the logit bias, then the penalties, then the allowed-token mask (`allowed`, or none)
// to the slice: the bias entries in it, the row's penalty entries and its input token `newest`,
// the tokens the mask leaves out. Notes the lowest id among them whose raw logit was not finite
// (the clamp or the mask hides it).
__device__ void process_row(Row& row, const SamplingParams& p, const LogitBias* bias, int bias_count,
                            const PenaltyToken* entries, int count, int newest, bool newest_is_output,
                            const PenaltyToken& first, const std::uint32_t* allowed) {
  Shared& sh = row.sh;
  if (threadIdx.x == 0) sh.newest_found = 0, sh.penalised_nonfinite = INT_MAX;
  __syncthreads();
  for (int e = int(threadIdx.x); e < bias_count; e += kThreads) {  // ids are distinct: no two threads meet
    const LogitBias b = bias[e];
    if (b.id < row.base || b.id >= row.base + row.n) continue;
    float& v = row.x[b.id - row.base];
    if (!isfinite(v)) atomicMin(&sh.penalised_nonfinite, b.id);
    v = fminf(fmaxf(v + b.bias, -FLT_MAX), FLT_MAX);  // clamped to the finite floats, as the host does
  }
  __syncthreads();
  if (p.has_penalties()) penalise_row(row, p, entries, count, newest, newest_is_output, first);
  if (allowed == nullptr) return;
  // The allowed-token mask last, as on the host: every token it leaves out at -FLT_MAX.
  for (int i = int(threadIdx.x); i < row.n; i += kThreads) {
    const int id = row.base + i;
    if (allowed[id / 32] >> (id % 32) & 1u) continue;
    if (!isfinite(row.x[i])) atomicMin(&sh.penalised_nonfinite, id);
    row.x[i] = -FLT_MAX;
  }
  __syncthreads();
}

// The repetition, frequency and presence penalties, applied to the row's copy (process_row).
__device__ void penalise_row(Row& row, const SamplingParams& p, const PenaltyToken* entries, int count, int newest,
                             bool newest_is_output, const PenaltyToken& first) {
  Shared& sh = row.sh;
  const auto penalise = [&](int id, int output_count, bool in_prompt) {
    float v = row.x[id - row.base];
    if (!isfinite(v)) atomicMin(&sh.penalised_nonfinite, id);
    if (in_prompt || output_count > 0) v = v > 0.0f ? v / p.repetition_penalty : v * p.repetition_penalty;
    v -= float(output_count) * p.frequency_penalty + (output_count > 0 ? p.presence_penalty : 0.0f);
    row.x[id - row.base] = fminf(fmaxf(v, -FLT_MAX), FLT_MAX);  // clamped to the finite floats, as the host does
  };
  for (int e = int(threadIdx.x); e < count; e += kThreads) {
    const PenaltyToken t = e == int(threadIdx.x) ? first : entries[e];
    if (t.id < row.base || t.id >= row.base + row.n) continue;
    const bool is_newest = t.id == newest;
    if (is_newest) sh.newest_found = 1;
    penalise(t.id, t.output_count + (is_newest && newest_is_output ? 1 : 0), t.in_prompt != 0 || (is_newest && !newest_is_output));
  }
  __syncthreads();
  if (threadIdx.x == 0 && !sh.newest_found && newest >= row.base && newest < row.base + row.n)
    penalise(newest, newest_is_output ? 1 : 0, !newest_is_output);
  __syncthreads();
}

// The slice's best finite logit (lowest id on ties: ids rise within a thread) into (max, id),
// and its lowest non-finite id into nonfinite.
__device__ void best_of(const Row& row, float& max, int& id, int& nonfinite) {
  for_each_logit(row, [&](float v, int i) {
    if (!isfinite(v)) nonfinite = min(nonfinite, row.base + i);
    else if (v > max || id == INT_MAX) max = v, id = row.base + i;
  });
}
// The slice's raw best, non-finite id and sum of exp(x - its raw max).
__device__ RowStats raw_stats(const Row& row) {
  RowStats s = empty_stats();
  best_of(row, s.raw_max, s.raw_id, s.nonfinite);
  if (s.raw_id != INT_MAX) for_each_logit(row, [&](float v, int) { s.raw_sum += isfinite(v) ? expf(v - s.raw_max) : 0.0f; });
  return s;
}
// ... and the slice's processed best (after the penalties).
__device__ void processed_best(const Row& row, RowStats& s) {
  int nonfinite = INT_MAX;  // the raw row's are known
  best_of(row, s.max, s.id, nonfinite);
}
// The slice's best and lowest non-finite logit in one pass.
__device__ RowStats best_and_nonfinite(const Row& row) {
  RowStats s = empty_stats();
  best_of(row, s.max, s.id, s.nonfinite);
  return s;
}
