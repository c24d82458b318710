#include "models/cuda/cuda_model_runner.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/parallel.h"
#include "kernels/common/cuda_array.h"
#include "kernels/common/cuda_check.h"
#include "kernels/sampling/sample_rows.h"
#include "models/architecture.h"
#include "models/cuda/device_kv_cache.h"
#include "models/cuda/forward.h"
#include "models/cuda/graph_cache.h"
#include "models/cuda/phase_timer.h"
#include "models/cuda/step_metadata.h"
#include "engine/sampler.h"

namespace asynct {

using kernels::DeviceArray;
using kernels::PinnedArray;

bool cuda_device_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

namespace {

// A row whose token the greedy summary gives (the argmax of the raw logits) and that asks for
// nothing else.
bool plain_greedy(const RowSampling& row) {
  return row.params.temperature == 0.0f && !row.params.has_penalties() && row.bias_begin == row.bias_end &&
         row.mask_offset < 0 && row.params.logprobs < 0;
}

// The runner's streams and the events between them. The copies between host and device run
// beside the GPU's work (pipelined steps): a step's metadata goes up while the step before
// runs, and its summaries come down once it is computed. Two copy streams: on one, an upload
// would wait behind the download that waits for the step before to finish.
struct Streams {
  cudaStream_t compute = nullptr, upload = nullptr, download = nullptr;
  cudaEvent_t uploaded[2] = {}, computed[2] = {};  // per metadata turn
  cudaEvent_t masks_uploaded = nullptr;              // a step's token masks, sent after the step (masks_later)

  Streams() {
    ASYNCT_CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    ASYNCT_CUDA_CHECK(cudaStreamCreateWithFlags(&upload, cudaStreamNonBlocking));
    ASYNCT_CUDA_CHECK(cudaStreamCreateWithFlags(&download, cudaStreamNonBlocking));
    for (int i = 0; i < 2; ++i) {
      ASYNCT_CUDA_CHECK(cudaEventCreateWithFlags(&uploaded[i], cudaEventDisableTiming));
      ASYNCT_CUDA_CHECK(cudaEventCreateWithFlags(&computed[i], cudaEventDisableTiming));
    }
    ASYNCT_CUDA_CHECK(cudaEventCreateWithFlags(&masks_uploaded, cudaEventDisableTiming));
  }
  Streams(const Streams&) = delete;
  Streams& operator=(const Streams&) = delete;
  ~Streams() {
    for (int i = 0; i < 2; ++i) {
      if (uploaded[i]) cudaEventDestroy(uploaded[i]);
      if (computed[i]) cudaEventDestroy(computed[i]);
    }
    if (masks_uploaded) cudaEventDestroy(masks_uploaded);
    for (cudaStream_t s : {compute, upload, download})
      if (s) cudaStreamDestroy(s);
  }
};

}  // namespace

struct CudaModelRunner::Impl {
  Impl(const ModelWeights& w, int num_blocks, int block_size, KvCacheDtype kv_dtype)
      : c(w.config), num_blocks(num_blocks), block_size(block_size),
        forward(w, recipe_of(w.config), num_blocks, block_size, kv_dtype, streams.compute) {}
  ~Impl() {
    for (QueuedStep& q : queued)
      if (q.done) cudaEventDestroy(q.done);
  }

  ModelConfig c;
  int num_blocks, block_size;
  Streams streams;
  ModelForward forward;
  PhaseTimer timer;
  HostTimes host;

  // [rows that sample]: token, finiteness, logprob; and the top logprobs of the device sampler.
  // One per metadata turn: a chained step reads the summaries of the step before while that
  // step's copy to the host may still run.
  DeviceArray<LogitSummary> summaries_by_turn[2];
  DeviceArray<LogitSummary>& summaries() { return summaries_by_turn[metadata.turn()]; }
  DeviceArray<TopLogprob> top_by_turn[2];
  DeviceArray<TopLogprob>& top_logprobs() { return top_by_turn[metadata.turn()]; }

  // Whether the device sampler (kernels/sampling/sample_rows.h) runs here: sm_90 and a
  // vocabulary whose row fits a cluster. Then every row is drawn on the device, with its
  // logprobs; otherwise the device finds greedy rows' tokens (summaries) and the host draws the
  // others, and every row's logprobs, in collect() from their logits copied back.
  bool device_sampler = false;
  // The rows the device draws: every row with the device sampler; without it, greedy rows with
  // nothing to apply before the argmax (no penalties, bias or mask).
  bool device_samples(const RowSampling& row) const {
    return device_sampler || (row.params.temperature == 0.0f && !row.params.has_penalties() &&
                              row.bias_begin == row.bias_end && row.mask_offset < 0);
  }
  bool needs_host_logits(const RowSampling& row) const {
    return !device_samples(row) || (!device_sampler && row.params.logprobs >= 0);
  }
  StepMetadata metadata;
  StepPointers step;

