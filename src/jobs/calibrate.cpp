#include "jobs/calibrate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fp8.h"
#include "engine/step_batch.h"
#include "io/safetensors.h"
#include "text/model_text.h"
#include "models/config.h"
#include "models/cpu/cpu_model_runner.h"
#include "models/kv_cache_format.h"
#include "models/weights.h"

namespace asynct {

namespace {

namespace fs = std::filesystem;

constexpr int kBlockSize = 16;
constexpr const char* kScalesFile = "kv_cache_scales.safetensors";

// The largest magnitude of each KV head's keys and values the runner cached at positions 0 ..
// tokens - 1 (one sequence, block b at cache block b), folded into *key / *value [layer][head].
void fold_amax(const CpuModelRunner& runner, const ModelConfig& c, int tokens, std::vector<float>* key,
               std::vector<float>* value) {
  const std::int64_t heads = c.num_key_value_heads, d = c.head_dim;
  for (int l = 0; l < c.num_hidden_layers; ++l)
    for (const bool is_key : {true, false}) {
      const float* cache = (is_key ? runner.key_cache(l) : runner.value_cache(l)).data_as<float>();
      std::vector<float>& amax = is_key ? *key : *value;
      for (std::int64_t slot = 0; slot < tokens; ++slot)
        for (std::int64_t h = 0; h < heads; ++h) {
          float& m = amax[std::size_t(l * heads + h)];
          for (std::int64_t i = 0; i < d; ++i) m = std::max(m, std::fabs(cache[(slot * heads + h) * d + i]));
        }
    }
}

// An output directory that is new, or empty; never the checkpoint itself.
void check_output_directory(const std::string& out, const std::string& model) {
  check(!out.empty(), "--out is required: the directory the calibrated checkpoint is written to");
  std::error_code ec;
  if (!fs::exists(out, ec)) return;
  check(fs::is_directory(out, ec), "--out ", out, " exists and is not a directory");
  check(!fs::equivalent(out, model, ec), "--out ", out, " is the checkpoint itself: write the copy elsewhere");
  check(fs::is_empty(out, ec), "--out ", out, " holds files already: give a new or empty directory");
}

}  // namespace

int run_calibrate(const CalibrateOptions& o) {
  // Every check comes before the weights are loaded.
  check(have_text_support(), no_text_support_message("calibrate (a text file)"));
  check(!o.model_dir.empty(), "--model is required");
  check_output_directory(o.out_dir, o.model_dir);
  check(o.max_tokens >= 2, "--max-tokens must be at least 2, got ", o.max_tokens);
  check(o.context >= 2, "--context must be at least 2 tokens, got ", o.context);
  check(o.headroom >= 1.0 && o.headroom <= 1024.0, "--headroom must be in [1, 1024], got ", o.headroom);
  const ModelConfig config = load_checkpoint_config(o.model_dir);
  check(o.context <= config.max_position_embeddings, "--context ", o.context, " is over the model's context of ",
        config.max_position_embeddings, " tokens (max_position_embeddings)");
  const std::unique_ptr<ModelText> tokenizer = ModelText::open(o.model_dir, ChatFormat{});
  std::vector<std::int32_t> ids = tokenizer->prompt_ids(read_text_file(o.file, "--file", "calibrate on"), "--file " + o.file);
  if (std::int64_t(ids.size()) > o.max_tokens) ids.resize(std::size_t(o.max_tokens));
  check(ids.size() >= 2, "--file ", o.file, " has ", ids.size(), " token: calibration needs at least 2");
  for (const std::int32_t id : ids)
    check(id < config.vocab_size, "--file ", o.file, ": the tokenizer gave token id ", id, ", outside the model's vocabulary");
  const Checkpoint source = Checkpoint::open(o.model_dir);
  for (int l = 0; l < config.num_hidden_layers; ++l)
    check(!source.contains("model.layers." + std::to_string(l) + ".self_attn.k_scale"), "checkpoint ", o.model_dir,
          " has KV-cache scales already (self_attn.k_scale / v_scale)");

  std::fprintf(stderr, "asynct calibrate: %s, %zu tokens of %s in windows of up to %d\n", o.model_dir.c_str(), ids.size(),
               o.file.c_str(), o.context);
  ModelWeights weights = load_weights(o.model_dir);
  const KvCacheScales bound = kv_cache_scales(weights, KvCacheDtype::Fp8E4M3);  // the checkpoint has none: the rule's
  const int window = std::min<int>(o.context, int(ids.size()));
  CpuModelRunner runner(std::move(weights), (window + kBlockSize - 1) / kBlockSize, kBlockSize);
  const std::size_t count = std::size_t(config.num_hidden_layers) * std::size_t(config.num_key_value_heads);
  std::vector<float> key_amax(count, 0.0f), value_amax(count, 0.0f);
  StepBatch batch;
  const std::size_t windows = (ids.size() + std::size_t(window) - 1) / std::size_t(window);
  for (std::size_t w = 0; w < windows; ++w) {
    const std::size_t begin = w * std::size_t(window), end = std::min(ids.size(), begin + std::size_t(window));
    const int n = int(end - begin);
    batch.reset(1);
    for (int i = 0; i < n; ++i) {
      batch.tokens.push_back(ids[begin + std::size_t(i)]);
      batch.positions.push_back(i);
      batch.slot_mapping.push_back(i);
    }
    batch.cu_seqlens_q.push_back(n);
    batch.kv_lens.push_back(n);
    for (int b = 0; b * kBlockSize < n; ++b) batch.block_tables[0].push_back(b);
    batch.logit_rows.push_back(n - 1);  // one row: the step needs one, the logits are not used
    batch.sampling.push_back({});
    batch.full_logits.push_back(0);
    runner.forward(batch);
    fold_amax(runner, config, n, &key_amax, &value_amax);
    std::fprintf(stderr, "window %zu of %zu: %d tokens\n", w + 1, windows, n);
  }

  // Scales: headroom x the largest magnitude seen / 448, at most the bound's.
  std::map<std::string, Tensor> tensors;
  double tightest = INFINITY, loosest = 0;  // the bound's scale over the calibrated one
  const int heads = config.num_key_value_heads;
  for (int l = 0; l < config.num_hidden_layers; ++l)
    for (const bool is_key : {true, false}) {
      Tensor t = Tensor::empty(DType::F32, {heads});
      for (int h = 0; h < heads; ++h) {
        const std::size_t at = std::size_t(l * heads + h);
        const float rule = is_key ? bound.key_scale(l, h) : bound.value_scale(l, h);
        const float amax = is_key ? key_amax[at] : value_amax[at];
        const float measured = float(o.headroom * double(amax) / kFp8E4M3Max);
        const float scale = amax > 0.0f ? std::min(rule, measured) : rule;
        t.data_as<float>()[h] = scale;
        tightest = std::min(tightest, double(rule / scale));
        loosest = std::max(loosest, double(rule / scale));
      }
      tensors["model.layers." + std::to_string(l) + (is_key ? ".self_attn.k_scale" : ".self_attn.v_scale")] = t;
    }

  // The copy: every file of the checkpoint but its index, the scales beside them, a new index.
  make_checkpoint_directory(o.out_dir);
  for (const fs::directory_entry& e : fs::directory_iterator(o.model_dir)) {
    if (!e.is_regular_file() || e.path().filename() == "model.safetensors.index.json") continue;
    fs::copy_file(e.path(), fs::path(o.out_dir) / e.path().filename(), fs::copy_options::overwrite_existing);
  }
  write_safetensors((fs::path(o.out_dir) / kScalesFile).string(), tensors);
  nlohmann::json map = nlohmann::json::object();
  for (const std::string& name : source.names()) map[name] = fs::path(source.file_of(name)).filename().string();
  for (const auto& [name, t] : tensors) map[name] = kScalesFile;
  std::ofstream((fs::path(o.out_dir) / "model.safetensors.index.json").string())
      << nlohmann::json{{"metadata", {{"kv_cache_scales", "asynct calibrate"}}}, {"weight_map", map}}.dump(2) << "\n";
  load_weights(o.out_dir);  // the copy loads, its scales checked

  std::printf("wrote %s: KV-cache scales for %d layers x %d KV heads from %zu tokens (headroom %.2f); the bound rule's "
              "scales are %.1fx to %.1fx these\n",
              o.out_dir.c_str(), config.num_hidden_layers, heads, ids.size(), o.headroom, tightest, loosest);
  return 0;
}

}  // namespace asynct
