// A small tensor type: a typed, shaped, row-major block of memory, owning or borrowed.
//
// It exists so that every function taking arrays can say what it expects and fail with a
// readable message otherwise ("attention: query: expected shape [7, 16, 128], got [7, 8, 128]").
// It is deliberately not a general array library: contiguous row-major only, no broadcasting.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace asynct {

enum class Device : std::uint8_t { CPU, CUDA };

using Shape = std::vector<std::int64_t>;

std::string shape_string(const Shape& shape);  // "[7, 16, 128]"
std::int64_t shape_numel(const Shape& shape);

// A dimension that a shape check accepts whatever its size: expect_shape(t, {any, 8, 128}, ...).
inline constexpr std::int64_t any = -1;

class Tensor {
 public:
  Tensor() = default;

  // A new zero-filled host tensor.
  static Tensor empty(DType dtype, Shape shape);
  // A view of memory owned elsewhere (host or device); the caller keeps it alive.
  static Tensor borrow(void* data, DType dtype, Shape shape, Device device = Device::CPU);
  // A host view that keeps `owner` (e.g. a mapped file) alive as long as the view lives.
  static Tensor view_of(void* data, DType dtype, Shape shape, std::shared_ptr<const void> owner);
  // A host tensor holding a copy of the values, of type T.
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, Shape shape);

  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    if (dtype_of<T>::value != dtype_) [[unlikely]]
      wrong_dtype(dtype_of<T>::value);  // out of line: element loops call this
    return static_cast<T*>(data_);
  }

  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  int dim() const { return int(shape_.size()); }
  std::int64_t size(int d) const;  // negative d counts from the end
  std::int64_t numel() const { return shape_numel(shape_); }
  std::size_t nbytes() const { return std::size_t(numel()) * dtype_size(dtype_); }
  bool defined() const { return data_ != nullptr || numel() == 0; }

  // Element access by flat index with bounds check, for tests and references.
  template <typename T>
  T& at(std::int64_t flat) const {
    if (flat < 0 || flat >= numel())  // the message is built only on failure
      throw Error(detail::concat("tensor index ", flat, " out of range for shape ", shape_string(shape_)));
    return data_as<T>()[flat];
  }

  // Same memory, new shape of equal element count.
  Tensor reshape(Shape shape) const;
  // A deep host copy converted to another dtype (float types and integer types among
  // themselves; bf16/f16 round to nearest even). Large tensors are converted on the host's
  // threads, with the same results.
  Tensor to(DType dtype) const;
  // Values read as float, whatever the stored float type (the convenient form for references).
  std::vector<float> to_float_vector() const;

  std::string describe() const;  // "bfloat16[7, 16, 128]"

 private:
  // Throws Error "tensor holds X, accessed as Y".
  [[noreturn]] void wrong_dtype(DType accessed) const;
  // A new host tensor, zero-filled or (for one about to be overwritten) left uninitialised.
  static Tensor allocate(DType dtype, Shape shape, bool zeroed);

  std::shared_ptr<const void> owner_;  // null for borrowed memory
  void* data_ = nullptr;
  DType dtype_ = DType::F32;
  Device device_ = Device::CPU;
  Shape shape_;
};

// float32 values as bf16 bit patterns (float_to_bf16 of each, into `out`), on the host's
// threads when there are many: what Tensor::to(DType::BF16) does, for callers that convert
// into memory of their own (e.g. a pinned staging buffer on its way to the GPU).
void floats_to_bf16(const float* values, std::uint16_t* out, std::size_t count);

// Shape and type checks. `what` names the argument in the message, e.g. "attention: query".
void expect_dtype(const Tensor& t, DType dtype, const std::string& what);
void expect_shape(const Tensor& t, const Shape& expected, const std::string& what);
void expect_device(const Tensor& t, Device device, const std::string& what);

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, Shape shape) {
  check(std::int64_t(values.size()) == shape_numel(shape), "from_vector: ", values.size(),
        " values do not fill shape ", shape_string(shape));
  Tensor t = empty(dtype_of<T>::value, std::move(shape));
  if (!values.empty()) std::memcpy(t.data_, values.data(), values.size() * sizeof(T));
  return t;
}

}  // namespace asynct
