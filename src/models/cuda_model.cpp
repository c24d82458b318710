#include "models/cuda_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/cuda_array.h"
#include "kernels/decode.h"
#include "kernels/device_info.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/norms.h"
#include "kernels/prefill.h"
#include "kernels/sampling.h"
#include "kernels/skinny_gemm.h"

namespace asynct {

using kernels::bf16;
using kernels::DeviceArray;
using kernels::PinnedArray;

bool cuda_device_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

namespace {

// Whether the decode kernel reads the qkv projection itself (decode.h); ASYNCT_DECODE_PROJECTION=0
// turns it off, for measuring.
bool decode_projection_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("ASYNCT_DECODE_PROJECTION");
    return value == nullptr || std::strcmp(value, "0") != 0;
  }();
  return enabled;
}

// Host weights (bf16, or float32 converted on the way) as device bf16 arrays. A 1.7B model is
// ~2e9 values: each weight goes in chunks through two reused pinned staging buffers, a chunk
// filled on the host (copied out of the weight, often a mapped checkpoint file, or converted on
// the host's threads) while the one before it is copied to the device (a copy from pinned
// memory runs asynchronously as DMA; one from pageable memory is staged by the driver and
// blocks the host). Merged weights are written part by part into their row ranges, without a
// concatenation on the host first.
class Bf16Uploader {
 public:
  explicit Bf16Uploader(cudaStream_t stream) : stream_(stream) {
    for (Staging& s : staging_) ASYNCT_CUDA_CHECK(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming));
  }
  ~Bf16Uploader() {
    cudaStreamSynchronize(stream_);  // copies still in flight read the staging buffers
    for (Staging& s : staging_)
      if (s.copied) cudaEventDestroy(s.copied);
  }
  Bf16Uploader(const Bf16Uploader&) = delete;
  Bf16Uploader& operator=(const Bf16Uploader&) = delete;

  DeviceArray<bf16> operator()(const Tensor& t) { return rows({&t}); }
  // The parts' rows one after another in one array, e.g. q, k, v -> the merged [qd + 2 kvd, H]
  // projection; every part has the same row length.
  DeviceArray<bf16> rows(std::initializer_list<const Tensor*> parts) {
    std::vector<RowRange> ranges;
    for (const Tensor* t : parts) ranges.push_back({t, 0, t->numel() ? t->size(0) : 0});
    return row_ranges(ranges);
  }
  // The merged gate/up projection [2 I, H] in the device's block order (kGluBlock gate rows,
  // then the same up rows, ...: linear_output.h).
  DeviceArray<bf16> gate_up_rows(const Tensor& gate, const Tensor& up) {
    std::vector<RowRange> ranges;
    for (std::int64_t first = 0; first < gate.size(0); first += kernels::kGluBlock) {
      const std::int64_t count = std::min<std::int64_t>(kernels::kGluBlock, gate.size(0) - first);
      ranges.push_back({&gate, first, count});
      ranges.push_back({&up, first, count});
    }
    return row_ranges(ranges);
  }
  // Returns when every copy has landed, so that the arrays can be used from any stream.
  void finish() { ASYNCT_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  struct RowRange {
    const Tensor* t;
    std::int64_t first, count;  // rows [first, first + count) of t
  };
  DeviceArray<bf16> row_ranges(const std::vector<RowRange>& ranges) {
    std::size_t total = 0;
    for (const RowRange& r : ranges) total += std::size_t(r.count) * row_length(*r.t);
    DeviceArray<bf16> d(total);
    bf16* to = d.get();
    for (const RowRange& r : ranges) {
      const std::size_t row = row_length(*r.t);
      const bool bf16_source = r.t->dtype() == DType::BF16;
      check(bf16_source || r.t->dtype() == DType::F32, "CudaModelRunner: weight of type ", dtype_name(r.t->dtype()),
            " (bfloat16 or float32 expected)");
      const std::size_t first = std::size_t(r.first) * row;
      const std::size_t n = std::size_t(r.count) * row;
      for (std::size_t begin = 0; begin < n; begin += kChunk) {
        const std::size_t count = std::min(kChunk, n - begin);
        Staging& s = staging_[next_];
        next_ ^= 1;
        ASYNCT_CUDA_CHECK(cudaEventSynchronize(s.copied));  // its previous chunk has been copied
        s.host.reserve(count);  // grows to the largest chunk: a small model pins little
        if (bf16_source)
          std::memcpy(s.host.get(), r.t->data_as<bf16_bits>() + first + begin, count * sizeof(std::uint16_t));
        else
          floats_to_bf16(r.t->data_as<float>() + first + begin, s.host.get(), count);
        ASYNCT_CUDA_CHECK(
            cudaMemcpyAsync(to + begin, s.host.get(), count * sizeof(bf16), cudaMemcpyHostToDevice, stream_));
        ASYNCT_CUDA_CHECK(cudaEventRecord(s.copied, stream_));
      }
      to += n;
    }
    return d;
  }
  static std::size_t row_length(const Tensor& t) { return t.numel() ? std::size_t(t.numel() / t.size(0)) : 0; }

  static constexpr std::size_t kChunk = std::size_t(16) << 20;  // values: 32 MB a buffer
  struct Staging {
    PinnedArray<std::uint16_t> host;
    cudaEvent_t copied = nullptr;  // recorded after the copy out of `host`
  };
  cudaStream_t stream_;
  Staging staging_[2];
  int next_ = 0;
};

// The gate parameters, float32 on the device (a few values per layer).
DeviceArray<float> to_device_f32(const Tensor& t) {
  Tensor f = t.to(DType::F32);
  DeviceArray<float> d(std::size_t(f.numel()));
  ASYNCT_CUDA_CHECK(cudaMemcpy(d.get(), f.data(), f.nbytes(), cudaMemcpyHostToDevice));
  return d;
}

