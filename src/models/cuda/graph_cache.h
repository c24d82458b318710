// All-decode steps captured once per shape and replayed as CUDA graphs: one launch instead of
// hundreds. A graph holds the device addresses it was captured with, so it is found by the
// step's shape (DecodeGraphKey) and replayed only while every address it baked in is the same
// (GraphAddresses); otherwise it is captured again.
#pragma once

#include <array>
#include <compare>
#include <map>

#include <cuda_runtime_api.h>

#include "models/cuda/phase_timer.h"
#include "models/cuda/step_metadata.h"

namespace asynct {

// Which graph a decode step replays.
struct DecodeGraphKey {
  int seqs = 0;
  int block_table_width = 0;  // a power of two (widen_for_graph)
  int rows = 0;               // sampling rows
  int metadata_turn = 0;      // each turn has its own metadata and summaries buffers
  bool chained = false;       // its tokens are taken from the step before on the device
  bool device_draws = false;  // its rows are drawn by the device sampler, not only summarised
  bool samples = true;        // the sampler is in the graph (else queued once the masks come)

  auto operator<=>(const DecodeGraphKey&) const = default;
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

// Rounds an all-decode step's block-table width up to a power of two, so that a growing
// context re-captures rarely, and bounds its KV lengths by that width's capacity: the decode
// kernel's splits are sized from it, not from this step's longest context.
void widen_for_graph(StepShape& shape, int block_size);

class DecodeGraphCache {
 public:
  DecodeGraphCache() = default;
  DecodeGraphCache(const DecodeGraphCache&) = delete;
  DecodeGraphCache& operator=(const DecodeGraphCache&) = delete;
  ~DecodeGraphCache();

  // Runs an all-decode step: the first step of a key runs eagerly (`run_model()`: it creates the
  // GEMM plans and loads the kernels), the second captures the graph, and from then on a step
  // is one launch. Timed as one phase, "decode_graph"; a capture shows as "capture" (the GPU
  // waits for it).
  template <typename RunModel>
  void run(const DecodeGraphKey& key, const GraphAddresses& addresses, cudaStream_t stream, PhaseTimer& timer,
           RunModel&& run_model) {
    Captured& g = graphs_[key];
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

 private:
  struct Captured {
    cudaGraphExec_t exec = nullptr;
    GraphAddresses addresses;
    bool seen = false;
  };
  static void begin_capture(Captured& g, cudaStream_t stream);
  static void abort_capture(cudaStream_t stream);
  static void end_capture(Captured& g, cudaStream_t stream, const GraphAddresses& addresses);
  static void launch(const Captured& g, cudaStream_t stream);

  std::map<DecodeGraphKey, Captured> graphs_;
};

}  // namespace asynct
