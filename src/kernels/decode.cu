// Paged decode attention. One CTA handles one (KV head, sequence, split): the query heads that
// share the KV head share its K/V loads. Each chunk of keys goes through three phases:
//   1. scores: a group of head_dim/8 threads shares one key's dot products (16-byte loads of K,
//      shuffle reduction), scores land in shared memory;
//   2. gate:   the policy turns scores into weights P. The async policy also compacts the keys
//      whose P is non-zero for some head (sparse-P); softmax rescales its running state;
//   3. PV:     thread groups walk the (compacted) key list and load only those V rows.
// With several splits, stage 2 combines the partial outputs: a plain sum for the async gate
// (additivity: each split recomputes its W-1 halo scores), the log-sum-exp merge for softmax.
#include "kernels/decode.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "kernels/bf16.cuh"
#include "kernels/cuda_check.h"
#include "kernels/gate.cuh"

namespace asynct::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kChunk = 512;     // keys per chunk (scores live in shared memory)
constexpr int kMaxHalo = 7;     // pool window <= 8
constexpr int kUnroll = 4;      // independent 16-byte loads in flight per thread

struct DecodeShape {
  int head_dim, group, pool_window;
};

// Where key/value `pos` of a sequence lives, through the block table.
__device__ __forceinline__ long long kv_row(const PagedKv& kv, const std::int32_t* table,
                                            int pos, int kv_head) {
  const int block = table[pos / kv.block_size];  // block_size is a power of two: cheap
  return ((long long)block * kv.block_size + (pos & (kv.block_size - 1))) * kv.num_kv_heads +
         kv_head;
}

__device__ __forceinline__ Bf16x8 load_stream(const bf16* p) {
  // K and V are read once: keep them out of L1.
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  Bf16x8 out;
  memcpy(&out, &v, 16);
  return out;
}

// Shared memory of one CTA.
template <int kGroup>
struct DecodeSmem {
  float scores[kGroup][kChunk + kMaxHalo + 1];
  float weights[kGroup][kChunk];  // P of the listed keys
  int keys[kChunk];               // the key positions the PV phase visits
  int list_size;
  float reduce[kThreads / 32][kGroup];
};

// ---- The gates as policies: what happens between the scores and the PV loop. -------------

struct AsyncPolicy {
  static constexpr bool kSparse = true;
  int window;
  float alpha[8], sigma[8], gamma[8];

  template <int kGroup>
  __device__ void init(const GateArgs& gate, int first_head) {
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      alpha[h] = gate.alpha[first_head + h];
      sigma[h] = gate.sigma[first_head + h];
      gamma[h] = gate.gamma[first_head + h];
    }
  }
  __device__ int halo() const { return window - 1; }
  __device__ float score(float s) const { return s; }

  // Lists the keys with a non-zero P for some head of the group (sparse-P).
  template <int kGroup>
  __device__ void gate_chunk(DecodeSmem<kGroup>& sm, int chunk_begin, int chunk_end, int halo,
                             unsigned long long* nonzero) {
    const int lane = threadIdx.x & 31;
    int local_nonzero = 0;
    for (int base = chunk_begin; base < chunk_end; base += kThreads) {
      const int j = base + int(threadIdx.x);
      float p[kGroup];
      bool any = false;
      if (j < chunk_end) {
        const int idx = j - chunk_begin + halo;  // index into scores
#pragma unroll
        for (int h = 0; h < kGroup; ++h) {
          float pooled = 0.0f;
          for (int t = 0; t < window && j - t >= 0; ++t) pooled += fmaxf(sm.scores[h][idx - t], 0.0f);
          pooled /= float(window);
          p[h] = async_gate(sm.scores[h][idx], pooled, alpha[h], sigma[h], gamma[h]);
          any |= p[h] != 0.0f;
          local_nonzero += p[h] != 0.0f;
        }
      }
      // Append this warp's listed keys: one shared atomic per warp, ballot for the order.
      const unsigned mask = __ballot_sync(0xffffffffu, any);
      int warp_base = 0;
      if (lane == 0 && mask) warp_base = atomicAdd(&sm.list_size, __popc(mask));
      warp_base = __shfl_sync(0xffffffffu, warp_base, 0);
      if (any) {
        const int slot = warp_base + __popc(mask & ((1u << lane) - 1u));
        sm.keys[slot] = j;
#pragma unroll
        for (int h = 0; h < kGroup; ++h) sm.weights[h][slot] = p[h];
      }
    }
    if (nonzero && local_nonzero) atomicAdd(nonzero, (unsigned long long)local_nonzero);
  }
  template <int kGroup>
  __device__ void rescale(float (&)[kGroup][8], float (&)[kGroup]) const {}
};