// Times the phases of a step with events on the step's stream: mark("gemm") closes the phase
// that began at the previous mark and names it. With pipelined steps two steps are timed at once:
// begin() opens the newest step's record, mark() adds to it, and collect() reads the oldest, after
// its events have completed.
class PhaseTimer {
 public:
  ~PhaseTimer() {
    for (Record& r : records_)
      for (cudaEvent_t e : r.events) cudaEventDestroy(e);
  }
  bool enabled = false;
  void begin(cudaStream_t stream) {
    check(pending_ < 2, "PhaseTimer: two steps are timed already");
    stream_ = stream;
    Record& r = records_[(first_ + pending_++) % 2];
    r.used = 0;
    r.names.clear();
    record(r);
  }
  void mark(const char* phase) {
    if (!enabled || pending_ == 0) return;
    Record& r = records_[(first_ + pending_ - 1) % 2];
    r.names.push_back(phase);
    record(r);
  }
  void collect() {  // the oldest step's events have completed
    if (pending_ == 0) return;
    Record& r = records_[first_];
    first_ = (first_ + 1) % 2;
    --pending_;
    for (std::size_t i = 0; i + 1 < r.used; ++i) {
      float ms = 0.0f;
      ASYNCT_CUDA_CHECK(cudaEventElapsedTime(&ms, r.events[i], r.events[i + 1]));
      totals[r.names[i]] += ms;
    }
  }
  std::map<std::string, double> totals;

 private:
  struct Record {
    std::vector<cudaEvent_t> events;
    std::vector<const char*> names;  // names[i]: the phase from events[i] to events[i + 1]
    std::size_t used = 0;
  };
  void record(Record& r) {
    if (!enabled) return;
    if (r.used == r.events.size()) {
      cudaEvent_t e;
      ASYNCT_CUDA_CHECK(cudaEventCreate(&e));
      r.events.push_back(e);
    }
    ASYNCT_CUDA_CHECK(cudaEventRecord(r.events[r.used++], stream_));
  }
  cudaStream_t stream_ = nullptr;
  Record records_[2];
  int first_ = 0, pending_ = 0;  // the oldest record being timed, and how many are
};

// Host wall-clock time of submit()'s and collect()'s parts, in milliseconds (what the GPU phases
// cannot see: a step whose GPU work is short may still be slow to prepare or to launch).
struct HostTimes {
  double prepare = 0;  // validation, writing the step metadata, buffers grown
  double launch = 0;   // enqueueing the upload, the step (eager launches or one graph
                       // launch; a graph capture when there is one) and the copies back
  double wait = 0;     // blocked in the stream synchronisation, waiting for the GPU
  double finish = 0;   // reading event timings (profiling), unpacking the results
};

// A step's metadata (token ids, positions, cache slots, sequence offsets, KV lengths, block
// table, sampling rows) laid out in one pinned host buffer and uploaded with one copy into one
// device buffer, instead of one pageable copy per array. Sections are carved in order at
// offsets that depend only on their sizes, so a decode graph replayed for the same shape finds
// its metadata at the device addresses it was captured with. Consecutive steps take turns
// between two host and two device buffers: a step's metadata is written and uploaded while the
// step before it, which reads the other turn's, may still run (pipelined steps).
class StepMetadata {
 public:
  // Starts a step's metadata, in the other turn's buffers.
  void clear() {
    bytes_ = 0;
    turn_ ^= 1;
  }
  int turn() const { return turn_; }
  // Adds a section of `count` T; returns its offset.
  template <typename T>
  std::size_t add(std::size_t count) {
    const std::size_t offset = (bytes_ + 15) / 16 * 16;
    bytes_ = offset + count * sizeof(T);
    return offset;
  }
  // After the sections are added: room for them (buffers move only when they grow).
  void reserve() {
    host_[turn_].reserve(bytes_);
    device_[turn_].reserve(bytes_);
  }
  template <typename T>
  T* host(std::size_t offset) const { return reinterpret_cast<T*>(host_[turn_].get() + offset); }
  template <typename T>
  const T* device(std::size_t offset) const { return reinterpret_cast<const T*>(device_[turn_].get() + offset); }
  void upload(cudaStream_t stream) {
    if (bytes_)
      ASYNCT_CUDA_CHECK(cudaMemcpyAsync(device_[turn_].get(), host_[turn_].get(), bytes_, cudaMemcpyHostToDevice, stream));
  }

 private:
  std::size_t bytes_ = 0;
  int turn_ = 0;
  PinnedArray<std::uint8_t> host_[2];
  DeviceArray<std::uint8_t> device_[2];
};

// Where this step's metadata is on the device.
struct StepPointers {
  const std::int32_t* tokens = nullptr;
  const std::int64_t* positions = nullptr;
  const std::int64_t* slots = nullptr;
  const std::int32_t* prefill_cu_seqlens = nullptr;  // the prefill part's, starting at 0
  const std::int32_t* kv_lens = nullptr;
  const std::int32_t* block_table = nullptr;          // [seqs, max_blocks]
  const std::int32_t* logit_rows = nullptr;
  // A chained step's (StepBatch::tokens_from_rows), and the summaries of the step before.
  const std::int32_t* tokens_from_rows = nullptr;
  const LogitSummary* previous_summaries = nullptr;
  int previous_rows = 0;
};

