#include "core/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <sstream>

#include "core/fp8.h"
#include "core/parallel.h"

namespace asynct {

std::string shape_string(const Shape& shape) {
  std::ostringstream out;
  out << '[';
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) out << ", ";
    if (shape[i] == any) out << '*'; else out << shape[i];
  }
  out << ']';
  return out.str();
}

std::int64_t shape_numel(const Shape& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (d < 0) throw Error("negative dimension in shape " + shape_string(shape));  // message built only on failure
    n *= d;
  }
  return n;
}

Tensor Tensor::allocate(DType dtype, Shape shape, bool zeroed) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  std::size_t bytes = std::size_t(shape_numel(t.shape_)) * dtype_size(dtype);
  if (bytes > 0) {
    std::shared_ptr<std::byte[]> storage;
    if (zeroed) {
      // calloc: a large block comes from the OS already zero and its pages become resident only
      // when written, so a KV cache sized for many sequences costs memory as they fill it.
      void* p = std::calloc(bytes, 1);
      if (p == nullptr) throw std::bad_alloc();
      storage = std::shared_ptr<std::byte[]>(static_cast<std::byte*>(p), [](std::byte* q) { std::free(q); });
    } else {
      storage = std::shared_ptr<std::byte[]>(new std::byte[bytes]);
    }
    t.data_ = storage.get();
    t.owner_ = std::move(storage);
  }
  return t;
}

Tensor Tensor::empty(DType dtype, Shape shape) { return allocate(dtype, std::move(shape), true); }

Tensor Tensor::borrow(void* data, DType dtype, Shape shape, Device device) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.device_ = device;
  t.data_ = data;
  check(data != nullptr || shape_numel(t.shape_) == 0, "borrow: null data for a non-empty ",
        t.describe());
  return t;
}

Tensor Tensor::view_of(void* data, DType dtype, Shape shape, std::shared_ptr<const void> owner) {
  Tensor t = borrow(data, dtype, std::move(shape));
  t.owner_ = std::move(owner);
  return t;
}

std::int64_t Tensor::size(int d) const {
  int rank = dim();
  int index = d < 0 ? d + rank : d;
  if (index < 0 || index >= rank)  // hot: the message is built only on failure
    throw Error(detail::concat("dimension ", d, " out of range for ", describe()));
  return shape_[std::size_t(index)];
}

Tensor Tensor::reshape(Shape shape) const {
  check(shape_numel(shape) == numel(), "reshape: ", describe(), " cannot become ",
        shape_string(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

namespace {
double read_as_double(const void* base, DType dtype, std::int64_t i) {
  switch (dtype) {
    case DType::F32: return static_cast<const float*>(base)[i];
    case DType::F64: return static_cast<const double*>(base)[i];
    case DType::BF16: return bf16_to_float(static_cast<const std::uint16_t*>(base)[i]);
    case DType::F16: return f16_to_float(static_cast<const std::uint16_t*>(base)[i]);
    case DType::I32: return static_cast<const std::int32_t*>(base)[i];
    case DType::I64: return double(static_cast<const std::int64_t*>(base)[i]);
    case DType::U8: return static_cast<const std::uint8_t*>(base)[i];
    case DType::F8E4M3: return fp8_e4m3_to_float(static_cast<const std::uint8_t*>(base)[i]);
  }
  return 0;
}

void write_from_double(void* base, DType dtype, std::int64_t i, double v) {
  switch (dtype) {
    case DType::F32: static_cast<float*>(base)[i] = float(v); return;
    case DType::F64: static_cast<double*>(base)[i] = v; return;
    case DType::BF16: static_cast<std::uint16_t*>(base)[i] = float_to_bf16(float(v)); return;
    case DType::F16: static_cast<std::uint16_t*>(base)[i] = float_to_f16(float(v)); return;
    case DType::I32: static_cast<std::int32_t*>(base)[i] = std::int32_t(v); return;
    case DType::I64: static_cast<std::int64_t*>(base)[i] = std::int64_t(v); return;
    case DType::U8: static_cast<std::uint8_t*>(base)[i] = std::uint8_t(v); return;
    case DType::F8E4M3: static_cast<std::uint8_t*>(base)[i] = float_to_fp8_e4m3(float(v)); return;
  }
}

bool is_float(DType t) {
  return t == DType::F32 || t == DType::F64 || t == DType::BF16 || t == DType::F16 || t == DType::F8E4M3;
}

// Elements converted per piece of work (parallel_pieces).
constexpr std::int64_t kConvertPiece = std::int64_t(1) << 20;

// bf16 -> float as the element-wise path through double gives it: exact, except that a
// signalling NaN comes out quiet (the float -> double conversion sets the quiet bit).
inline float bf16_to_float_quiet(std::uint16_t bits) {
  if ((bits & 0x7fffu) > 0x7f80u) bits |= 0x40u;
  return bf16_to_float(bits);
}
}  // namespace

void floats_to_bf16(const float* values, std::uint16_t* out, std::size_t count) {
  parallel_pieces(std::int64_t(count), kConvertPiece, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) out[i] = float_to_bf16(values[i]);
  });
}

Tensor Tensor::to(DType dtype) const {
  check(device_ == Device::CPU, "to: ", describe(), " is not on the host");
  check(is_float(dtype) == is_float(dtype_), "to: cannot convert ", dtype_name(dtype_), " to ",
        dtype_name(dtype));
  // Not zeroed: every element is written below, and the pages are then first touched by the
  // threads that convert them rather than by one memset.
  Tensor out = allocate(dtype, shape_, false);
  const void* in = data_;
  void* result = out.data_;
  // The weights' conversions (float32 <-> bf16) have direct loops, with the same results as the
  // general path through double, which is several times slower.
  if (dtype_ == DType::F32 && dtype == DType::BF16) {
    floats_to_bf16(static_cast<const float*>(in), static_cast<std::uint16_t*>(result), std::size_t(numel()));
  } else if (dtype_ == DType::BF16 && dtype == DType::F32) {
    parallel_pieces(numel(), kConvertPiece, [&](std::int64_t begin, std::int64_t end) {
      const auto* bits = static_cast<const std::uint16_t*>(in);
      auto* values = static_cast<float*>(result);
      for (std::int64_t i = begin; i < end; ++i) values[i] = bf16_to_float_quiet(bits[i]);
    });
  } else {
    const DType from = dtype_;
    parallel_pieces(numel(), kConvertPiece, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) write_from_double(result, dtype, i, read_as_double(in, from, i));
    });
  }
  return out;
}