struct SoftmaxPolicy {
  static constexpr bool kSparse = false;
  float softcap;
  float running_max[8];  // per head, the same in every thread
  float chunk_scale[8];  // exp(old max - new max) for this chunk

  template <int kGroup>
  __device__ void init(const GateArgs&, int) {
#pragma unroll
    for (int h = 0; h < kGroup; ++h) running_max[h] = -FLT_MAX;
  }
  __device__ int halo() const { return 0; }
  __device__ float score(float s) const { return softcap_score(s, softcap); }

  template <int kGroup>
  __device__ void gate_chunk(DecodeSmem<kGroup>& sm, int chunk_begin, int chunk_end, int,
                             unsigned long long* nonzero) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n = chunk_end - chunk_begin;
    // The chunk's max per head, then the new running max.
    float local[kGroup];
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      local[h] = -FLT_MAX;
      for (int i = threadIdx.x; i < n; i += kThreads) local[h] = fmaxf(local[h], sm.scores[h][i]);
      for (int o = 16; o; o >>= 1) local[h] = fmaxf(local[h], __shfl_xor_sync(0xffffffffu, local[h], o));
      if (lane == 0) sm.reduce[warp][h] = local[h];
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      float m = running_max[h];
      for (int w = 0; w < kThreads / 32; ++w) m = fmaxf(m, sm.reduce[w][h]);
      chunk_scale[h] = __expf(running_max[h] - m);
      running_max[h] = m;
    }
    for (int i = threadIdx.x; i < n; i += kThreads) {
      sm.keys[i] = chunk_begin + i;
#pragma unroll
      for (int h = 0; h < kGroup; ++h) sm.weights[h][i] = __expf(sm.scores[h][i] - running_max[h]);
    }
    if (threadIdx.x == 0) sm.list_size = n;
    if (nonzero && threadIdx.x == 0) atomicAdd(nonzero, (unsigned long long)n * kGroup);
  }
  // Brings the running output and denominator to the new max.
  template <int kGroup>
  __device__ void rescale(float (&o)[kGroup][8], float (&l)[kGroup]) const {
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      l[h] *= chunk_scale[h];
#pragma unroll
      for (int e = 0; e < 8; ++e) o[h][e] *= chunk_scale[h];
    }
  }
};

// ---- Stage 1 --------------------------------------------------------------------------------

struct Stage1Args {
  DecodeParams p;
  int keys_per_split;
  float scale;
  float* partial_out;  // [splits, seqs, Hq, D] (null when one split)
  float* partial_max;  // [splits, seqs, Hq] softmax only
  float* partial_sum;
};