  // A submitted step until it is collected: where its results land on the host (pinned buffers
  // reused from step to step), which rows it samples and how, and an event after its last copy
  // back. Two at most (pipelined steps), collected oldest first.
  struct QueuedStep {
    PinnedArray<LogitSummary> summaries_host;
    PinnedArray<TopLogprob> top_host;  // [rows, kMaxTopLogprobs] when the device sampler gave top logprobs
    bool top_copied = false;
    PinnedArray<float> logits_host;  // [rows copied back, vocab]
    std::vector<std::uint8_t> copied;  // [rows] whose logits come back: full_logits or needs_host_logits
    std::vector<std::uint8_t> full_logits;
    std::vector<RowSampling> sampling;
    std::vector<PenaltyToken> penalty_tokens;
    std::vector<LogitBias> logit_bias;
    std::vector<std::uint32_t> token_masks;
    std::vector<std::int32_t> newest;  // [rows] each row's input token
    int rows = 0;
    cudaEvent_t done = nullptr;
  };
  QueuedStep queued[2];
  int first_queued = 0, num_queued = 0;
  int last_submitted_rows = -1;  // sampling rows of the last step submitted (tokens_from_rows)
  std::vector<std::uint8_t> last_device_sampled;  // [last_submitted_rows] rows whose token the device drew
  StepOutput output;             // of the last step collected

  bool use_graphs = true;
  StepGraphCache graphs;

  ModelForward::Sampling sampling_out(bool device_draws) {
    return {summaries().get(), top_logprobs().get(), device_draws};
  }

  // The step submitted last whose token masks come later (StepBatch::masks_later): its model is
  // queued, its sampler waits for supply_masks().
  struct WaitingForMasks {
    bool active = false;
    int rows = 0;
    bool device_draws = false;
    std::size_t mask_words = 0;
  } waiting;

  // The step on the compute stream: the model, and the sampler unless `samples` is false.
  void run_model(const StepShape& shape, int rows, bool device_draws, bool samples) {
    forward.run_model(shape, step, rows, timer, streams.compute);
    if (samples) forward.sample(step, rows, sampling_out(device_draws), timer, streams.compute);
  }

  void run_graph(const StepShape& shape, int rows, bool device_draws, bool samples) {
    const StepGraphKey key{shape.seqs,        shape.tokens,   shape.decodes,
                           shape.prefill_q_len, shape.max_blocks, rows,
                           metadata.turn(),     step.tokens_from_rows != nullptr, device_draws,
                           samples};
    const GraphAddresses addresses{forward.act.addresses(), summaries().get(), top_logprobs().get(),
                                   forward.act.decode_workspace.get(), step};
    graphs.run(key, addresses, streams.compute, timer, [&] { run_model(shape, rows, device_draws, samples); });
  }