std::vector<float> Tensor::to_float_vector() const {
  check(device_ == Device::CPU, "to_float_vector: ", describe(), " is not on the host");
  check(is_float(dtype_), "to_float_vector: ", describe(), " is not a float tensor");
  std::vector<float> values(static_cast<std::size_t>(numel()));
  for (std::int64_t i = 0; i < numel(); ++i) values[std::size_t(i)] = float(read_as_double(data_, dtype_, i));
  return values;
}

std::string Tensor::describe() const {
  return std::string(dtype_name(dtype_)) + shape_string(shape_) +
         (device_ == Device::CUDA ? " (cuda)" : "");
}

void expect_dtype(const Tensor& t, DType dtype, const std::string& what) {
  check(t.dtype() == dtype, what, ": expected ", dtype_name(dtype), ", got ", t.describe());
}

void expect_shape(const Tensor& t, const Shape& expected, const std::string& what) {
  bool same = t.dim() == int(expected.size());
  for (std::size_t i = 0; same && i < expected.size(); ++i)
    same = expected[i] == any || expected[i] == t.shape()[i];
  check(same, what, ": expected shape ", shape_string(expected), ", got ",
        shape_string(t.shape()));
  check(t.defined(), what, ": tensor has no data");
}

void expect_device(const Tensor& t, Device device, const std::string& what) {
  check(t.device() == device, what, ": expected a ",
        device == Device::CPU ? "host" : "cuda", " tensor, got ", t.describe());
}

// IEEE half conversions, round to nearest even; subnormals and infinities handled.
float f16_to_float(std::uint16_t h) {
  int sign = (h >> 15) & 1, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  float value;
  if (exponent == 0) value = std::ldexp(float(mantissa), -24);
  else if (exponent == 31) value = mantissa ? NAN : INFINITY;
  else value = std::ldexp(float(mantissa | 0x400), exponent - 25);
  return sign ? -value : value;
}

std::uint16_t float_to_f16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  std::uint16_t sign = std::uint16_t((u >> 16) & 0x8000);
  float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00;
  if (a >= 65520.0f) return sign | 0x7c00;  // rounds to infinity
  if (a < 6.103515625e-05f) {               // subnormal: multiples of 2^-24
    return sign | std::uint16_t(std::nearbyint(a * 16777216.0f));
  }
  int exponent;
  float m = std::frexp(a, &exponent);  // a = m * 2^exponent, m in [0.5, 1)
  std::uint32_t mant = std::uint32_t(std::nearbyint(m * 2048.0f));  // 11 significant bits
  if (mant == 2048) { mant = 1024; ++exponent; }
  std::uint32_t biased = std::uint32_t(exponent - 1 + 15);
  if (biased >= 31) return sign | 0x7c00;
  return std::uint16_t(sign | (biased << 10) | (mant & 0x3ff));
}

void Tensor::wrong_dtype(DType accessed) const {
  check(false, "tensor holds ", dtype_name(dtype_), ", accessed as ", dtype_name(accessed));
  std::abort();  // check(false, ...) throws
}

}  // namespace asynct