// How a step's attention is split between the kernels, and the bounds each one needs.
struct StepShape {
  int tokens = 0, seqs = 0;
  int max_blocks = 1;      // block-table width
  int decodes = 0;         // leading sequences with one new token: the decode kernel
  int decode_kv_len = 0;   // bound of their KV lengths (sizes the decode splits)
  int prefill_q_len = 0;   // longest new-token count among the rest: the prefill kernel
  int prefill_kv_len = 0;
};

struct DeviceLayer {
  // qkv_proj: q_proj, k_proj and v_proj stacked by rows, so that one GEMM makes all three (at
  // decode sizes a GEMM costs ~6 us however small it is: three cost 18, one 7).
  DeviceArray<bf16> input_layernorm, qkv_proj, o_proj, q_norm, k_norm;
  DeviceArray<bf16> post_attention_layernorm, gate_up_proj, down_proj;
  DeviceArray<bf16> attn_output_layernorm, mlp_output_layernorm;  // AsyncT
  DeviceArray<float> gate_alpha, gate_sigma, gate_gamma;          // AsyncT
  DeviceArray<bf16> key_cache, value_cache;
};

}  // namespace

struct CudaModelRunner::Impl {
  ModelConfig c;
  kernels::NormArgs norm;
  int num_blocks, block_size, sm_count = 0;
  cudaStream_t stream = nullptr;
  // The copies between host and device, beside the GPU's work (pipelined steps): a step's
  // metadata goes up while the step before runs, and its summaries come down once it is
  // computed. Two streams: on one, an upload would wait behind the download that waits for
  // the step before to finish.
  cudaStream_t upload_stream = nullptr, download_stream = nullptr;
  cudaEvent_t uploaded[2] = {}, computed[2] = {};  // per metadata turn
  kernels::Gemm gemm;
  PhaseTimer timer;
  std::vector<DeviceLayer> layers;
  DeviceArray<bf16> embed_tokens, final_norm, lm_head_untied;
  const bf16* lm_head = nullptr;

  // Activations, sized for `capacity` tokens.
  std::size_t capacity = 0;
  DeviceArray<bf16> residual, hidden, qkv, q, k, v, attn, attn_out, gate_up, act, mlp_out, last;
  // The qkv, o and down products of a decode-sized step, as split partial sums for the kernel
  // after them (linear_output.h): [splits][rows][cols], room for the most splits at the most
  // rows of the widest (each is read before the next is written).
  DeviceArray<float> linear_partials;
  DeviceArray<float> logits;  // [rows that sample, vocab]
  // [rows that sample]: greedy token, finiteness. One per metadata turn: a chained step reads
  // the summaries of the step before while that step's copy to the host may still run.
  DeviceArray<LogitSummary> summaries_by_turn[2];
  DeviceArray<LogitSummary>& summaries() { return summaries_by_turn[metadata.turn()]; }
  DeviceArray<std::uint8_t> decode_workspace;
  StepMetadata metadata;
  StepPointers step;

  // A submitted step until it is collected: where its results land on the host (pinned buffers
  // reused from step to step), which rows it samples, and an event after its last copy back.
  // Two at most (pipelined steps), collected oldest first.
  struct QueuedStep {
    PinnedArray<LogitSummary> summaries_host;
    PinnedArray<float> logits_host;  // [rows whose full logits the engine asked for, vocab]
    std::vector<std::uint8_t> full_logits;
    int rows = 0;
    cudaEvent_t done = nullptr;
  };
  QueuedStep queued[2];
  int first_queued = 0, num_queued = 0;
  int last_submitted_rows = -1;  // sampling rows of the last step submitted (tokens_from_rows)
  StepOutput output;             // of the last step collected
  HostTimes host;

  // CUDA graphs of decode steps, by (sequences, block-table width, sampling rows). A graph
  // holds the buffer addresses it was captured with; `addresses` fingerprints them so a moved
  // buffer means a new capture.
  bool use_graphs = true;
  struct CapturedStep {
    cudaGraphExec_t exec = nullptr;
    std::uint64_t addresses = 0;
    bool seen = false;  // the first step of a shape runs eagerly (plans, kernel attributes)
  };
  // Keyed by (sequences, block-table width, sampling rows, metadata turn, chained): each turn has
  // its own buffers, and a chained step takes its tokens from the step before.
  std::map<std::tuple<int, int, int, int, bool>, CapturedStep> graphs;

  ~Impl() {
    for (auto& [key, g] : graphs)
      if (g.exec) cudaGraphExecDestroy(g.exec);
    for (QueuedStep& q : queued)
      if (q.done) cudaEventDestroy(q.done);
    for (int i = 0; i < 2; ++i) {
      if (uploaded[i]) cudaEventDestroy(uploaded[i]);
      if (computed[i]) cudaEventDestroy(computed[i]);
    }
  }

  std::uint64_t buffer_addresses() const {
    std::uint64_t h = 1469598103934665603ull;
    for (const void* ptr : {(const void*)residual.get(), (const void*)hidden.get(), (const void*)q.get(),
                            (const void*)k.get(), (const void*)v.get(), (const void*)attn.get(),
                            (const void*)attn_out.get(), (const void*)gate_up.get(), (const void*)act.get(),
                            (const void*)mlp_out.get(), (const void*)last.get(), (const void*)logits.get(),
                            (const void*)linear_partials.get(),
                            (const void*)summaries_by_turn[metadata.turn()].get(), (const void*)decode_workspace.get(),
                            (const void*)step.tokens_from_rows, (const void*)step.previous_summaries,
                            (const void*)std::uintptr_t(step.previous_rows),
                            (const void*)step.tokens, (const void*)step.positions, (const void*)step.slots,
                            (const void*)step.prefill_cu_seqlens, (const void*)step.kv_lens,
                            (const void*)step.block_table, (const void*)step.logit_rows})
      h = (h ^ std::uint64_t(reinterpret_cast<std::uintptr_t>(ptr))) * 1099511628211ull;
    return h;
  }

