// Builds attention problems for tests: random Q/K/V for a list of (q_len, kv_len) sequences,
// held both contiguously and in a paged cache with shuffled physical blocks.
#pragma once

#include <vector>

#include "reference/attention.h"
#include "support/random.h"

namespace asynct::testing {

// Async gate with random per-head parameters: alpha in [0.5, 2], sigma in [0, 1.5], gamma in
// [0.5, 1.5] (the range the tests cover).
inline Gate random_async_gate(Random& rng, int num_q_heads, int pool_window) {
  Gate g = Gate::make_async(num_q_heads, pool_window);
  for (int h = 0; h < num_q_heads; ++h) {
    g.async.alpha[std::size_t(h)] = rng.uniform({1}, 0.5f, 2.0f).at<float>(0);
    g.async.sigma[std::size_t(h)] = rng.uniform({1}, 0.0f, 1.5f).at<float>(0);
    g.async.gamma[std::size_t(h)] = rng.uniform({1}, 0.5f, 1.5f).at<float>(0);
  }
  return g;
}

struct SequenceLengths {
  int q_len;
  int kv_len;
};

struct AttentionCase {
  int num_q_heads = 0, num_kv_heads = 0, head_dim = 0;
  std::vector<SequenceLengths> seqs;
  Tensor query;       // [total_q, Hq, D]
  Tensor key, value;  // contiguous, [total_kv, Hkv, D]
  std::vector<int> cu_seqlens_q, cu_seqlens_k, kv_lens;
  KvCache contiguous;

  AttentionCase(Random& rng, std::vector<SequenceLengths> lengths, int hq, int hkv, int dim,
                bool bf16_exact = false)
      : num_q_heads(hq), num_kv_heads(hkv), head_dim(dim), seqs(std::move(lengths)) {
    cu_seqlens_q = {0};
    cu_seqlens_k = {0};
    for (const SequenceLengths& s : seqs) {
      cu_seqlens_q.push_back(cu_seqlens_q.back() + s.q_len);
      cu_seqlens_k.push_back(cu_seqlens_k.back() + s.kv_len);
      kv_lens.push_back(s.kv_len);
    }
    query = rng.normal({cu_seqlens_q.back(), hq, dim}, 1.0f, bf16_exact);
    key = rng.normal({cu_seqlens_k.back(), hkv, dim}, 1.0f, bf16_exact);
    value = rng.normal({cu_seqlens_k.back(), hkv, dim}, 1.0f, bf16_exact);
    contiguous = KvCache::contiguous(key, value, cu_seqlens_k);
  }

  AttentionBatch batch(const KvCache& kv) const {
    AttentionBatch b;
    b.query = query;
    b.cu_seqlens_q = cu_seqlens_q;
    b.kv_lens = kv_lens;
    b.kv = &kv;
    return b;
  }
  AttentionBatch batch() const { return batch(contiguous); }

  // The same K/V scattered into a paged cache: every sequence's logical blocks land on
  // physical blocks in shuffled order, with `spare_blocks` unused blocks mixed in.
  struct Paged {
    Tensor key_cache, value_cache, block_table;
    KvCache cache;
  };
  Paged paged(Random& rng, int block_size, int spare_blocks = 3) const {
    int max_blocks = 1;
    int total_blocks = spare_blocks;
    for (const SequenceLengths& s : seqs) {
      int blocks = (s.kv_len + block_size - 1) / block_size;
      max_blocks = std::max(max_blocks, blocks);
      total_blocks += blocks;
    }
    std::vector<int> physical = rng.permutation(total_blocks);
    Paged p;
    p.key_cache = rng.normal({total_blocks, block_size, num_kv_heads, head_dim});  // garbage
    p.value_cache = rng.normal({total_blocks, block_size, num_kv_heads, head_dim});
    p.block_table = Tensor::empty(DType::I32, {std::int64_t(seqs.size()), max_blocks});
    std::size_t next = 0;
    const std::int64_t row = std::int64_t(num_kv_heads) * head_dim;
    for (std::size_t s = 0; s < seqs.size(); ++s) {
      for (int b = 0; b < max_blocks; ++b)  // unused entries point at a real block anyway
        p.block_table.data_as<std::int32_t>()[std::int64_t(s) * max_blocks + b] = physical.back();
      for (int t = 0; t < seqs[s].kv_len; ++t) {
        int block = t / block_size;
        if (t % block_size == 0)
          p.block_table.data_as<std::int32_t>()[std::int64_t(s) * max_blocks + block] = physical[next++];
        int phys = p.block_table.data_as<std::int32_t>()[std::int64_t(s) * max_blocks + block];
        std::int64_t dst = (std::int64_t(phys) * block_size + t % block_size) * row;
        std::int64_t src = std::int64_t(cu_seqlens_k[s] + t) * row;
        std::copy_n(key.data_as<float>() + src, row, p.key_cache.data_as<float>() + dst);
        std::copy_n(value.data_as<float>() + src, row, p.value_cache.data_as<float>() + dst);
      }
    }
    p.cache = KvCache::paged(p.key_cache, p.value_cache, p.block_table);
    return p;
  }
};

}  // namespace asynct::testing