  // Queues the copies of the results to the host: the full logits of the rows the engine asked
  // for and of the rows sampled on the host (consecutive rows in one copy) on the step's
  // stream, where the next step cannot overwrite them first; then, once the step is computed,
  // every row's summary on the download stream, beside the step queued after this one.
  void download_results(const StepBatch& b, int rows, QueuedStep& q) {
    const std::size_t vocab = std::size_t(c.vocab_size);
    q.rows = rows;
    q.full_logits = b.full_logits;
    q.sampling = b.sampling;
    q.penalty_tokens = b.penalty_tokens;
    q.logit_bias = b.logit_bias;
    q.token_masks = b.token_masks;
    q.copied.assign(std::size_t(rows), 0);
    q.newest.assign(std::size_t(rows), 0);
    std::size_t wanted = 0;
    for (std::size_t i = 0; i < std::size_t(rows); ++i) {
      q.copied[i] = b.full_logits[i] || needs_host_logits(b.sampling[i]) ? 1 : 0;
      q.newest[i] = b.tokens[std::size_t(b.logit_rows[i])];  // a placeholder in a chained step: unused there
      wanted += q.copied[i];
    }
    q.summaries_host.reserve(std::size_t(std::max(rows, 1)));
    if (wanted > 0) q.logits_host.reserve(wanted * vocab);
    std::size_t to = 0;
    for (int i = 0; i < rows;) {
      if (!q.copied[std::size_t(i)]) {
        ++i;
        continue;
      }
      int end = i;
      while (end < rows && q.copied[std::size_t(end)]) ++end;
      const std::size_t n = std::size_t(end - i) * vocab;
      ASYNCT_CUDA_CHECK(cudaMemcpyAsync(q.logits_host.get() + to, forward.act.logits.get() + std::size_t(i) * vocab,
                                        n * sizeof(float), cudaMemcpyDeviceToHost, streams.compute));
      to += n;
      i = end;
    }
    timer.mark("d2h");
    const int turn = metadata.turn();
    ASYNCT_CUDA_CHECK(cudaEventRecord(streams.computed[turn], streams.compute));
    ASYNCT_CUDA_CHECK(cudaStreamWaitEvent(streams.download, streams.computed[turn], 0));
    if (rows > 0)
      ASYNCT_CUDA_CHECK(cudaMemcpyAsync(q.summaries_host.get(), summaries().get(), std::size_t(rows) * sizeof(LogitSummary),
                                        cudaMemcpyDeviceToHost, streams.download));
    q.top_copied = false;
    if (device_sampler)
      for (const RowSampling& s : b.sampling) q.top_copied = q.top_copied || s.params.logprobs > 0;
    if (q.top_copied) {
      const std::size_t n = std::size_t(rows) * kMaxTopLogprobs;
      q.top_host.reserve(n);
      ASYNCT_CUDA_CHECK(cudaMemcpyAsync(q.top_host.get(), top_logprobs().get(), n * sizeof(TopLogprob),
                                        cudaMemcpyDeviceToHost, streams.download));
    }
    ASYNCT_CUDA_CHECK(cudaEventRecord(q.done, streams.download));
  }

