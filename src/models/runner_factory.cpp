#include "models/runner_factory.h"

#include "core/error.h"
#include "models/cpu/cpu_model_runner.h"
#ifdef ASYNCT_WITH_CUDA
#include "models/cuda/cuda_model_runner.h"
#endif

namespace asynct {

std::string resolve_device(const std::string& device) {
  check(device == "auto" || device == "cpu" || device == "cuda", "--device must be auto, cpu or cuda, got ", device);
  if (device != "auto") return device;
#ifdef ASYNCT_WITH_CUDA
  return cuda_device_available() ? "cuda" : "cpu";
#else
  return "cpu";
#endif
}

void require_device(const std::string& device) {
  if (device != "cuda") return;
#ifdef ASYNCT_WITH_CUDA
  check(cuda_device_available(), "--device cuda: no CUDA device is visible");
#else
  throw Error("--device cuda: this build of asynct has no CUDA support");
#endif
}

std::int64_t kv_cache_bytes_per_token(const ModelConfig& c, const std::string& device) {
  const std::int64_t element_bytes = device == "cuda" ? 2 : 4;
  return 2 * std::int64_t(c.num_hidden_layers) * c.num_key_value_heads * c.head_dim * element_bytes;
}

std::unique_ptr<ModelRunner> make_runner(ModelWeights weights, const RunnerOptions& o, std::string* chosen) {
  *chosen = resolve_device(o.device);
  require_device(*chosen);
#ifdef ASYNCT_WITH_CUDA
  if (*chosen == "cuda") {
    auto runner = std::make_unique<CudaModelRunner>(weights, o.num_blocks, o.block_size, o.max_tokens_per_step);
    runner->set_profiling(o.profile);
    runner->set_cuda_graphs(o.cuda_graphs);
    return runner;
  }
#endif
  return std::make_unique<CpuModelRunner>(std::move(weights), o.num_blocks, o.block_size);
}

}  // namespace asynct
