/* The C ABI over asynct's CUDA kernels, for Python (ctypes) and other languages.
 * Every function returns 0 on success and non-zero on error; asynct_last_error() then says
 * what was wrong (thread-local). Pointers are device pointers; `stream` is a cudaStream_t
 * (NULL: the default stream). bf16 tensors are row-major as described in src/kernels/. */
#ifndef ASYNCT_C_H
#define ASYNCT_C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

const char* asynct_last_error(void);

/* The paged KV cache and the gate, as in src/kernels/attention/attention_args.h. element: 0 bf16,
 * 1 e4m3 (FP8, value / scale; key_scales and value_scales: device float32 [num_kv_heads]; read
 * by asynct_decode only so far). */
typedef struct {
  void* key_cache;
  void* value_cache;
  const int32_t* block_table;
  int max_blocks_per_seq, num_blocks, block_size, num_kv_heads, head_dim;
  int element;
  const float *key_scales, *value_scales;
} asynct_paged_kv;

typedef struct {
  int kind; /* 0 async, 1 softmax */
  int pool_window;
  const float *alpha, *sigma, *gamma;
  float softcap;
} asynct_gate;

int asynct_decode_num_splits(int num_seqs, int num_kv_heads, int max_kv_len, int sm_count);
size_t asynct_decode_workspace_bytes(int num_seqs, int num_q_heads, int head_dim, int num_splits);
int asynct_decode(const void* query, void* out, const int32_t* kv_lens, int num_seqs,
                  int num_q_heads, int max_kv_len, float scale, asynct_paged_kv kv,
                  asynct_gate gate, int num_splits, void* workspace,
                  unsigned long long* counters, void* stream);

int asynct_prefill(const void* query, const void* key, const void* value, void* out,
                   const int32_t* cu_seqlens_q, const int32_t* kv_lens, int num_seqs, int total_q,
                   int max_q_len, int max_kv_len, int num_q_heads, float scale,
                   asynct_paged_kv kv, asynct_gate gate, void* stream);

/* Checks a batch's paged metadata before a decode or prefill call (core/paged_batch.h): kv_lens
 * in 1..max_kv_len and within each sequence's block-table row, every block a sequence uses a
 * block of the cache, and, with cu_seqlens_q (prefill; NULL for decode), query offsets from 0 to
 * total_q whose lengths fit max_q_len and kv_len. The kernels read these on the device and trust
 * them; this copies them to the host (waiting for `stream`) and names what is wrong. */
int asynct_check_paged_batch(asynct_paged_kv kv, const int32_t* kv_lens, int num_seqs, int max_kv_len,
                             const int32_t* cu_seqlens_q, int total_q, int max_q_len, void* stream);

/* Norms: clip = +inf gives RMSNorm. */
int asynct_norm(const void* x, const void* weight, void* out, int rows, int hidden, float eps,
                float clip, void* stream);
int asynct_fused_add_norm(const void* x, void* residual, const void* weight, void* out, int rows,
                          int hidden, float eps, float clip, void* stream);
int asynct_post_attn_pre_mlp(const void* attn_out, void* residual, const void* out_weight,
                             const void* next_weight, void* mlp_in, int rows, int hidden,
                             float eps, float clip, void* stream);

/* Dense layer y[rows, out] = x[rows, in] W^T, W [out, in] row-major, bf16 in, bf16 or fp32
 * (out_fp32) out. path: 0 the engine's default, 1 cuBLASLt's heuristic choice, 2 cuBLASLt
 * tuned per shape, 3 the skinny split-K kernel (src/kernels/gemm/gemm.h). One GEMM context (cuBLASLt
 * handle, plans, workspace) per device, shared by the calling threads. */
int asynct_linear(const void* x, const void* weight, void* y, int rows, int in, int out,
                  int out_fp32, int path, void* stream);

/* Sets one override of the kernels' own choices (src/kernels/common/tuning.h, KernelTuning) by its
 * ASYNCT_* name: ASYNCT_GEMM, ASYNCT_PREFILL, ASYNCT_PREFILL_SPLITS, ASYNCT_PREFILL_GROUP,
 * ASYNCT_PREFILL_CTAS, ASYNCT_SKINNY_TILE, ASYNCT_SKINNY_SPLITS, ASYNCT_SKINNY_WGMMA, ASYNCT_PDL or ASYNCT_GRAPH_PREFILL, with a value in the form the variable takes; value NULL or
 * "" restores that override's default. The others are kept. Applies to every later launch in the
 * process (not to CUDA graphs already captured); set it between launches, not during them. */
int asynct_set_tuning(const char* name, const char* value);

#ifdef __cplusplus
}
#endif

#endif
