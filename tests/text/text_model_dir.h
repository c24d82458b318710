// Checkpoint directories with a real tokenizer for the generate tests: the Qwen3 tokenizer files
// from scripts/fetch_text_assets.sh's cache (ASYNCT_TEXT_CACHE, set by the build from ASYNCT_TEST_CACHE), beside a
// small random Qwen3 model whose vocabulary covers the tokenizer's (151936 ids, as Qwen3's).
#pragma once

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "models/config.h"
#include "models/weights.h"

#ifndef ASYNCT_TEXT_CACHE
#error "ASYNCT_TEXT_CACHE must name the text assets' cache"
#endif

namespace asynct::testing {

inline std::string qwen3_tokenizer_file(const std::string& name) {
  return std::string(ASYNCT_TEXT_CACHE) + "/qwen3/" + name;
}

// Copies the Qwen3 tokenizer.json and tokenizer_config.json into `dir`; false (with the reason
// in *why) when the cache does not have them.
inline bool copy_qwen3_tokenizer(const std::string& dir, std::string* why) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
    if (!fs::exists(qwen3_tokenizer_file(name))) {
      *why = qwen3_tokenizer_file(name) + " is missing: run scripts/fetch_text_assets.sh (scripts/test.sh does)";
      return false;
    }
    fs::copy_file(qwen3_tokenizer_file(name), fs::path(dir) / name, fs::copy_options::overwrite_existing);
  }
  return true;
}

// A one-layer Qwen3 of width 16 with random weights (~10 MB in bf16; untied, so that it does not
// echo its input). The vocabulary's two matrices are nearly all of it: the sanitizer build runs
// a 16-token request in ~5 s (~20 s at width 64).
inline ModelConfig small_text_model_config() {
  ModelConfig c = tiny_config(Architecture::Qwen3);
  c.vocab_size = 151936;
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 8;
  return c;
}

inline bool write_text_model(const std::string& dir, std::string* why) {
  if (!copy_qwen3_tokenizer(dir, why)) return false;
  write_random_checkpoint(small_text_model_config(), 1, dir);
  return true;
}

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

inline void write_json(const std::string& path, const nlohmann::json& j) { std::ofstream(path) << j.dump(1); }

}  // namespace asynct::testing