  void run_model(const StepShape& shape, int rows);

  void write_metadata(const StepBatch& b, const StepShape& shape);

  // Runs an all-decode step from its CUDA graph: the first step of a shape runs eagerly (it
  // creates the GEMM plans and loads the kernels), the second captures the graph, and from
  // then on a step is one launch. Timed as one phase, "decode_graph"; a capture shows as
  // "capture" (the GPU waits for it).
  void run_graph(const StepShape& shape, int rows) {
    CapturedStep& g = graphs[{shape.seqs, shape.max_blocks, rows, metadata.turn(), step.tokens_from_rows != nullptr}];
    if (!g.seen) {
      g.seen = true;
      run_model(shape, rows);
      return;
    }
    const std::uint64_t addresses = buffer_addresses();
    if (!g.exec || g.addresses != addresses) {
      capture(g, shape, rows, addresses);
      timer.mark("capture");
    }
    ASYNCT_CUDA_CHECK(cudaGraphLaunch(g.exec, stream));
    timer.mark("decode_graph");
  }

  void capture(CapturedStep& g, const StepShape& shape, int rows, std::uint64_t addresses) {
    if (g.exec) ASYNCT_CUDA_CHECK(cudaGraphExecDestroy(g.exec));
    g.exec = nullptr;
    const bool timing = timer.enabled;  // events are not recorded inside graphs
    timer.enabled = false;
    cudaGraph_t graph = nullptr;
    ASYNCT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    try {
      run_model(shape, rows);
    } catch (...) {
      cudaStreamEndCapture(stream, &graph);
      if (graph) cudaGraphDestroy(graph);
      timer.enabled = timing;
      throw;
    }
    timer.enabled = timing;
    ASYNCT_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    const cudaError_t instantiated = cudaGraphInstantiate(&g.exec, graph, 0);
    cudaGraphDestroy(graph);
    ASYNCT_CUDA_CHECK(instantiated);
    g.addresses = addresses;
  }

  // Queues the copies of the results to the host: the full logits of the rows the engine asked
  // for (consecutive rows in one copy) on the step's stream, where the next step cannot
  // overwrite them first; then, once the step is computed, every row's summary on the download
  // stream, beside the step queued after this one.
  void download_results(const StepBatch& b, int rows, QueuedStep& q) {
    const std::size_t vocab = std::size_t(c.vocab_size);
    q.rows = rows;
    q.full_logits = b.full_logits;
    q.summaries_host.reserve(std::size_t(std::max(rows, 1)));
    std::size_t wanted = 0;
    for (std::uint8_t f : b.full_logits) wanted += f ? 1 : 0;
    if (wanted > 0) q.logits_host.reserve(wanted * vocab);
    std::size_t to = 0;
    for (int i = 0; i < rows;) {
      if (!b.full_logits[std::size_t(i)]) {
        ++i;
        continue;
      }
      int end = i;
      while (end < rows && b.full_logits[std::size_t(end)]) ++end;
      const std::size_t n = std::size_t(end - i) * vocab;
      ASYNCT_CUDA_CHECK(cudaMemcpyAsync(q.logits_host.get() + to, logits.get() + std::size_t(i) * vocab,
                                        n * sizeof(float), cudaMemcpyDeviceToHost, stream));
      to += n;
      i = end;
    }
    timer.mark("d2h");
    const int turn = metadata.turn();
    ASYNCT_CUDA_CHECK(cudaEventRecord(computed[turn], stream));
    ASYNCT_CUDA_CHECK(cudaStreamWaitEvent(download_stream, computed[turn], 0));
    if (rows > 0)
      ASYNCT_CUDA_CHECK(cudaMemcpyAsync(q.summaries_host.get(), summaries().get(), std::size_t(rows) * sizeof(LogitSummary),
                                        cudaMemcpyDeviceToHost, download_stream));
    ASYNCT_CUDA_CHECK(cudaEventRecord(q.done, download_stream));
  }

  // After the step's copies have landed: the StepOutput over its pinned results.
  void unpack_results(const QueuedStep& q) {
    const std::size_t vocab = std::size_t(c.vocab_size);
    output.summaries.assign(q.summaries_host.get(), q.summaries_host.get() + q.rows);
    output.logits.assign(std::size_t(q.rows), nullptr);
    std::size_t next = 0;
    for (int i = 0; i < q.rows; ++i)
      if (q.full_logits[std::size_t(i)]) output.logits[std::size_t(i)] = q.logits_host.get() + vocab * next++;
  }

  void reserve(std::size_t t) {
    if (t <= capacity) return;
    const std::size_t h = std::size_t(c.hidden_size), qd = std::size_t(c.num_attention_heads) * c.head_dim,
                      kvd = std::size_t(c.num_key_value_heads) * c.head_dim, in = std::size_t(c.intermediate_size);
    residual.resize(t * h);
    hidden.resize(t * h);
    qkv.resize(t * (qd + 2 * kvd));
    q.resize(t * qd);
    k.resize(t * kvd);
    v.resize(t * kvd);
    attn.resize(t * qd);
    attn_out.resize(t * h);
    gate_up.resize(t * 2 * in);
    act.resize(t * in);
    mlp_out.resize(t * h);
    last.resize(t * h);
    linear_partials.reserve(std::size_t(kernels::kMaxLinearSplits) * kernels::kSkinnyMaxRows * std::max(h, qd + 2 * kvd));
    capacity = t;
  }

