#include "models/runner_factory.h"

#include "core/error.h"
#include "models/config.h"
#include "models/cpu/cpu_model_runner.h"
#include "models/cpu_fast/cpu_fast_runner.h"
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

std::string resolve_device(const std::string& device, bool cpu_reference) {
  if (!cpu_reference) return resolve_device(device);
  check(device == "auto" || device == "cpu", "--cpu-reference runs on the CPU: --device must be auto or cpu, got ", device);
  return "cpu";
}

std::string backend_name(const std::string& device, bool cpu_reference) {
  return device == "cpu" && cpu_reference ? "cpu-reference" : device;
}

void require_device(const std::string& device) {
  if (device != "cuda") return;
#ifdef ASYNCT_WITH_CUDA
  check(cuda_device_available(), "--device cuda: no CUDA device is visible");
#else
  throw Error("--device cuda: this build of asynct has no CUDA support");
#endif
}

KvCacheDtype check_runner_options(const RunnerOptions& o, const std::string& device) {
  check(!o.cpu_reference || device == "cpu", "--cpu-reference runs on the CPU, not on ", device);
  const std::string backend = backend_name(device, o.cpu_reference);
  const KvCacheDtype kv_dtype = resolve_kv_cache_dtype(o.kv_cache_dtype, backend);
  check(o.quantization == "none" || o.quantization == "fp8" || o.quantization == "int8",
        "--quantization must be none, fp8 or int8, got '", o.quantization, "'");
  check(o.quantization != "int8" || backend == "cpu", "--quantization int8 runs on the production CPU backend (--device cpu, "
                                                      "without --cpu-reference); the ", backend, " backend reads bf16 or fp8");
  return kv_dtype;
}

std::string weights_label(const std::string& quantization, const ModelConfig& config) {
  if (quantization == "int8") return ", int8 weights";
  return quantization == "fp8" || config.fp8_weights() ? ", FP8 weights" : "";
}

std::unique_ptr<ModelRunner> make_runner(ModelWeights weights, const RunnerOptions& o, std::string* chosen) {
  const std::string device = resolve_device(o.device, o.cpu_reference);
  require_device(device);
  const KvCacheDtype kv_dtype = check_runner_options(o, device);
  *chosen = backend_name(device, o.cpu_reference);
  if (o.quantization == "fp8") weights = quantize_fp8(std::move(weights));
#ifdef ASYNCT_WITH_CUDA
  if (device == "cuda") {
    auto runner = std::make_unique<CudaModelRunner>(weights, o.num_blocks, o.block_size, o.max_tokens_per_step, kv_dtype);
    runner->set_profiling(o.profile);
    runner->set_cuda_graphs(o.cuda_graphs);
    return runner;
  }
#endif
  if (o.cpu_reference) return std::make_unique<CpuModelRunner>(std::move(weights), o.num_blocks, o.block_size, kv_dtype);
  return std::make_unique<CpuFastModelRunner>(std::move(weights), o.num_blocks, o.block_size, kv_dtype,
                                              o.quantization == "int8");
}

std::unique_ptr<DraftModel> make_draft_model(const SpeculativeOptions& speculative, const ModelConfig& target,
                                             const RunnerOptions& options) {
  const bool wanted = speculative.method == "draft";
  check(wanted == !speculative.draft_model.empty(),
        wanted ? "--speculative draft needs --draft-model DIR (a smaller checkpoint with the model's tokenizer)"
               : "--draft-model is for --speculative draft");
  if (!wanted) return nullptr;
  const ModelConfig config = load_checkpoint_config(speculative.draft_model);
  check(config.vocab_size == target.vocab_size, "--draft-model ", speculative.draft_model, ": its vocabulary has ",
        config.vocab_size, " tokens, the model's ", target.vocab_size, " (a draft model shares the model's tokenizer)");
  std::string backend;
  return std::make_unique<DraftModel>(make_runner(load_weights(speculative.draft_model), options, &backend),
                                      config.vocab_size, config.max_position_embeddings);
}

}  // namespace asynct