template <int kHeadDim, int kGroup, typename Policy>
__global__ void __launch_bounds__(kThreads) decode_stage1(Stage1Args a, Policy policy) {
  constexpr int kGroupThreads = kHeadDim / 8;  // threads sharing one key's dot product
  constexpr int kKeyGroups = kThreads / kGroupThreads;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto& sm = *reinterpret_cast<DecodeSmem<kGroup>*>(smem_raw);

  const DecodeParams& p = a.p;
  const int kv_head = blockIdx.x, seq = blockIdx.y, split = blockIdx.z;
  // Clamped to what the block table can address, so a bad length cannot read past it.
  const int kv_len = min(p.kv_lens[seq], p.kv.max_blocks_per_seq * p.kv.block_size);
  const int split_begin = split * a.keys_per_split;
  const int split_end = min(kv_len, split_begin + a.keys_per_split);
  const int key_group = threadIdx.x / kGroupThreads;
  const int slice = threadIdx.x % kGroupThreads;  // which 8 elements of head_dim
  const std::int32_t* table = p.kv.block_table + (long long)seq * p.kv.max_blocks_per_seq;
  const int first_head = kv_head * kGroup;
  policy.template init<kGroup>(p.gate, first_head);

  // This thread's 8 elements of each query head, pre-scaled.
  float q[kGroup][8];
#pragma unroll
  for (int h = 0; h < kGroup; ++h) {
    to_float8(load_bf16x8(p.query + ((long long)seq * p.num_q_heads + first_head + h) * kHeadDim +
                          slice * 8), q[h]);
#pragma unroll
    for (int e = 0; e < 8; ++e) q[h][e] *= a.scale;
  }
  float o[kGroup][8] = {};
  float l[kGroup] = {};
  unsigned long long* nonzero = p.counters;
  int rows_loaded = 0;

  for (int chunk_begin = split_begin; chunk_begin < split_end; chunk_begin += kChunk) {
    const int chunk_end = min(split_end, chunk_begin + kChunk);
    const int halo = min(policy.halo(), chunk_begin);  // recomputed, never carried
    const int first = chunk_begin - halo;
    const int count = chunk_end - first;
    if (threadIdx.x == 0) sm.list_size = 0;

    // Phase 1: scores of keys first .. chunk_end-1.
    // The loop bounds are the same for every thread: the shuffles below need whole warps.
    for (int base = 0; base < count; base += kKeyGroups * kUnroll) {
      Bf16x8 k[kUnroll] = {};
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = base + key_group + u * kKeyGroups;
        if (i < count)
          k[u] = load_stream(p.kv.key_cache + kv_row(p.kv, table, first + i, kv_head) * kHeadDim + slice * 8);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = base + key_group + u * kKeyGroups;
        float kf[8];
        to_float8(k[u], kf);
#pragma unroll
        for (int h = 0; h < kGroup; ++h) {
          float dot = 0.0f;
#pragma unroll
          for (int e = 0; e < 8; ++e) dot = fmaf(q[h][e], kf[e], dot);
#pragma unroll
          for (int off = kGroupThreads / 2; off; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
          if (slice == 0 && i < count) sm.scores[h][i] = policy.score(dot);
        }
      }
    }
    __syncthreads();

    // Phase 2: the gate.
    policy.gate_chunk(sm, chunk_begin, chunk_end, halo, nonzero);
    __syncthreads();
    policy.rescale(o, l);

    // Phase 3: P V over the listed keys.
    const int listed = sm.list_size;
    rows_loaded += listed;
    for (int base = 0; base < listed; base += kKeyGroups * kUnroll) {
      Bf16x8 v[kUnroll] = {};
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = base + key_group + u * kKeyGroups;
        if (i < listed)
          v[u] = load_stream(p.kv.value_cache + kv_row(p.kv, table, sm.keys[i], kv_head) * kHeadDim + slice * 8);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int i = base + key_group + u * kKeyGroups;
        if (i >= listed) break;
        float vf[8];
        to_float8(v[u], vf);
#pragma unroll
        for (int h = 0; h < kGroup; ++h) {
          const float w = sm.weights[h][i];
          if (!Policy::kSparse && slice == 0) l[h] += w;
#pragma unroll
          for (int e = 0; e < 8; ++e) o[h][e] = fmaf(w, vf[e], o[h][e]);
        }
      }
    }
    __syncthreads();  // the next chunk overwrites the lists
  }
  if (p.counters && threadIdx.x == 0) atomicAdd(p.counters + 1, (unsigned long long)rows_loaded);

  // Sum the key groups' partial outputs (and softmax denominators) through shared memory.
  float* acc = reinterpret_cast<float*>(smem_raw);  // [kKeyGroups][kGroup][kHeadDim]
  float* sums = acc + kKeyGroups * kGroup * kHeadDim;  // [kKeyGroups][kGroup]
  float* maxes = sums + kKeyGroups * kGroup;           // [kGroup], softmax's running max
