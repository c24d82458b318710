#include "cli/runner.h"

#include "core/error.h"
#include "models/cpu_model.h"
#ifdef ASYNCT_WITH_CUDA
#include "models/cuda_model.h"
#endif

namespace asynct::cli {

std::string resolve_device(const std::string& device) {
  check(device == "auto" || device == "cpu" || device == "cuda", "--device must be auto, cpu or cuda, got ", device);
  if (device != "auto") return device;
#ifdef ASYNCT_WITH_CUDA
  return cuda_device_available() ? "cuda" : "cpu";
#else
  return "cpu";
#endif
}

std::unique_ptr<ModelRunner> make_runner(ModelWeights weights, const std::string& device, int num_blocks,
                                         int block_size, int max_tokens_per_step, std::string* chosen,
                                         bool profile) {
#ifdef ASYNCT_WITH_CUDA
  if (resolve_device(device) == "cuda") {
    *chosen = "cuda";
    auto runner = std::make_unique<CudaModelRunner>(weights, num_blocks, block_size, max_tokens_per_step);
    runner->set_profiling(profile);
    return runner;
  }
#else
  check(resolve_device(device) != "cuda", "--device cuda: this build of asynct has no CUDA support");
#endif
  (void)max_tokens_per_step;
  (void)profile;
  *chosen = "cpu";
  return std::make_unique<CpuModelRunner>(std::move(weights), num_blocks, block_size);
}

}  // namespace asynct::cli
