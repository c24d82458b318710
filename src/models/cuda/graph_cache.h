// All-decode steps, and small steps (a few new tokens a sequence: speculative verification, a
// short prompt), captured once per shape and replayed as CUDA graphs: one launch instead of
// hundreds. A graph holds the device addresses it was captured with, so it is found by the
// step's shape (StepGraphKey) and replayed only while every address it baked in is the same
// (GraphAddresses); otherwise it is captured again. The cache keeps at most a set number of
// shapes (each graph holds host and device memory): the least recently run goes first.
#pragma once

#include <array>
#include <compare>
#include <list>
#include <map>

#include <cuda_runtime_api.h>

#include "models/cuda/phase_timer.h"
#include "models/cuda/step_metadata.h"

namespace asynct {

// The largest prefill part a step replayed from a graph has by default: its longest sequence's
// new tokens (a question after a cached system prompt, a verification of drafts) and its new
// tokens in all. Larger ones run eagerly: their launches are a small part of their time. The
// 64-token question replayed: AsyncT 3.5 -> 3.0 ms at the server [W35H].
// KernelTuning::graph_prefill_len overrides the first (and the second, when larger).
constexpr int kGraphMaxQueryLen = 64;
constexpr int kGraphMaxPrefillTokens = 64;

// Whether a step is replayed from a graph: every sequence one new token, or a small prefill part.
bool replays_from_graph(const StepShape& shape);

// Which graph a step replays.
struct StepGraphKey {
  int seqs = 0;
  int tokens = 0;
  int decodes = 0;            // leading one-token sequences; the rest is the prefill part
  int prefill_q_len = 0;      // the prefill part's longest sequence
  int block_table_width = 0;  // a power of two (widen_for_graph)
  int rows = 0;               // sampling rows
  int metadata_turn = 0;      // each turn has its own metadata and summaries buffers
  bool chained = false;       // its tokens are taken from the step before on the device
  bool device_draws = false;  // its rows are drawn by the device sampler, not only summarised
  bool samples = true;        // the sampler is in the graph (else queued once the masks come)

  auto operator<=>(const StepGraphKey&) const = default;
};

// Every address a decode graph reads or writes apart from the weights and the KV cache (which
// never move): the activation buffers (Activations::addresses), this turn's summaries, the
// decode kernel's workspace and the step's metadata. A buffer that grew has moved.
struct GraphAddresses {
  std::array<const void*, 14> activations{};
  const void* summaries = nullptr;
  const void* top_logprobs = nullptr;
  const void* decode_workspace = nullptr;
  StepPointers step;

  bool operator==(const GraphAddresses&) const = default;
};

// Rounds a replayed step's block-table width up to a power of two, so that a growing context
// re-captures rarely, and bounds its KV lengths by that width's capacity: the attention kernels'
// key splits are sized from it, not from this step's longest context.
void widen_for_graph(StepShape& shape, int block_size);

// The shapes a runner's cache keeps by default: a server's decode batch sizes at a few block-table
// widths and both metadata turns, and its short prompts' lengths.
constexpr int kMaxCapturedShapes = 512;

class StepGraphCache {
 public:
  StepGraphCache() = default;
  StepGraphCache(const StepGraphCache&) = delete;
  StepGraphCache& operator=(const StepGraphCache&) = delete;
  ~StepGraphCache();

  // Runs a step of a replayed shape: the first step of a key runs eagerly (`run_model()`: it creates the
  // GEMM plans, loads the kernels and sizes the workspaces), the second captures the graph, and from then on a step
  // is one launch. Timed as one phase, "decode_graph"; a capture shows as "capture" (the GPU
  // waits for it).
  template <typename RunModel>
  void run(const StepGraphKey& key, const GraphAddresses& addresses, cudaStream_t stream, PhaseTimer& timer,
           RunModel&& run_model) {
    Captured& g = find_or_add(key);
    if (!g.seen) {
      g.seen = true;
      run_model();
      return;
    }
    if (!g.exec || !(g.addresses == addresses)) {
      const bool timing = timer.enabled;  // events are not recorded inside graphs
      timer.enabled = false;
      begin_capture(g, stream);
      try {
        run_model();
      } catch (...) {
        abort_capture(stream);
        timer.enabled = timing;
        throw;
      }
      timer.enabled = timing;
      end_capture(g, stream, addresses);
      timer.mark("capture");
    }
    launch(g, stream);
    timer.mark("decode_graph");
  }

  // Sets how many shapes it keeps, at least 2 (the step replayed last may still run while the
  // next is submitted: it is never the one dropped); the least recently run beyond that go.
  void set_max_shapes(int max_shapes);

 private:
  struct Captured {
    cudaGraphExec_t exec = nullptr;
    GraphAddresses addresses;
    bool seen = false;
    std::list<StepGraphKey>::iterator recent;  // its place in recent_
  };
  // The key's entry, now the most recently run; a new one past max_shapes_ evicts the least
  // recently run.
  Captured& find_or_add(const StepGraphKey& key);
  void evict_beyond(std::size_t keep);
  static void begin_capture(Captured& g, cudaStream_t stream);
  static void abort_capture(cudaStream_t stream);
  static void end_capture(Captured& g, cudaStream_t stream, const GraphAddresses& addresses);
  static void launch(const Captured& g, cudaStream_t stream);

  int max_shapes_ = kMaxCapturedShapes;
  std::map<StepGraphKey, Captured> graphs_;
  std::list<StepGraphKey> recent_;  // most recently run first
};

}  // namespace asynct
