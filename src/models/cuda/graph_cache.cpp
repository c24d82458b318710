#include "models/cuda/graph_cache.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/common/cuda_check.h"
#include "kernels/common/tuning.h"

namespace asynct {

bool replays_from_graph(const StepShape& shape) {
  const int tuned = kernels::kernel_tuning().graph_prefill_len;
  const int max_query = tuned > 0 ? tuned : kGraphMaxQueryLen;
  const int max_tokens = std::max(max_query, kGraphMaxPrefillTokens);
  return shape.decodes == shape.seqs || (shape.prefill_q_len <= max_query && shape.tokens - shape.decodes <= max_tokens);
}

void widen_for_graph(StepShape& shape, int block_size) {
  int width = 1;
  while (width < shape.max_blocks) width *= 2;
  shape.max_blocks = width;
  if (shape.decodes > 0) shape.decode_kv_len = width * block_size;
  if (shape.decodes < shape.seqs) shape.prefill_kv_len = width * block_size;
}

StepGraphCache::~StepGraphCache() {
  for (auto& [key, g] : graphs_)
    if (g.exec) cudaGraphExecDestroy(g.exec);
}

StepGraphCache::Captured& StepGraphCache::find_or_add(const StepGraphKey& key) {
  auto it = graphs_.find(key);
  if (it != graphs_.end()) {
    recent_.splice(recent_.begin(), recent_, it->second.recent);
    return it->second;
  }
  evict_beyond(std::size_t(max_shapes_ - 1));
  recent_.push_front(key);
  Captured& g = graphs_[key];
  g.recent = recent_.begin();
  return g;
}

void StepGraphCache::evict_beyond(std::size_t keep) {
  while (graphs_.size() > keep && !recent_.empty()) {
    const auto it = graphs_.find(recent_.back());
    if (it->second.exec) ASYNCT_CUDA_CHECK(cudaGraphExecDestroy(it->second.exec));
    graphs_.erase(it);
    recent_.pop_back();
  }
}

void StepGraphCache::set_max_shapes(int max_shapes) {
  check(max_shapes >= 2, "the CUDA graph cache keeps at least two shapes (the last may still run), not ", max_shapes);
  max_shapes_ = max_shapes;
  evict_beyond(std::size_t(max_shapes));
}

void StepGraphCache::begin_capture(Captured& g, cudaStream_t stream) {
  if (g.exec) ASYNCT_CUDA_CHECK(cudaGraphExecDestroy(g.exec));
  g.exec = nullptr;
  ASYNCT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
}

void StepGraphCache::abort_capture(cudaStream_t stream) {
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(stream, &graph);
  if (graph) cudaGraphDestroy(graph);
}

void StepGraphCache::end_capture(Captured& g, cudaStream_t stream, const GraphAddresses& addresses) {
  cudaGraph_t graph = nullptr;
  ASYNCT_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  const cudaError_t instantiated = cudaGraphInstantiate(&g.exec, graph, 0);
  cudaGraphDestroy(graph);
  ASYNCT_CUDA_CHECK(instantiated);
  g.addresses = addresses;
}

void StepGraphCache::launch(const Captured& g, cudaStream_t stream) {
  ASYNCT_CUDA_CHECK(cudaGraphLaunch(g.exec, stream));
}

}  // namespace asynct