  kernels::PagedKv paged(DeviceLayer& l, int max_blocks) const {
    kernels::PagedKv kv;
    kv.key_cache = l.key_cache.get();
    kv.value_cache = l.value_cache.get();
    kv.block_table = step.block_table;
    kv.max_blocks_per_seq = max_blocks;
    kv.num_blocks = num_blocks;
    kv.block_size = block_size;
    kv.num_kv_heads = c.num_key_value_heads;
    kv.head_dim = c.head_dim;
    return kv;
  }

  kernels::GateArgs gate(const DeviceLayer& l) const {
    kernels::GateArgs g;
    if (c.is_async()) {
      g.kind = GateKind::Async;
      g.pool_window = c.attn_pool_window;
      g.alpha = l.gate_alpha.get();
      g.sigma = l.gate_sigma.get();
      g.gamma = l.gate_gamma.get();
    } else {
      g.kind = GateKind::Softmax;
    }
    return g;
  }

  kernels::DecodeParams decode_params(DeviceLayer& l, int s, int max_blocks, int max_kv_len) const {
    kernels::DecodeParams p;
    p.out = attn.get();
    p.kv_lens = step.kv_lens;
    p.num_seqs = s;
    p.num_q_heads = c.num_attention_heads;
    p.max_kv_len = max_kv_len;
    p.kv = paged(l, max_blocks);
    p.gate = gate(l);
    p.num_splits = kernels::decode_num_splits(s, c.num_key_value_heads, max_kv_len, sm_count);
    p.workspace = decode_workspace.get();
    return p;
  }

  // Leading sequences that add one token go to the decode kernel, the rest to the prefill
  // kernel (the engine orders a step's sequences that way).
  void attention(DeviceLayer& l, const StepShape& shape, const kernels::LinearOutput& qkv_proj) {
    if (shape.decodes > 0) {
      kernels::DecodeParams p = decode_params(l, shape.decodes, shape.max_blocks, shape.decode_kv_len);
      if (decode_projection_enabled()) {
        kernels::DecodeProjection& pr = p.projection;  // the decode rows lead the projection
        pr.qkv = qkv_proj;
        pr.q_weight = l.q_norm.get();
        pr.k_weight = l.k_norm.get();
        pr.positions = step.positions;
        pr.slot_mapping = step.slots;
        pr.rope_theta = float(c.rope_theta);
        pr.norm = norm;
      } else {
        p.query = q.get();  // written by the qk-norm kernel
      }
      decode_workspace.reserve(std::max<std::size_t>(1, kernels::decode_workspace_bytes(p, p.num_splits)));
      p.workspace = decode_workspace.get();
      kernels::launch_decode(p, stream);
    }
    if (shape.decodes == shape.seqs) return;
    const std::size_t d = std::size_t(shape.decodes);  // the prefill part starts after them
    const std::size_t qd = std::size_t(c.num_attention_heads) * c.head_dim, kvd = std::size_t(c.num_key_value_heads) * c.head_dim;
    kernels::PrefillParams p;
    p.query = q.get() + d * qd;
    p.key = k.get() + d * kvd;  // normalised and rotated in place by the qk-norm kernel
    p.value = v.get() + d * kvd;
    p.out = attn.get() + d * qd;
    p.cu_seqlens_q = step.prefill_cu_seqlens;
    p.kv_lens = step.kv_lens + d;
    p.num_seqs = shape.seqs - shape.decodes;
    p.total_q = shape.tokens - shape.decodes;
    p.max_q_len = shape.prefill_q_len;
    p.max_kv_len = shape.prefill_kv_len;
    p.num_q_heads = c.num_attention_heads;
    p.kv = paged(l, shape.max_blocks);
    p.kv.block_table = step.block_table + d * std::size_t(shape.max_blocks);
    p.gate = gate(l);
    kernels::launch_prefill(p, stream);
  }
};

namespace {
// Checked before anything touches the GPU (the cuBLASLt handle is created with the Impl).
std::unique_ptr<CudaModelRunner::Impl> make_impl() {
  check(cuda_device_available(), "CudaModelRunner: no CUDA device is visible");
  return std::make_unique<CudaModelRunner::Impl>();
}
}  // namespace

