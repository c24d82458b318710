// `asynct calibrate`: a copy of a checkpoint with FP8 KV-cache scales measured on a text, for
// --kv-cache-dtype fp8 (models/kv_cache_format.h reads them as a checkpoint's own).
//
// The model runs on the CPU reference over the text's first max_tokens tokens, in windows of
// `context` tokens, with a float32 cache; after each window every key and value written is read
// back from the cache (keys after RoPE, as the cache holds them). Each layer's and KV head's
// scale is headroom x its largest magnitude / 448 (e4m3's largest value), never above the bound
// rule's scale (a value cannot exceed that bound, so a larger scale only loses precision). The
// headroom (default 2) leaves room for texts with larger values than the calibration text's:
// e4m3 keeps 3 mantissa bits over a range of 2^15, so a scale 2x too large costs nothing there.
//
// The output directory gets the checkpoint's files (copied) and kv_cache_scales.safetensors
// (self_attn.k_scale / v_scale, float32 [Hkv] per layer, as llm-compressor writes them), with a
// model.safetensors.index.json that maps every tensor to its file.
#pragma once

#include <cstdint>
#include <string>

namespace asynct {

struct CalibrateOptions {
  std::string model_dir;
  std::string out_dir;
  std::string file;              // the calibration text (UTF-8)
  std::int64_t max_tokens = 2048;  // the text's first N tokens
  int context = 512;             // window length in tokens
  double headroom = 2.0;         // scale = headroom x the largest magnitude / 448
};

// Throws Error before anything is loaded for: no tokenizer, a text that cannot be read or has
// fewer than 2 tokens, an output directory that is the input or holds files already, bad values.
int run_calibrate(const CalibrateOptions& options);

}  // namespace asynct
