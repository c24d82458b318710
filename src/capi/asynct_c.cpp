// The C ABI: converts C structs to the kernels' parameter structs and exceptions to codes.
#include "capi/asynct_c.h"

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "core/error.h"
#include "core/paged_batch.h"
#include "kernels/common/cuda_check.h"
#include "kernels/common/tuning.h"
#include "kernels/attention/decode/decode.h"
#include "kernels/gemm/gemm.h"
#include "kernels/norms/norms.h"
#include "kernels/attention/prefill/prefill.h"

namespace {

thread_local std::string last_error;

// Runs f; an exception becomes a non-zero return and the message of asynct_last_error().
template <typename F>
int guarded(F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return 1;
  }
}

using asynct::kernels::bf16;

asynct::kernels::PagedKv to_kernel(const asynct_paged_kv& kv) {
  asynct::kernels::PagedKv k;
  k.key_cache = static_cast<bf16*>(kv.key_cache);
  k.value_cache = static_cast<bf16*>(kv.value_cache);
  k.block_table = kv.block_table;
  k.max_blocks_per_seq = kv.max_blocks_per_seq;
  k.num_blocks = kv.num_blocks;
  k.block_size = kv.block_size;
  k.num_kv_heads = kv.num_kv_heads;
  k.head_dim = kv.head_dim;
  asynct::check(kv.element == 0 || kv.element == 1, "KV cache element must be 0 (bf16) or 1 (e4m3), got ", kv.element);
  k.element = kv.element == 0 ? asynct::kernels::KvElement::Bf16 : asynct::kernels::KvElement::Fp8E4M3;
  k.key_scales = kv.key_scales;
  k.value_scales = kv.value_scales;
  return k;
}

asynct::kernels::GateArgs to_kernel(const asynct_gate& g) {
  asynct::check(g.kind == 0 || g.kind == 1, "gate kind must be 0 (async) or 1 (softmax), got ", g.kind);
  asynct::kernels::GateArgs k;
  k.kind = g.kind == 0 ? asynct::GateKind::Async : asynct::GateKind::Softmax;
  k.pool_window = g.pool_window;
  k.alpha = g.alpha;
  k.sigma = g.sigma;
  k.gamma = g.gamma;
  k.softcap = g.softcap;
  return k;
}

cudaStream_t stream_of(void* s) { return static_cast<cudaStream_t>(s); }

// The GEMM contexts, one per device, made on first use and kept for the process.
std::mutex gemm_mutex;
std::map<int, std::unique_ptr<asynct::kernels::Gemm>> gemms;

}  // namespace

