// A CUDA step's metadata: how its attention splits between the decode and prefill kernels
// (StepShape), the token ids, positions, cache slots, sequence offsets, KV lengths, block
// table and sampling rows laid out in one pinned buffer and uploaded with one copy
// (StepMetadata), and where they land on the device (StepPointers). The batch is checked
// before (check_step_batch); writing it checks nothing again.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/logit_summary.h"
#include "engine/step_batch.h"
#include "kernels/common/cuda_array.h"

namespace asynct {

// How a step's attention is split between the kernels, and the bounds each one needs.
struct StepShape {
  int tokens = 0, seqs = 0;
  int max_blocks = 1;      // block-table width
  int decodes = 0;         // leading sequences with one new token: the decode kernel
  int decode_kv_len = 0;   // bound of their KV lengths (sizes the decode splits)
  int prefill_q_len = 0;   // longest new-token count among the rest: the prefill kernel
  int prefill_kv_len = 0;
};

// Leading one-token sequences go to the decode kernel, the rest to the prefill kernel (the
// engine orders a step's sequences that way).
StepShape shape_of(const StepBatch& batch);

// Where this step's metadata is on the device.
struct StepPointers {
  const std::int32_t* tokens = nullptr;
  const std::int64_t* positions = nullptr;
  const std::int64_t* slots = nullptr;
  const std::int32_t* prefill_cu_seqlens = nullptr;  // the prefill part's, starting at 0
  const std::int32_t* kv_lens = nullptr;
  const std::int32_t* block_table = nullptr;          // [seqs, max_blocks]
  const std::int32_t* logit_rows = nullptr;
  // A chained step's (StepBatch::tokens_from_rows), and the summaries of the step before.
  const std::int32_t* tokens_from_rows = nullptr;
  const LogitSummary* previous_summaries = nullptr;
  int previous_rows = 0;
  // Each logit row's sampling, and the logit bias, penalty tokens and token masks their ranges
  // index (the last sections: the penalty tokens' number changes from step to step, the bias's
  // and the masks' with the requests running; the other sections' addresses do not).
  const RowSampling* sampling = nullptr;
  const LogitBias* logit_bias = nullptr;
  const PenaltyToken* penalty_tokens = nullptr;
  const std::uint32_t* token_masks = nullptr;  // the constrained rows' allowed-token bitmasks

  bool operator==(const StepPointers&) const = default;
};

// A step's metadata laid out in one pinned host buffer and uploaded with one copy into one
// device buffer, instead of one pageable copy per array. Sections are carved in order at
// offsets that depend only on their sizes, so a decode graph replayed for the same shape finds
// its metadata at the device addresses it was captured with. A step submitted while another is
// in flight takes the other turn of two host and two device buffers: its metadata is written and
// uploaded while the step before, which reads its own turn's, may still run (pipelined steps). A
// step submitted with none in flight keeps the turn: a shape's one graph serves every such step.
class StepMetadata {
 public:
  // Starts a step's metadata, in the other turn's buffers when `other_turn`.
  void clear(bool other_turn) {
    bytes_ = 0;
    if (other_turn) turn_ ^= 1;
  }
  int turn() const { return turn_; }
  // Adds a section of `count` T; returns its offset.
  template <typename T>
  std::size_t add(std::size_t count) {
    const std::size_t offset = (bytes_ + 15) / 16 * 16;
    bytes_ = offset + count * sizeof(T);
    return offset;
  }
  // After the sections are added: room for them. Buffers move only when they grow, and then to
  // twice their size at least: the penalty tokens' section grows step by step, and each move
  // makes the next decode graph capture again.
  void reserve() {
    const auto grown = [&](std::size_t have) { return bytes_ <= have ? have : std::max(bytes_, 2 * have); };
    host_[turn_].reserve(grown(host_[turn_].size()));
    device_[turn_].reserve(grown(device_[turn_].size()));
  }
  template <typename T>
  T* host(std::size_t offset) const { return reinterpret_cast<T*>(host_[turn_].get() + offset); }
  template <typename T>
  const T* device(std::size_t offset) const { return reinterpret_cast<const T*>(device_[turn_].get() + offset); }
  // Uploads bytes [from, to) of this turn's sections (all of them by default).
  void upload(cudaStream_t stream, std::size_t from = 0, std::size_t to = SIZE_MAX);
  std::size_t bytes() const { return bytes_; }

 private:
  std::size_t bytes_ = 0;
  int turn_ = 0;
  kernels::PinnedArray<std::uint8_t> host_[2];
  kernels::DeviceArray<std::uint8_t> device_[2];
};

// Writes a checked batch into the next turn's pinned buffer (the block table padded to the
// shape's width with block 0, which is never read past a sequence's length); returns the
// device addresses the upload will fill (previous_summaries and previous_rows left empty).
// `in_flight`: a step submitted before is not yet collected (this one takes the other turn).
StepPointers write_step_metadata(const StepBatch& batch, const StepShape& shape, StepMetadata& metadata, bool in_flight);

// The bytes of the token masks' section, the last one: what a step whose masks come later
// (StepBatch::masks_later) uploads at first is everything before it.
std::size_t token_masks_bytes(const StepBatch& batch);
// For that step, once the batch's masks are filled: writes them into their section of the same
// turn (no step written since) and uploads it alone on `stream`.
void upload_token_masks(const StepBatch& batch, StepMetadata& metadata, cudaStream_t stream);

}  // namespace asynct
