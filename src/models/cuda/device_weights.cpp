#include "models/cuda/device_weights.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>

#include "kernels/common/cuda_check.h"
#include "kernels/gemm/linear_output.h"

namespace asynct {

using kernels::bf16;
using kernels::DeviceArray;
using kernels::PinnedArray;

namespace {

// Host weights (bf16, or float32 converted on the way) as device bf16 arrays, and FP8
// projections with their scales as they are (fp8 values copied in one piece). A 1.7B model is
// ~2e9 values: each weight goes in chunks through two reused pinned staging buffers, a chunk
// filled on the host (copied out of the weight, often a mapped checkpoint file, or converted on
// the host's threads) while the one before it is copied to the device (a copy from pinned
// memory runs asynchronously as DMA; one from pageable memory is staged by the driver and
// blocks the host). Merged weights are written part by part into their row ranges, without a
// concatenation on the host first.
class WeightUploader {
 public:
  struct RowRange {
    const Tensor* t;
    const Tensor* scale;        // FP8 weights: t's block scales
    std::int64_t first, count;  // rows [first, first + count) of t
  };

  explicit WeightUploader(cudaStream_t stream) : stream_(stream) {
    for (Staging& s : staging_) ASYNCT_CUDA_CHECK(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming));
  }
  ~WeightUploader() {
    cudaStreamSynchronize(stream_);  // copies still in flight read the staging buffers
    for (Staging& s : staging_)
      if (s.copied) cudaEventDestroy(s.copied);
  }
  WeightUploader(const WeightUploader&) = delete;
  WeightUploader& operator=(const WeightUploader&) = delete;

  DeviceArray<bf16> operator()(const Tensor& t) { return row_ranges({{&t, nullptr, 0, t.numel() ? t.size(0) : 0}}); }