CudaModelRunner::CudaModelRunner(const ModelWeights& w, int num_blocks, int block_size, int max_tokens_per_step)
    : impl_(make_impl()) {
  Impl& m = *impl_;
  m.c = w.config;
  check(num_blocks >= 1, "CudaModelRunner: need at least one KV block");
  m.num_blocks = num_blocks;
  m.block_size = block_size;
  m.norm.eps = m.c.rms_norm_eps;
  m.norm.clip = m.c.is_async() ? m.c.uclip_value : INFINITY;
  m.sm_count = kernels::current_device_info().sm_count;
  ASYNCT_CUDA_CHECK(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking));
  ASYNCT_CUDA_CHECK(cudaStreamCreateWithFlags(&m.upload_stream, cudaStreamNonBlocking));
  ASYNCT_CUDA_CHECK(cudaStreamCreateWithFlags(&m.download_stream, cudaStreamNonBlocking));
  for (int i = 0; i < 2; ++i) {
    ASYNCT_CUDA_CHECK(cudaEventCreateWithFlags(&m.uploaded[i], cudaEventDisableTiming));
    ASYNCT_CUDA_CHECK(cudaEventCreateWithFlags(&m.computed[i], cudaEventDisableTiming));
  }

  Bf16Uploader upload(m.stream);
  m.embed_tokens = upload(w.embed_tokens);
  m.final_norm = upload(w.norm);
  if (m.c.tie_word_embeddings) {
    m.lm_head = m.embed_tokens.get();
  } else {
    m.lm_head_untied = upload(w.lm_head);
    m.lm_head = m.lm_head_untied.get();
  }
  const std::size_t cache = std::size_t(num_blocks) * block_size * m.c.num_key_value_heads * m.c.head_dim;
  for (const LayerWeights& l : w.layers) {
    DeviceLayer d;
    d.input_layernorm = upload(l.input_layernorm);
    d.qkv_proj = upload.rows({&l.q_proj, &l.k_proj, &l.v_proj});
    d.o_proj = upload(l.o_proj);
    d.q_norm = upload(l.q_norm);
    d.k_norm = upload(l.k_norm);
    d.post_attention_layernorm = upload(l.post_attention_layernorm);
    // The merged gate/up projection [2I, H] in blocks of gate and up rows (gated_linear).
    d.gate_up_proj = upload.gate_up_rows(l.gate_proj, l.up_proj);
    d.down_proj = upload(l.down_proj);
    if (m.c.is_async()) {
      d.attn_output_layernorm = upload(l.attn_output_layernorm);
      d.mlp_output_layernorm = upload(l.mlp_output_layernorm);
      d.gate_alpha = to_device_f32(l.gate_alpha);
      d.gate_sigma = to_device_f32(l.gate_sigma);
      d.gate_gamma = to_device_f32(l.gate_gamma);
    }
    d.key_cache.resize(cache);
    d.value_cache.resize(cache);
    m.layers.push_back(std::move(d));
  }
  upload.finish();
  m.reserve(std::size_t(std::max(1, max_tokens_per_step)));
}

CudaModelRunner::~CudaModelRunner() {
  if (impl_ && impl_->stream) cudaStreamDestroy(impl_->stream);
  if (impl_ && impl_->upload_stream) cudaStreamDestroy(impl_->upload_stream);
  if (impl_ && impl_->download_stream) cudaStreamDestroy(impl_->download_stream);
}

int CudaModelRunner::num_blocks() const { return impl_->num_blocks; }
void CudaModelRunner::set_profiling(bool on) { impl_->timer.enabled = on; }
void CudaModelRunner::set_cuda_graphs(bool on) { impl_->use_graphs = on; }
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
int CudaModelRunner::block_size() const { return impl_->block_size; }


// Everything a step does on the device, from the token ids to the logits of the sampling
// rows: one stream of launches, the same for eager runs and graph capture. The metadata is
// already in its device buffers.
void CudaModelRunner::Impl::run_model(const StepShape& shape, int rows) {
  const int t = shape.tokens;
  const int h = c.hidden_size, qd = c.num_attention_heads * c.head_dim, kvd = c.num_key_value_heads * c.head_dim;
  const int inter = c.intermediate_size;
  const std::size_t partial_floats = linear_partials.size();
  if (step.tokens_from_rows)  // a chained step: its token ids are the step before's greedy tokens
    kernels::launch_greedy_tokens(step.previous_summaries, step.previous_rows, step.tokens_from_rows, t, c.vocab_size,
                                  const_cast<std::int32_t*>(step.tokens), stream);
  kernels::launch_gather_rows(embed_tokens.get(), step.tokens, residual.get(), t, c.vocab_size, h, stream);
  kernels::launch_norm(residual.get(), layers[0].input_layernorm.get(), hidden.get(), t, h, norm, stream);
  timer.mark("other");

  for (std::size_t l = 0; l < layers.size(); ++l) {
    DeviceLayer& layer = layers[l];
    const kernels::LinearOutput qkv_proj = gemm.linear_for_reader(
        hidden.get(), layer.qkv_proj.get(), qkv.get(), linear_partials.get(), partial_floats, t, h, qd + 2 * kvd, stream);
    timer.mark("gemm");
    // The decode tokens' q/k norm, RoPE and cache write happen in the decode kernel (it reads the
    // projection); the prefill tokens' here, into dense q, k, v (the prefill kernel writes the
    // cache itself). ASYNCT_DECODE_PROJECTION=0 does the decode tokens here too (for measuring).
    const bool decode_reads_projection = decode_projection_enabled();
    if (shape.decodes < t || !decode_reads_projection) {
      kernels::QkNormRopeArgs qk;
      qk.qkv = qkv_proj;
      qk.q = q.get();
      qk.k = k.get();
      qk.v_out = v.get();
      qk.q_weight = layer.q_norm.get();
      qk.k_weight = layer.k_norm.get();
      qk.positions = step.positions;
      qk.tokens = t;
      qk.first_token = decode_reads_projection ? shape.decodes : 0;
      if (!decode_reads_projection && shape.decodes > 0) {  // the decode kernel reads the cache
        qk.slot_mapping = step.slots;
        qk.key_cache = layer.key_cache.get();
        qk.value_cache = layer.value_cache.get();
      }
      qk.num_q_heads = c.num_attention_heads;
      qk.num_kv_heads = c.num_key_value_heads;
      qk.head_dim = c.head_dim;
      qk.rope_theta = float(c.rope_theta);
      qk.norm = norm;
      kernels::launch_qk_norm_rope_cache_write(qk, stream);
      timer.mark("norms");
    }
    attention(layer, shape, qkv_proj);
    timer.mark("attention");
    const kernels::LinearOutput attn_proj = gemm.linear_for_reader(
        attn.get(), layer.o_proj.get(), attn_out.get(), linear_partials.get(), partial_floats, t, qd, h, stream);
    timer.mark("gemm");
    // Qwen3: residual += attn; AsyncT (Peri-LN): residual += norm(attn). Then the MLP's norm.
    if (c.is_async())
      kernels::launch_post_attn_pre_mlp(attn_proj, residual.get(), layer.attn_output_layernorm.get(),
                                        layer.post_attention_layernorm.get(), hidden.get(), t, h, norm, stream);
    else
      kernels::launch_fused_add_norm(attn_proj, residual.get(), layer.post_attention_layernorm.get(),
                                     hidden.get(), t, h, norm, stream);
    timer.mark("norms");
    gemm.gated_linear(hidden.get(), layer.gate_up_proj.get(), gate_up.get(), act.get(), t, h, inter, stream);
    timer.mark("gemm");
    const kernels::LinearOutput mlp_proj = gemm.linear_for_reader(
        act.get(), layer.down_proj.get(), mlp_out.get(), linear_partials.get(), partial_floats, t, inter, h, stream);
    timer.mark("gemm");
    // The same step closes the MLP and opens the next layer (or the final norm).
    const bf16* next = l + 1 < layers.size() ? layers[l + 1].input_layernorm.get() : final_norm.get();
    if (c.is_async())
      kernels::launch_post_attn_pre_mlp(mlp_proj, residual.get(), layer.mlp_output_layernorm.get(), next,
                                        hidden.get(), t, h, norm, stream);
    else
      kernels::launch_fused_add_norm(mlp_proj, residual.get(), next, hidden.get(), t, h, norm, stream);
    timer.mark("norms");
  }

  if (rows > 0) {
    kernels::launch_gather_rows(hidden.get(), step.logit_rows, last.get(), rows, t, h, stream);
    gemm.linear(last.get(), lm_head, logits.get(), rows, h, c.vocab_size, true, stream);
    timer.mark("lm_head");
    kernels::launch_summarize_logits(logits.get(), rows, c.vocab_size, summaries().get(), stream);
    timer.mark("sample");
  }
}

