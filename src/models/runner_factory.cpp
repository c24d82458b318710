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

KvCacheDtype check_runner_options(const RunnerOptions& o, const ModelConfig& config, const std::string& device) {
  const KvCacheDtype kv_dtype = resolve_kv_cache_dtype(o.kv_cache_dtype, device);
  check(o.quantization == "none" || o.quantization == "fp8", "--quantization must be none or fp8, got '", o.quantization, "'");
  check(device != "cuda" || (o.quantization == "none" && !config.fp8_weights()),
        "FP8 weights: the CUDA backend's products do not read them yet (the CPU backend runs them)");
  return kv_dtype;
}

std::unique_ptr<ModelRunner> make_runner(ModelWeights weights, const RunnerOptions& o, std::string* chosen) {
  *chosen = resolve_device(o.device);
  require_device(*chosen);
  const KvCacheDtype kv_dtype = check_runner_options(o, weights.config, *chosen);
  if (o.quantization == "fp8") weights = quantize_fp8(std::move(weights));
#ifdef ASYNCT_WITH_CUDA
  if (*chosen == "cuda") {
    auto runner = std::make_unique<CudaModelRunner>(weights, o.num_blocks, o.block_size, o.max_tokens_per_step);
    runner->set_profiling(o.profile);
    runner->set_cuda_graphs(o.cuda_graphs);
    return runner;
  }
#endif
  return std::make_unique<CpuModelRunner>(std::move(weights), o.num_blocks, o.block_size, kv_dtype);
}

}  // namespace asynct