  // A projection made of row ranges of host projections (merged_rows, gate_up_rows): bf16, or
  // with FP8 weights (block_rows > 0) e4m3 values and their scales, one scale row per weight row.
  DeviceProjection projection(const std::vector<RowRange>& ranges, int block_rows, int block_cols) {
    DeviceProjection d;
    d.in = int(row_length(*ranges.front().t));
    for (const RowRange& r : ranges) d.out += int(r.count);
    if (block_rows == 0) {
      d.bf16_values = row_ranges(ranges);
      return d;
    }
    check(block_cols % 16 == 0, "CudaModelRunner: FP8 weights in blocks of ", block_cols,
          " inputs; the CUDA products take blocks of a multiple of 16");
    check(d.in % 16 == 0, "CudaModelRunner: an FP8 projection of ", d.in,
          " inputs; the CUDA products take a multiple of 16");
    d.block_cols = block_cols;
    const std::size_t scale_cols = std::size_t(d.in + block_cols - 1) / block_cols;
    std::vector<std::uint8_t> values;
    std::vector<float> scales;
    values.reserve(std::size_t(d.out) * d.in);
    scales.reserve(std::size_t(d.out) * scale_cols);
    for (const RowRange& r : ranges) {
      check(r.t->dtype() == DType::F8E4M3 && r.scale && r.scale->dtype() == DType::F32 && r.scale->dim() == 2 &&
                std::size_t(r.scale->size(1)) == scale_cols,
            "CudaModelRunner: an FP8 projection (", r.t->describe(), ") without its float32 block scales");
      const auto* v = reinterpret_cast<const std::uint8_t*>(r.t->data_as<fp8_e4m3_bits>()) + std::size_t(r.first) * d.in;
      values.insert(values.end(), v, v + std::size_t(r.count) * d.in);
      const float* s = r.scale->data_as<float>();
      for (std::int64_t row = r.first; row < r.first + r.count; ++row) {
        const float* scale_row = s + std::size_t(row / block_rows) * scale_cols;
        scales.insert(scales.end(), scale_row, scale_row + scale_cols);
      }
    }
    kernels::fp8_values_to_device_order(values.data(), d.out, d.in);
    d.fp8_values.upload(values, stream_);
    d.fp8_scales.upload(kernels::fp8_scales_to_device_order(scales.data(), d.out, int(scale_cols)), stream_);
    return d;
  }
  // The parts' rows one after another, e.g. q, k, v -> the merged [qd + 2 kvd, H] projection;
  // every part has the same row length.
  static std::vector<RowRange> merged_rows(std::initializer_list<std::pair<const Tensor*, const Tensor*>> parts) {
    std::vector<RowRange> ranges;
    for (auto [t, scale] : parts) ranges.push_back({t, scale, 0, t->numel() ? t->size(0) : 0});
    return ranges;
  }
  // The merged gate/up projection [2 I, H] in the device's block order (kGluBlock gate rows,
  // then the same up rows, ...: linear_output.h).
  static std::vector<RowRange> gate_up_rows(const Tensor& gate, const Tensor* gate_scale, const Tensor& up,
                                            const Tensor* up_scale) {
    std::vector<RowRange> ranges;
    for (std::int64_t first = 0; first < gate.size(0); first += kernels::kGluBlock) {
      const std::int64_t count = std::min<std::int64_t>(kernels::kGluBlock, gate.size(0) - first);
      ranges.push_back({&gate, gate_scale, first, count});
      ranges.push_back({&up, up_scale, first, count});
    }
    return ranges;
  }
  // Returns when every copy has landed, so that the arrays can be used from any stream.
  void finish() { ASYNCT_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  DeviceArray<bf16> row_ranges(const std::vector<RowRange>& ranges) {
    std::size_t total = 0;
    for (const RowRange& r : ranges) total += std::size_t(r.count) * row_length(*r.t);
    DeviceArray<bf16> d(total);
    bf16* to = d.get();
    for (const RowRange& r : ranges) {
      const std::size_t row = row_length(*r.t);
      const bool bf16_source = r.t->dtype() == DType::BF16;
      check(bf16_source || r.t->dtype() == DType::F32, "CudaModelRunner: weight of type ", dtype_name(r.t->dtype()),
            " (bfloat16 or float32 expected)");
      const std::size_t first = std::size_t(r.first) * row;
      const std::size_t n = std::size_t(r.count) * row;
      for (std::size_t begin = 0; begin < n; begin += kChunk) {
        const std::size_t count = std::min(kChunk, n - begin);
        Staging& s = staging_[next_];
        next_ ^= 1;
        ASYNCT_CUDA_CHECK(cudaEventSynchronize(s.copied));  // its previous chunk has been copied
        s.host.reserve(count);  // grows to the largest chunk: a small model pins little
        if (bf16_source)
          std::memcpy(s.host.get(), r.t->data_as<bf16_bits>() + first + begin, count * sizeof(std::uint16_t));
        else
          floats_to_bf16(r.t->data_as<float>() + first + begin, s.host.get(), count);
        ASYNCT_CUDA_CHECK(
            cudaMemcpyAsync(to + begin, s.host.get(), count * sizeof(bf16), cudaMemcpyHostToDevice, stream_));
        ASYNCT_CUDA_CHECK(cudaEventRecord(s.copied, stream_));
      }
      to += n;
    }
    return d;
  }
  static std::size_t row_length(const Tensor& t) { return t.numel() ? std::size_t(t.numel() / t.size(0)) : 0; }

  static constexpr std::size_t kChunk = std::size_t(16) << 20;  // values: 32 MB a buffer
  struct Staging {
    PinnedArray<std::uint16_t> host;
    cudaEvent_t copied = nullptr;  // recorded after the copy out of `host`
  };
  cudaStream_t stream_;
  Staging staging_[2];
  int next_ = 0;
};

// The gate parameters, float32 on the device (a few values per layer).
DeviceArray<float> to_device_f32(const Tensor& t) {
  Tensor f = t.to(DType::F32);
  DeviceArray<float> d(std::size_t(f.numel()));
  ASYNCT_CUDA_CHECK(cudaMemcpy(d.get(), f.data(), f.nbytes(), cudaMemcpyHostToDevice));
  return d;
}

}  // namespace

DeviceWeights upload_weights(const ModelWeights& w, const ArchitectureRecipe& recipe, cudaStream_t stream) {
  DeviceWeights d;
  WeightUploader upload(stream);
  d.embed_tokens = upload(w.embed_tokens);
  d.final_norm = upload(w.norm);
  if (w.config.tie_word_embeddings) {
    d.lm_head = d.embed_tokens.get();
  } else {
    d.lm_head_untied = upload(w.lm_head);
    d.lm_head = d.lm_head_untied.get();
  }
  const int br = w.config.fp8_block_rows, bc = w.config.fp8_block_cols;  // 0: bf16 projections
  for (const LayerWeights& l : w.layers) {
    DeviceLayer dl;
    dl.input_layernorm = upload(l.input_layernorm);
    dl.qkv_proj = upload.projection(
        WeightUploader::merged_rows({{&l.q_proj, &l.q_proj_scale}, {&l.k_proj, &l.k_proj_scale}, {&l.v_proj, &l.v_proj_scale}}),
        br, bc);
    dl.o_proj = upload.projection(WeightUploader::merged_rows({{&l.o_proj, &l.o_proj_scale}}), br, bc);
    if (recipe.qk_norm) {
      dl.q_norm = upload(l.q_norm);
      dl.k_norm = upload(l.k_norm);
    }
    dl.post_attention_layernorm = upload(l.post_attention_layernorm);
    // The merged gate/up projection [2I, H] in blocks of gate and up rows (gated_linear).
    dl.gate_up_proj =
        upload.projection(WeightUploader::gate_up_rows(l.gate_proj, &l.gate_proj_scale, l.up_proj, &l.up_proj_scale), br, bc);
    dl.down_proj = upload.projection(WeightUploader::merged_rows({{&l.down_proj, &l.down_proj_scale}}), br, bc);
    if (recipe.peri_ln) {
      dl.attn_output_layernorm = upload(l.attn_output_layernorm);
      dl.mlp_output_layernorm = upload(l.mlp_output_layernorm);
    }
    if (recipe.gate == GateKind::Async) {
      dl.gate_alpha = to_device_f32(l.gate_alpha);
      dl.gate_sigma = to_device_f32(l.gate_sigma);
      dl.gate_gamma = to_device_f32(l.gate_gamma);
    }
    d.layers.push_back(std::move(dl));
  }
  upload.finish();
  return d;
}

}  // namespace asynct