// Validates the batch while writing it into the pinned metadata buffer (the block table padded
// with block 0, which is never read past a sequence's length); `step` gets the device
// addresses the upload will fill.
void CudaModelRunner::Impl::write_metadata(const StepBatch& b, const StepShape& shape) {
  const std::size_t t = std::size_t(shape.tokens), s = std::size_t(shape.seqs), width = std::size_t(shape.max_blocks);
  const std::size_t decodes = std::size_t(shape.decodes), rows = b.logit_rows.size();
  StepMetadata& md = metadata;
  md.clear();
  const std::size_t o_tokens = md.add<std::int32_t>(t), o_positions = md.add<std::int64_t>(t),
                    o_slots = md.add<std::int64_t>(t), o_cu = md.add<std::int32_t>(s - decodes + 1),
                    o_kv_lens = md.add<std::int32_t>(s), o_table = md.add<std::int32_t>(s * width),
                    o_rows = md.add<std::int32_t>(rows), o_from = md.add<std::int32_t>(b.tokens_from_rows.size());
  md.reserve();

  std::int32_t* tokens = md.host<std::int32_t>(o_tokens);
  std::int64_t* positions = md.host<std::int64_t>(o_positions);
  std::int64_t* slots = md.host<std::int64_t>(o_slots);
  const std::int64_t cache_slots = std::int64_t(num_blocks) * block_size;
  for (std::size_t i = 0; i < t; ++i) {
    const std::int32_t id = b.tokens[i];
    const std::int64_t p = b.positions[i], slot = b.slot_mapping[i];
    check(id >= 0 && id < c.vocab_size, "forward: token id ", id, " outside the vocabulary");
    check(p >= 0 && p < c.max_position_embeddings, "forward: position ", p, " outside 0..", c.max_position_embeddings - 1);
    check(slot >= 0 && slot < cache_slots, "forward: slot ", slot, " outside the cache");
    tokens[i] = id;
    positions[i] = p;
    slots[i] = slot;
  }
  std::int32_t* cu = md.host<std::int32_t>(o_cu);  // the prefill part's, starting at 0
  for (std::size_t i = decodes; i <= s; ++i) cu[i - decodes] = b.cu_seqlens_q[i] - std::int32_t(decodes);
  std::copy(b.kv_lens.begin(), b.kv_lens.end(), md.host<std::int32_t>(o_kv_lens));
  std::int32_t* table = md.host<std::int32_t>(o_table);
  for (std::size_t i = 0; i < s; ++i) {
    const std::vector<int>& blocks = b.block_tables[i];
    for (std::size_t j = 0; j < blocks.size(); ++j) {
      check(blocks[j] >= 0 && blocks[j] < num_blocks, "forward: block ", blocks[j], " is not in the cache");
      table[i * width + j] = blocks[j];
    }
    std::fill(table + i * width + blocks.size(), table + (i + 1) * width, 0);
  }
  std::int32_t* logit_rows = md.host<std::int32_t>(o_rows);
  for (std::size_t i = 0; i < rows; ++i) {
    check(b.logit_rows[i] >= 0 && b.logit_rows[i] < std::int32_t(t), "forward: logit row ", b.logit_rows[i], " out of range");
    logit_rows[i] = b.logit_rows[i];
  }
  std::copy(b.tokens_from_rows.begin(), b.tokens_from_rows.end(), md.host<std::int32_t>(o_from));
  step = {md.device<std::int32_t>(o_tokens), md.device<std::int64_t>(o_positions), md.device<std::int64_t>(o_slots),
          md.device<std::int32_t>(o_cu),     md.device<std::int32_t>(o_kv_lens),     md.device<std::int32_t>(o_table),
          md.device<std::int32_t>(o_rows),   b.tokens_from_rows.empty() ? nullptr : md.device<std::int32_t>(o_from)};
}

