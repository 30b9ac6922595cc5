#pragma once
// A LoRA factor read in place from the caller's memory, in either orientation: element (r, c) is
// data[r * row_stride + c * col_stride], strides counted in elements. Trainers keep their LoRA
// parameters in f32 or in bf16; both are read as they are, so a bf16 set is never widened into a
// copy (and streams half the bytes of an f32 one at every call).
#include <cstddef>
#include <cstdint>

#include "tilemoe/bf16.hpp"

namespace tilemoe::kernels {

enum class FactorElement : std::uint8_t { f32, bf16 };

struct StridedFactor {
  const void* data = nullptr;
  std::size_t row_stride = 0, col_stride = 1;
  FactorElement element = FactorElement::f32;

  StridedFactor() = default;
  StridedFactor(const float* d, std::size_t rs, std::size_t cs) : data(d), row_stride(rs), col_stride(cs), element(FactorElement::f32) {}
  StridedFactor(const bf16* d, std::size_t rs, std::size_t cs) : data(d), row_stride(rs), col_stride(cs), element(FactorElement::bf16) {}

  bool is_bf16() const { return element == FactorElement::bf16; }
  // The storage, typed: T is float for f32 factors, bf16 for bf16 ones (the caller checks element).
  template <typename T>
  const T* as() const {
    return static_cast<const T*>(data);
  }
  std::size_t index(int r, int c) const { return static_cast<std::size_t>(r) * row_stride + static_cast<std::size_t>(c) * col_stride; }
  float at(int r, int c) const { return is_bf16() ? bf16_to_float(as<bf16>()[index(r, c)]) : as<float>()[index(r, c)]; }
  // The same matrix from element (r, c) on.
  StridedFactor offset(int r, int c) const {
    StridedFactor f = *this;
    f.data = static_cast<const char*>(data) + index(r, c) * element_bytes();
    return f;
  }
  StridedFactor transposed() const {
    StridedFactor t = *this;
    t.row_stride = col_stride;
    t.col_stride = row_stride;
    return t;
  }
  std::size_t element_bytes() const { return is_bf16() ? sizeof(bf16) : sizeof(float); }
};

// The element as f32, for code templated on the storage type.
inline float factor_value(float v) { return v; }
inline float factor_value(bf16 v) { return bf16_to_float(v); }

}  // namespace tilemoe::kernels
