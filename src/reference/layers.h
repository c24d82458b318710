// Reference dense layers: embedding lookup, linear (x W^T), SwiGLU.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace asynct {

// table: float32 [vocab, hidden]; returns [tokens.size(), hidden]. An id outside
// [0, vocab) is an error naming the id and its position.
Tensor embedding(const Tensor& table, const std::vector<std::int32_t>& tokens);

// a + b, elementwise (float32, same shape): the residual add.
Tensor add(const Tensor& a, const Tensor& b);

// x: float32 [rows, in]; weight: float32 [out, in] (PyTorch's nn.Linear layout); y = x W^T.
Tensor linear(const Tensor& x, const Tensor& weight);

// gate_up: float32 [rows, 2 * inter], gate first (the merged projection);
// returns silu(gate) * up, [rows, inter].
Tensor swiglu(const Tensor& gate_up);

}  // namespace asynct