extern "C" {

const char* asynct_last_error(void) { return last_error.c_str(); }

int asynct_decode_num_splits(int num_seqs, int num_kv_heads, int max_kv_len, int sm_count) {
  return asynct::kernels::decode_num_splits(num_seqs, num_kv_heads, max_kv_len, sm_count);
}

size_t asynct_decode_workspace_bytes(int num_seqs, int num_q_heads, int head_dim, int num_splits) {
  asynct::kernels::DecodeParams p;
  p.num_seqs = num_seqs;
  p.num_q_heads = num_q_heads;
  p.kv.head_dim = head_dim;
  return asynct::kernels::decode_workspace_bytes(p, num_splits);
}

int asynct_decode(const void* query, void* out, const int32_t* kv_lens, int num_seqs,
                  int num_q_heads, int max_kv_len, float scale, asynct_paged_kv kv,
                  asynct_gate gate, int num_splits, void* workspace,
                  unsigned long long* counters, void* stream) {
  return guarded([&] {
    asynct::kernels::DecodeParams p;
    p.query = static_cast<const bf16*>(query);
    p.out = static_cast<bf16*>(out);
    p.kv_lens = kv_lens;
    p.num_seqs = num_seqs;
    p.num_q_heads = num_q_heads;
    p.max_kv_len = max_kv_len;
    p.scale = scale;
    p.kv = to_kernel(kv);
    p.gate = to_kernel(gate);
    p.num_splits = num_splits;
    p.workspace = workspace;
    p.counters = counters;
    asynct::kernels::launch_decode(p, stream_of(stream));
  });
}

int asynct_prefill(const void* query, const void* key, const void* value, void* out,
                   const int32_t* cu_seqlens_q, const int32_t* kv_lens, int num_seqs, int total_q,
                   int max_q_len, int max_kv_len, int num_q_heads, float scale,
                   asynct_paged_kv kv, asynct_gate gate, void* stream) {
  return guarded([&] {
    asynct::kernels::PrefillParams p;
    p.query = static_cast<const bf16*>(query);
    p.key = static_cast<const bf16*>(key);
    p.value = static_cast<const bf16*>(value);
    p.out = static_cast<bf16*>(out);
    p.cu_seqlens_q = cu_seqlens_q;
    p.kv_lens = kv_lens;
    p.num_seqs = num_seqs;
    p.total_q = total_q;
    p.max_q_len = max_q_len;
    p.max_kv_len = max_kv_len;
    p.num_q_heads = num_q_heads;
    p.scale = scale;
    p.kv = to_kernel(kv);
    p.gate = to_kernel(gate);
    asynct::kernels::launch_prefill(p, stream_of(stream));
  });
}

int asynct_check_paged_batch(asynct_paged_kv kv, const int32_t* kv_lens, int num_seqs, int max_kv_len,
                             const int32_t* cu_seqlens_q, int total_q, int max_q_len, void* stream) {
  return guarded([&] {
    constexpr const char* who = "paged batch";
    asynct::check(num_seqs >= 1 && kv.max_blocks_per_seq >= 1, who, ": ", num_seqs, " sequences, ",
                  kv.max_blocks_per_seq, " blocks per block-table row");
    asynct::check(kv_lens && kv.block_table, who, ": null kv_lens or block_table");
    auto download = [&](const int32_t* from, std::size_t count) {
      std::vector<int32_t> host(count);
      ASYNCT_CUDA_CHECK(cudaMemcpyAsync(host.data(), from, count * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                        stream_of(stream)));
      return host;
    };
    const std::vector<int32_t> lens = download(kv_lens, std::size_t(num_seqs));
    const std::vector<int32_t> table = download(kv.block_table, std::size_t(num_seqs) * std::size_t(kv.max_blocks_per_seq));
    const std::vector<int32_t> offsets = cu_seqlens_q ? download(cu_seqlens_q, std::size_t(num_seqs) + 1) : std::vector<int32_t>{};
    ASYNCT_CUDA_CHECK(cudaStreamSynchronize(stream_of(stream)));
    asynct::PagedBatch b;
    b.num_seqs = num_seqs;
    b.kv_lens = lens.data();
    b.max_kv_len = max_kv_len;
    b.block_table = table.data();
    b.max_blocks_per_seq = kv.max_blocks_per_seq;
    b.num_blocks = kv.num_blocks;
    b.block_size = kv.block_size;
    if (cu_seqlens_q) {
      b.cu_seqlens_q = offsets.data();
      b.total_q = total_q;
      b.max_q_len = max_q_len;
    }
    asynct::check_paged_batch(b, who);
  });
}

int asynct_norm(const void* x, const void* weight, void* out, int rows, int hidden, float eps,
                float clip, void* stream) {
  return guarded([&] {
    asynct::kernels::launch_norm(static_cast<const bf16*>(x), static_cast<const bf16*>(weight),
                                 static_cast<bf16*>(out), rows, hidden, {eps, clip},
                                 stream_of(stream));
  });
}

int asynct_fused_add_norm(const void* x, void* residual, const void* weight, void* out, int rows,
                          int hidden, float eps, float clip, void* stream) {
  return guarded([&] {
    asynct::kernels::launch_fused_add_norm(static_cast<const bf16*>(x), static_cast<bf16*>(residual),
                                           static_cast<const bf16*>(weight), static_cast<bf16*>(out),
                                           rows, hidden, {eps, clip}, stream_of(stream));
  });
}

int asynct_post_attn_pre_mlp(const void* attn_out, void* residual, const void* out_weight,
                             const void* next_weight, void* mlp_in, int rows, int hidden,
                             float eps, float clip, void* stream) {
  return guarded([&] {
    asynct::kernels::launch_post_attn_pre_mlp(
        static_cast<const bf16*>(attn_out), static_cast<bf16*>(residual),
        static_cast<const bf16*>(out_weight), static_cast<const bf16*>(next_weight),
        static_cast<bf16*>(mlp_in), rows, hidden, {eps, clip}, stream_of(stream));
  });
}

int asynct_linear(const void* x, const void* weight, void* y, int rows, int in, int out,
                  int out_fp32, int path, void* stream) {
  return guarded([&] {
    using asynct::kernels::GemmPath;
    asynct::check(path >= 0 && path <= 3, "linear: path must be 0..3, got ", path);
    int device = 0;
    ASYNCT_CUDA_CHECK(cudaGetDevice(&device));
    std::lock_guard<std::mutex> lock(gemm_mutex);
    auto& gemm = gemms[device];
    if (!gemm) gemm = std::make_unique<asynct::kernels::Gemm>();
    gemm->linear(static_cast<const bf16*>(x), static_cast<const bf16*>(weight), y, rows, in, out, out_fp32 != 0,
                 stream_of(stream), static_cast<GemmPath>(path));
  });
}

int asynct_set_tuning(const char* name, const char* value) {
  return guarded([&] {
    namespace k = asynct::kernels;
    asynct::check(name != nullptr, "set_tuning: null name");
    const std::string wanted = name;
    const auto& names = k::kernel_tuning_names();
    bool known = false;
    std::string all;
    for (const std::string& n : names) {
      known |= n == wanted;
      all += (all.empty() ? "" : ", ") + n;
    }
    asynct::check(known, "set_tuning: unknown name '", wanted, "'; expected one of ", all);
    // The named override from `value`, or its default when value is null or empty.
    k::KernelTuning base = k::kernel_tuning();
    if (value == nullptr || *value == '\0') {
      const k::KernelTuning reset{};
      if (wanted == "ASYNCT_GEMM") base.gemm = reset.gemm;
      if (wanted == "ASYNCT_PREFILL") base.prefill = reset.prefill;
      if (wanted == "ASYNCT_PREFILL_SPLITS") base.prefill_kv_splits = reset.prefill_kv_splits;
      if (wanted == "ASYNCT_PREFILL_GROUP") base.prefill_seq_group = reset.prefill_seq_group;
      if (wanted == "ASYNCT_PREFILL_CTAS") base.prefill_ctas = reset.prefill_ctas;
      if (wanted == "ASYNCT_SKINNY_TILE") base.skinny.tile_n = reset.skinny.tile_n;
      if (wanted == "ASYNCT_SKINNY_SPLITS") base.skinny.splits = reset.skinny.splits;
      if (wanted == "ASYNCT_SKINNY_WGMMA") base.skinny.wgmma = reset.skinny.wgmma;
      if (wanted == "ASYNCT_PDL") base.dependent_launch = reset.dependent_launch;
      if (wanted == "ASYNCT_GRAPH_PREFILL") base.graph_prefill_len = reset.graph_prefill_len;
      k::set_kernel_tuning(base);
      return;
    }
    k::set_kernel_tuning(k::parse_kernel_tuning(
        [&](const char* n) -> const char* { return wanted == n ? value : nullptr; }, base));
  });
}

}  // extern "C"
