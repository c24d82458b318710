#include "models/cuda/graph_cache.h"

#include "kernels/common/cuda_check.h"

namespace asynct {

void widen_for_graph(StepShape& shape, int block_size) {
  int width = 1;
  while (width < shape.max_blocks) width *= 2;
  shape.max_blocks = width;
  shape.decode_kv_len = width * block_size;
}

DecodeGraphCache::~DecodeGraphCache() {
  for (auto& [key, g] : graphs_)
    if (g.exec) cudaGraphExecDestroy(g.exec);
}

void DecodeGraphCache::begin_capture(Captured& g, cudaStream_t stream) {
  if (g.exec) ASYNCT_CUDA_CHECK(cudaGraphExecDestroy(g.exec));
  g.exec = nullptr;
  ASYNCT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
}

void DecodeGraphCache::abort_capture(cudaStream_t stream) {
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(stream, &graph);
  if (graph) cudaGraphDestroy(graph);
}

void DecodeGraphCache::end_capture(Captured& g, cudaStream_t stream, const GraphAddresses& addresses) {
  cudaGraph_t graph = nullptr;
  ASYNCT_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  const cudaError_t instantiated = cudaGraphInstantiate(&g.exec, graph, 0);
  cudaGraphDestroy(graph);
  ASYNCT_CUDA_CHECK(instantiated);
  g.addresses = addresses;
}

void DecodeGraphCache::launch(const Captured& g, cudaStream_t stream) {
  ASYNCT_CUDA_CHECK(cudaGraphLaunch(g.exec, stream));
}

}  // namespace asynct