namespace {
// Adds the time since the last call (or the lap's creation) to `total`.
struct Lap {
  using Clock = std::chrono::steady_clock;
  Clock::time_point last = Clock::now();
  void operator()(double& total) {
    const auto now = Clock::now();
    total += std::chrono::duration<double, std::milli>(now - last).count();
    last = now;
  }
};
}  // namespace

void CudaModelRunner::submit(const StepBatch& b) {
  Lap lap;
  Impl& m = *impl_;
  const int t = b.num_tokens(), s = b.num_seqs(), rows = int(b.logit_rows.size());
  check(m.num_queued < 2, "submit: two steps are queued already; collect one first");
  check(t >= 1 && s >= 1, "forward: empty batch");
  check(int(b.positions.size()) == t && int(b.slot_mapping.size()) == t && int(b.cu_seqlens_q.size()) == s + 1 &&
            int(b.kv_lens.size()) == s && int(b.block_tables.size()) == s && int(b.full_logits.size()) == rows,
        "forward: inconsistent batch");
  const bool chained = !b.tokens_from_rows.empty();
  if (chained) {
    check(int(b.tokens_from_rows.size()) == t, "submit: tokens_from_rows needs one row per token");
    for (std::size_t i = 0; i < b.tokens_from_rows.size(); ++i)
      check(b.tokens_from_rows[i] >= 0 && b.tokens_from_rows[i] < m.last_submitted_rows, "submit: token ", i,
            " takes row ", b.tokens_from_rows[i], " of a step that sampled ", std::max(0, m.last_submitted_rows),
            " rows");
  }

  // Split the step: leading one-token sequences to the decode kernel, the rest to prefill.
  StepShape shape;
  shape.tokens = t;
  shape.seqs = s;
  for (int i = 0; i < s; ++i) {
    const int q_len = b.cu_seqlens_q[std::size_t(i) + 1] - b.cu_seqlens_q[std::size_t(i)];
    const int kv_len = b.kv_lens[std::size_t(i)];
    check(q_len >= 1 && q_len <= kv_len, "forward: sequence ", i, " has q_len ", q_len, " and kv_len ", kv_len);
    check(kv_len <= int(b.block_tables[std::size_t(i)].size()) * m.block_size, "forward: sequence ", i,
          " has more tokens than its blocks hold");
    shape.max_blocks = std::max(shape.max_blocks, int(b.block_tables[std::size_t(i)].size()));
    if (q_len == 1 && shape.decodes == i) {
      ++shape.decodes;
      shape.decode_kv_len = std::max(shape.decode_kv_len, kv_len);
    } else {
      shape.prefill_q_len = std::max(shape.prefill_q_len, q_len);
      shape.prefill_kv_len = std::max(shape.prefill_kv_len, kv_len);
    }
  }
  check(b.cu_seqlens_q[0] == 0 && b.cu_seqlens_q[std::size_t(s)] == t, "forward: cu_seqlens_q must run from 0 to ", t);
  // All-decode steps replay CUDA graphs keyed by (sequences, block-table width, rows); the
  // width is rounded up to a power of two so that a growing context re-captures rarely, and the
  // decode kernel's splits are sized from that width's capacity, not this step's longest context.
  const bool graph = m.use_graphs && shape.decodes == s;
  if (graph) {
    int width = 1;
    while (width < shape.max_blocks) width *= 2;
    shape.max_blocks = width;
    shape.decode_kv_len = width * m.block_size;
  }

  // (A buffer that grows while another step is queued is freed with cudaFree, which waits for
  // the device: that step finishes with the old buffer first.)
  m.reserve(std::size_t(t));
  m.logits.reserve(std::size_t(std::max(rows, 1)) * std::size_t(m.c.vocab_size));  // rows that sample only
  const LogitSummary* previous_summaries = m.summaries().get();  // the turn before this step's
  m.write_metadata(b, shape);  // (this step's turn)
  m.summaries().reserve(std::size_t(std::max(rows, 1)));
  if (chained) {
    m.step.previous_summaries = previous_summaries;
    m.step.previous_rows = m.last_submitted_rows;
  }
  if (graph) {
    const kernels::DecodeParams probe = m.decode_params(m.layers[0], s, shape.max_blocks, shape.decode_kv_len);
    m.decode_workspace.reserve(std::max<std::size_t>(1, kernels::decode_workspace_bytes(probe, probe.num_splits)));
  }
  Impl::QueuedStep& q = m.queued[(m.first_queued + m.num_queued) % 2];
  if (!q.done) ASYNCT_CUDA_CHECK(cudaEventCreateWithFlags(&q.done, cudaEventDisableTiming));
  lap(m.host.prepare);

  // The metadata goes up on the upload stream, beside the step before; the step's stream waits
  // for it. Its GPU phases run from that wait ("h2d": nothing when the upload was early) to the
  // full logits' copies ("d2h"); the summaries follow on the download stream.
  const int turn = m.metadata.turn();
  m.metadata.upload(m.upload_stream);
  ASYNCT_CUDA_CHECK(cudaEventRecord(m.uploaded[turn], m.upload_stream));
  m.timer.begin(m.stream);
  ASYNCT_CUDA_CHECK(cudaStreamWaitEvent(m.stream, m.uploaded[turn], 0));
  m.timer.mark("h2d");
  if (graph)
    m.run_graph(shape, rows);
  else
    m.run_model(shape, rows);
  m.download_results(b, rows, q);
  ++m.num_queued;
  m.last_submitted_rows = rows;
  lap(m.host.launch);
}

const StepOutput& CudaModelRunner::collect() {
  Lap lap;
  Impl& m = *impl_;
  check(m.num_queued > 0, "collect: no step was submitted");
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