#pragma unroll
  for (int h = 0; h < kGroup; ++h) {
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[(key_group * kGroup + h) * kHeadDim + slice * 8 + e] = o[h][e];
    if (slice == 0) sums[key_group * kGroup + h] = l[h];
    if constexpr (!Policy::kSparse) {
      if (threadIdx.x == 0) maxes[h] = policy.running_max[h];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < kGroup * kHeadDim; idx += kThreads) {
    const int h = idx / kHeadDim, d = idx % kHeadDim;
    float total = 0.0f, denom = 0.0f;
    for (int g = 0; g < kKeyGroups; ++g) {
      total += acc[(g * kGroup + h) * kHeadDim + d];
      denom += sums[g * kGroup + h];
    }
    const long long row = (long long)seq * p.num_q_heads + first_head + h;
    if (a.partial_out == nullptr) {  // one split: finish here
      if (!Policy::kSparse) total = denom > 0.0f ? total / denom : 0.0f;
      p.out[row * kHeadDim + d] = __float2bfloat16(total);
    } else {
      const long long prow = (long long)split * p.num_seqs * p.num_q_heads + row;
      a.partial_out[prow * kHeadDim + d] = total;
      if constexpr (!Policy::kSparse) {
        if (d == 0) {
          a.partial_max[prow] = split_begin < split_end ? maxes[h] : -FLT_MAX;
          a.partial_sum[prow] = denom;
        }
      }
    }
  }
}

// ---- Stage 2: combine the splits. -----------------------------------------------------------

template <bool kSoftmax>
__global__ void decode_stage2(const float* partial_out, const float* partial_max,
                              const float* partial_sum, bf16* out, int splits, int rows,
                              int head_dim) {
  const int row = blockIdx.x;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float total = 0.0f;
    if constexpr (!kSoftmax) {  // additivity: the parts just add up
      for (int s = 0; s < splits; ++s) total += partial_out[((long long)s * rows + row) * head_dim + d];
    } else {
      float m = -FLT_MAX;
      for (int s = 0; s < splits; ++s) m = fmaxf(m, partial_max[(long long)s * rows + row]);
      float denom = 0.0f;
      for (int s = 0; s < splits; ++s) {
        const float w = __expf(partial_max[(long long)s * rows + row] - m);
        denom += w * partial_sum[(long long)s * rows + row];
        total += w * partial_out[((long long)s * rows + row) * head_dim + d];
      }
      total = denom > 0.0f ? total / denom : 0.0f;
    }
    out[(long long)row * head_dim + d] = __float2bfloat16(total);
  }
}

template <int kHeadDim, int kGroup, typename Policy>
void launch_with(const Stage1Args& a, const Policy& policy, int splits, cudaStream_t stream) {
  const std::size_t reduction = sizeof(float) * ((kThreads / (kHeadDim / 8)) * kGroup * (kHeadDim + 1) + kGroup);
  const std::size_t smem = std::max(sizeof(DecodeSmem<kGroup>), reduction);
  allow_dynamic_smem<decode_stage1<kHeadDim, kGroup, Policy>>(int(smem));
  dim3 grid(a.p.kv.num_kv_heads, a.p.num_seqs, splits);
  decode_stage1<kHeadDim, kGroup, Policy><<<grid, kThreads, smem, stream>>>(a, policy);
  check_launch("decode_stage1");
}

template <int kHeadDim, typename Policy>
void dispatch_group(int group, const Stage1Args& a, const Policy& policy, int splits,
                    cudaStream_t stream) {
  switch (group) {
    case 1: return launch_with<kHeadDim, 1>(a, policy, splits, stream);
    case 2: return launch_with<kHeadDim, 2>(a, policy, splits, stream);
    case 4: return launch_with<kHeadDim, 4>(a, policy, splits, stream);
    case 8: return launch_with<kHeadDim, 8>(a, policy, splits, stream);
  }
  check(false, "decode: ", group, " query heads per KV head; supported: 1, 2, 4, 8");
}

template <typename Policy>
void dispatch(int head_dim, int group, const Stage1Args& a, const Policy& policy, int splits,
              cudaStream_t stream) {
  switch (head_dim) {
    case 64: return dispatch_group<64>(group, a, policy, splits, stream);
    case 128: return dispatch_group<128>(group, a, policy, splits, stream);
    case 256: return dispatch_group<256>(group, a, policy, splits, stream);
  }
  check(false, "decode: head_dim ", head_dim, " not supported (64, 128, 256)");
}

