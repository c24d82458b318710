#include "models/cpu_fast/linear.h"

#include <algorithm>

#include "models/cpu_fast/kernels.h"

namespace asynct::cpu_fast {

void linear(ThreadPool& pool, const float* x, std::int64_t rows, std::int64_t ldx, int in,
                 const std::vector<LinearPart>& parts, float* y, std::int64_t ldy) {
  if (rows == 0) return;  // a prefill chunk with no row to sample
  // Decode rows read each weight once: pieces of 32 output rows spread the weights' bytes evenly
  // over the threads. Prefill rows: pieces of 64 output rows by up to 192 rows of x, as even as
  // multiples of the kernel's 6 make them (192 KiB of x per 256 inputs stays in L2 while the
  // packed weight panels pass).
  const bool decode = rows <= 2;
  // Decode: about four pieces a thread, so that each streams long runs of rows (its prefetcher
  // restarts at every piece), at least 32 rows.
  std::int64_t total_out = 0;
  for (const LinearPart& p : parts) total_out += p.out;
  const int features = decode ? int(std::max<std::int64_t>(32, (total_out / (4 * std::int64_t(pool.size())) + 31) / 32 * 32)) : 64;
  const std::int64_t pieces = decode ? 1 : (rows + 191) / 192;
  const std::int64_t row_piece = decode ? rows : ((rows + pieces - 1) / pieces + 5) / 6 * 6;  // even pieces
  const std::int64_t row_pieces = (rows + row_piece - 1) / row_piece;
  // Decode rows meet int8 weights as int8 themselves (quantized once, here), as many as give each
  // row its result alone (kBatchInvariantRows).
  Int8Rows xq;
  const bool int8 = std::any_of(parts.begin(), parts.end(), [](const LinearPart& p) { return p.weight.int8 != nullptr; });
  const bool quantized = int8 && rows <= kBatchInvariantRows;
  if (quantized) quantize_rows_int8(x, ldx, int(rows), in, xq);
  struct Task {
    int part, first;
  };
  std::vector<Task> tasks;
  for (std::size_t p = 0; p < parts.size(); ++p)
    for (int f = 0; f < parts[p].out; f += features) tasks.push_back({int(p), f});
  pool.run(tasks.size() * std::size_t(row_pieces), [&](std::size_t i) {
    const Task& t = tasks[i % tasks.size()];
    const std::int64_t r0 = std::int64_t(i / tasks.size()) * row_piece;
    const LinearPart& part = parts[std::size_t(t.part)];
    const int nw = std::min(features, part.out - t.first);
    const int n_rows = int(std::min(row_piece, rows - r0));
    float* out = y + r0 * ldy + part.y_offset + t.first;
    const Projection& w = part.weight;
    if (w.int8)
      gemm_int8(quantized ? &xq : nullptr, x + r0 * ldx, ldx, n_rows, *w.int8, t.first, nw, out, ldy);
    else if (w.bf16)
      gemm_bf16(x + r0 * ldx, ldx, n_rows, w.bf16 + std::int64_t(t.first) * in, nw, in, out, ldy);
    else
      gemm_fp8(x + r0 * ldx, ldx, n_rows, w.fp8 + std::int64_t(t.first) * in, w.scales, w.block_rows, w.block_cols,
               t.first, nw, in, out, ldy);
  });
}

}  // namespace asynct::cpu_fast