  // After the step's copies have landed: the StepOutput over its pinned results, the rows the
  // device did not draw drawn here, and the logprobs asked for.
  void unpack_results(const QueuedStep& q) {
    const std::size_t vocab = std::size_t(c.vocab_size), rows = std::size_t(q.rows);
    output.summaries.assign(q.summaries_host.get(), q.summaries_host.get() + q.rows);
    output.logits.assign(rows, nullptr);
    output.top_logprobs.assign(rows, {});
    std::vector<const float*> copied(rows, nullptr);
    std::vector<std::size_t> on_host;  // rows sampled or given logprobs here
    std::size_t next = 0;
    for (std::size_t i = 0; i < rows; ++i) {
      if (q.copied[i]) copied[i] = q.logits_host.get() + vocab * next++;
      if (q.full_logits[i]) output.logits[i] = copied[i];
      if (needs_host_logits(q.sampling[i])) on_host.push_back(i);
      const int n = q.sampling[i].params.logprobs;
      if (q.top_copied && n > 0 && output.summaries[i].nonfinite < 0) {
        const TopLogprob* top = q.top_host.get() + i * kMaxTopLogprobs;
        output.top_logprobs[i].assign(top, top + std::min(n, c.vocab_size));
      }
    }
    parallel_for(on_host.size(), [&](std::size_t k) {
      const std::size_t i = on_host[k];
      const RowSampling& s = q.sampling[i];
      LogitSummary& summary = output.summaries[i];
      if (device_samples(s)) {  // the device's token stands (a step queued behind may have taken it)
        if (summary.nonfinite < 0) fill_logprobs(copied[i], vocab, s.params.logprobs, summary, &output.top_logprobs[i]);
        return;
      }
      const PenaltyContext penalties{
          std::span<const PenaltyToken>(q.penalty_tokens).subspan(std::size_t(s.penalty_begin),
                                                                  std::size_t(s.penalty_end - s.penalty_begin)),
          q.newest[i], s.newest_is_output != 0};
      const std::span<const LogitBias> bias = std::span<const LogitBias>(q.logit_bias)
                                                  .subspan(std::size_t(s.bias_begin), std::size_t(s.bias_end - s.bias_begin));
      const std::uint32_t* allowed = s.mask_offset >= 0 ? q.token_masks.data() + s.mask_offset : nullptr;
      summary = sample_logit_row(copied[i], vocab, s, penalties, &output.top_logprobs[i], bias, allowed);
    });
  }
};

namespace {
// Checked before anything is allocated or touches the GPU.
std::unique_ptr<CudaModelRunner::Impl> make_impl(const ModelWeights& w, int num_blocks, int block_size,
                                                 KvCacheDtype kv_dtype) {
  check_block_size(block_size, Backend::Cuda);
  check(num_blocks >= 1, "CudaModelRunner: need at least one KV block");
  DeviceKvCache::check_supported(w.config, kv_dtype);
  check(cuda_device_available(), "CudaModelRunner: no CUDA device is visible");
  return std::make_unique<CudaModelRunner::Impl>(w, num_blocks, block_size, kv_dtype);
}
}  // namespace

CudaModelRunner::CudaModelRunner(const ModelWeights& w, int num_blocks, int block_size, int max_tokens_per_step,
                                 KvCacheDtype kv_dtype)
    : impl_(make_impl(w, num_blocks, block_size, kv_dtype)) {
  impl_->forward.act.reserve(std::size_t(std::max(1, max_tokens_per_step)), impl_->c);
  impl_->device_sampler = kernels::device_sampling_supported(impl_->c.vocab_size);
}

CudaModelRunner::~CudaModelRunner() = default;

void CudaModelRunner::copy_blocks(const std::vector<BlockCopy>& copies) {
  Impl& m = *impl_;
  for (const BlockCopy& copy : copies)
    check(copy.from >= 0 && copy.from < m.num_blocks && copy.to >= 0 && copy.to < m.num_blocks && copy.from != copy.to,
          "copy_blocks: block ", copy.from, " to ", copy.to, " (the cache has ", m.num_blocks, ")");
  m.forward.copy_blocks(copies, m.streams.compute);
}

int CudaModelRunner::num_blocks() const { return impl_->num_blocks; }
bool CudaModelRunner::samples_on_device(const RowSampling& row) const { return impl_->device_samples(row); }
int CudaModelRunner::block_size() const { return impl_->block_size; }
void CudaModelRunner::set_profiling(bool on) { impl_->timer.enabled = on; }
void CudaModelRunner::set_cuda_graphs(bool on) { impl_->use_graphs = on; }
void CudaModelRunner::set_max_graph_shapes(int shapes) { impl_->graphs.set_max_shapes(shapes); }
std::map<std::string, double> CudaModelRunner::phase_times_ms() const {
  std::map<std::string, double> phases = impl_->timer.totals;
  const HostTimes& h = impl_->host;
  phases["host_prepare"] = h.prepare;
  phases["host_launch"] = h.launch;
  phases["host_wait"] = h.wait;
  phases["host_finish"] = h.finish;
  return phases;
}
void CudaModelRunner::reset_phase_times() {
  impl_->timer.totals.clear();
  impl_->host = {};
}

void CudaModelRunner::submit(const StepBatch& b) {
  Lap lap;
  Impl& m = *impl_;
  const int t = b.num_tokens(), rows = int(b.logit_rows.size());
  check(m.num_queued < 2, "submit: two steps are queued already; collect one first");
  check(!m.waiting.active, "submit: the step before waits for its token masks (supply_masks)");
  check_step_batch(b, {m.num_blocks, m.block_size, m.c.vocab_size, m.c.max_position_embeddings,
                       std::max(0, m.last_submitted_rows)});
  const bool chained = !b.tokens_from_rows.empty();
  // A chained step takes its tokens from the device: only from rows the device drew; and without
  // the device sampler, its own rows' penalties (applied on the host) would miss the token it
  // takes there.
  for (std::size_t i = 0; i < b.tokens_from_rows.size(); ++i)
    check(m.last_device_sampled[std::size_t(b.tokens_from_rows[i])], "submit: token ", i, " takes row ",
          b.tokens_from_rows[i], " of the step before, whose token this runner draws on the host");
  for (std::size_t r = 0; r < b.sampling.size() && chained && !m.device_sampler; ++r)
    check(!b.sampling[r].params.has_penalties(), "submit: logit row ", r,
          " of a chained step has penalties, which this runner applies on the host, without the chained token");
  // The device sampler runs when a row needs more than the greedy summary.
  bool device_draws = false;
  for (const RowSampling& s : b.sampling) device_draws = device_draws || (m.device_sampler && !plain_greedy(s));

  // Split the step: leading one-token sequences to the decode kernel, the rest to prefill.
  // All-decode and small steps replay CUDA graphs (graph_cache.h), at a widened block-table width.
  StepShape shape = shape_of(b);
  const bool graph = m.use_graphs && replays_from_graph(shape);
  if (graph) widen_for_graph(shape, m.block_size);

  // (A buffer that grows while another step is queued is freed with cudaFree, which waits for
  // the device: that step finishes with the old buffer first.)
  m.forward.act.reserve(std::size_t(t), m.c);
  m.forward.act.logits.reserve(std::size_t(std::max(rows, 1)) * std::size_t(m.c.vocab_size));  // rows that sample only
  const LogitSummary* previous_summaries = m.summaries().get();  // the turn before this step's
  m.step = write_step_metadata(b, shape, m.metadata, m.num_queued > 0);  // (this step's turn)
  m.summaries().reserve(std::size_t(std::max(rows, 1)));
  m.top_logprobs().reserve(std::size_t(std::max(rows, 1)) * kMaxTopLogprobs);
  if (chained) {
    m.step.previous_summaries = previous_summaries;
    m.step.previous_rows = m.last_submitted_rows;
  }
  if (graph) m.forward.reserve_decode_workspace(shape, m.step);
  Impl::QueuedStep& q = m.queued[(m.first_queued + m.num_queued) % 2];
  if (!q.done) ASYNCT_CUDA_CHECK(cudaEventCreateWithFlags(&q.done, cudaEventDisableTiming));
  lap(m.host.prepare);

  // The metadata goes up on the upload stream, beside the step before; the step's stream waits
  // for it. Its GPU phases run from that wait ("h2d": nothing when the upload was early) to the
  // full logits' copies ("d2h"); the summaries follow on the download stream.
  // A step whose masks come later sends them then (supply_masks), and samples after them.
  const int turn = m.metadata.turn();
  const bool samples = !b.masks_later;
  m.metadata.upload(m.streams.upload, 0, m.metadata.bytes() - (samples ? 0 : token_masks_bytes(b)));
  ASYNCT_CUDA_CHECK(cudaEventRecord(m.streams.uploaded[turn], m.streams.upload));
  m.timer.begin(m.streams.compute);
  ASYNCT_CUDA_CHECK(cudaStreamWaitEvent(m.streams.compute, m.streams.uploaded[turn], 0));
  m.timer.mark("h2d");
  if (graph)
    m.run_graph(shape, rows, device_draws, samples);
  else
    m.run_model(shape, rows, device_draws, samples);
  if (samples)
    m.download_results(b, rows, q);
  else
    m.waiting = {true, rows, device_draws, b.token_masks.size()};
  ++m.num_queued;
  m.last_submitted_rows = rows;
  m.last_device_sampled.resize(std::size_t(rows));
  for (std::size_t r = 0; r < std::size_t(rows); ++r) m.last_device_sampled[r] = m.device_samples(b.sampling[r]) ? 1 : 0;
  lap(m.host.launch);
}

void CudaModelRunner::supply_masks(const StepBatch& b) {
  Lap lap;
  Impl& m = *impl_;
  check(m.waiting.active, "supply_masks: no step waits for its token masks");
  check(b.token_masks.size() == m.waiting.mask_words, "supply_masks: the batch has ", b.token_masks.size(),
        " mask words; the step submitted has ", m.waiting.mask_words);
  // Up beside the step's model; the sampler waits for them on the step's stream.
  upload_token_masks(b, m.metadata, m.streams.upload);
  ASYNCT_CUDA_CHECK(cudaEventRecord(m.streams.masks_uploaded, m.streams.upload));
  ASYNCT_CUDA_CHECK(cudaStreamWaitEvent(m.streams.compute, m.streams.masks_uploaded, 0));
  m.forward.sample(m.step, m.waiting.rows, m.sampling_out(m.waiting.device_draws), m.timer, m.streams.compute);
  m.download_results(b, m.waiting.rows, m.queued[(m.first_queued + m.num_queued - 1) % 2]);
  m.waiting.active = false;
  lap(m.host.launch);
}

const StepOutput& CudaModelRunner::collect() {
  Lap lap;
  Impl& m = *impl_;
  check(m.num_queued > 0, "collect: no step was submitted");
  check(!m.waiting.active || m.num_queued > 1, "collect: the step waits for its token masks (supply_masks)");
  Impl::QueuedStep& q = m.queued[m.first_queued];
  ASYNCT_CUDA_CHECK(cudaEventSynchronize(q.done));
  lap(m.host.wait);
  m.first_queued = (m.first_queued + 1) % 2;
  --m.num_queued;
  m.timer.collect();
  m.unpack_results(q);
  lap(m.host.finish);
  return m.output;
}

}  // namespace asynct