int ceil_div(long long a, long long b) { return int((a + b - 1) / b); }

}  // namespace

int decode_num_splits(int num_seqs, int num_kv_heads, int max_kv_len, int sm_count) {
  // Aim for about four CTAs per multiprocessor (enough bytes in flight to cover HBM latency),
  // but keep each split at least 256 keys long so the halo and stage 2 stay cheap.
  const long long ctas = (long long)num_seqs * num_kv_heads;
  const int wanted = ceil_div(4LL * sm_count, ctas);
  const int most = std::max(1, ceil_div(max_kv_len, 256));
  return std::clamp(wanted, 1, std::min(most, 256));
}

std::size_t decode_workspace_bytes(const DecodeParams& p, int num_splits) {
  if (num_splits <= 1) return 0;
  const std::size_t rows = std::size_t(num_splits) * p.num_seqs * p.num_q_heads;
  return rows * p.kv.head_dim * sizeof(float) + 2 * rows * sizeof(float);
}

void launch_decode(const DecodeParams& p, cudaStream_t stream) {
  validate_paged_kv(p.kv, "decode");
  validate_gate(p.gate, "decode");
  check(p.query && p.out && p.kv_lens, "decode: null query, out or kv_lens");
  check(p.num_seqs >= 1, "decode: no sequences");
  check(p.num_q_heads % p.kv.num_kv_heads == 0, "decode: ", p.num_q_heads,
        " query heads are not a multiple of ", p.kv.num_kv_heads, " KV heads");
  check(p.max_kv_len >= 1 && p.max_kv_len <= p.kv.max_blocks_per_seq * p.kv.block_size,
        "decode: max_kv_len ", p.max_kv_len, " outside 1..", p.kv.max_blocks_per_seq * p.kv.block_size);
  const int group = p.num_q_heads / p.kv.num_kv_heads;

  int splits = p.num_splits;
  if (splits <= 0) {
    int device = 0, sms = 0;
    ASYNCT_CUDA_CHECK(cudaGetDevice(&device));
    ASYNCT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    splits = decode_num_splits(p.num_seqs, p.kv.num_kv_heads, p.max_kv_len, sms);
  }
  splits = std::min(splits, p.max_kv_len);

  Stage1Args a{p, ceil_div(p.max_kv_len, splits), 0.0f, nullptr, nullptr, nullptr};
  a.scale = p.scale != 0.0f ? p.scale : float(1.0 / std::sqrt(double(p.kv.head_dim)));
  if (splits > 1) {
    check(p.workspace != nullptr, "decode: ", splits, " splits need a workspace of ",
          decode_workspace_bytes(p, splits), " bytes");
    const std::size_t rows = std::size_t(splits) * p.num_seqs * p.num_q_heads;
    a.partial_out = static_cast<float*>(p.workspace);
    a.partial_max = a.partial_out + rows * p.kv.head_dim;
    a.partial_sum = a.partial_max + rows;
  }

  const bool softmax = p.gate.kind == GateKind::Softmax;
  if (softmax) {
    SoftmaxPolicy policy{};
    policy.softcap = p.gate.softcap;
    dispatch(p.kv.head_dim, group, a, policy, splits, stream);
  } else {
    AsyncPolicy policy{};  // per-head parameters are read by each CTA (init)
    policy.window = p.gate.pool_window;
    dispatch(p.kv.head_dim, group, a, policy, splits, stream);
  }
  if (splits > 1) {
    const int rows = p.num_seqs * p.num_q_heads;
    if (softmax)
      decode_stage2<true><<<rows, 128, 0, stream>>>(a.partial_out, a.partial_max, a.partial_sum,
                                                    p.out, splits, rows, p.kv.head_dim);
    else
      decode_stage2<false><<<rows, 128, 0, stream>>>(a.partial_out, nullptr, nullptr, p.out,
                                                     splits, rows, p.kv.head_dim);
    check_launch("decode_stage2");
  }
}

}  // namespace asynct::kernels
