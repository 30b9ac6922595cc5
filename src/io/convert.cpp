// Element conversions and the typed reads built on them.
#include <algorithm>
#include <cstring>

#include "safetensors.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::io {
namespace {

// Tensor data sits wherever the header length puts it: read every element through memcpy.
template <class T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// out[i] = f(i-th element of type T)
template <class T, class Out, class F>
void map(const std::byte* data, std::size_t count, Out* out, F&& f) {
  for (std::size_t i = 0; i < count; ++i) out[i] = f(load<T>(data + i * sizeof(T)));
}

template <class T>
float to_float(T v) {
  return static_cast<float>(v);
}

const TensorInfo& checked(const SafetensorsFile& f, std::string_view name,
                          std::span<const std::int64_t> expected) {
  const TensorInfo& t = f.get(name);
  if (!expected.empty() && !std::ranges::equal(t.shape, expected))
    fail(ErrorKind::invalid_argument, f.path() + ": tensor '" + t.name + "' has shape " +
                                          shape_string(t.shape) + ", expected " + shape_string(expected));
  return t;
}

bool is_integer(Dtype d) { return d == Dtype::I8 || d == Dtype::U8 || d == Dtype::I32 || d == Dtype::I64; }

}  // namespace

void convert_to_f32(Dtype src, const std::byte* data, std::size_t count, float* out) {
  switch (src) {
    case Dtype::BF16: return map<std::uint16_t>(data, count, out, bf16_to_float);
    case Dtype::F16: return map<std::uint16_t>(data, count, out, f16_to_float);
    case Dtype::F32: return map<float>(data, count, out, [](float v) { return v; });
    case Dtype::F8_E4M3: return map<std::uint8_t>(data, count, out, f8e4m3_to_float);
    case Dtype::I8: return map<std::int8_t>(data, count, out, to_float<std::int8_t>);
    case Dtype::U8: return map<std::uint8_t>(data, count, out, to_float<std::uint8_t>);
    case Dtype::I32: return map<std::int32_t>(data, count, out, to_float<std::int32_t>);
    case Dtype::I64: return map<std::int64_t>(data, count, out, to_float<std::int64_t>);
  }
  fail(ErrorKind::invalid_argument, "convert_to_f32: invalid dtype");
}

void convert_to_bf16(Dtype src, const std::byte* data, std::size_t count, bf16* out) {
  switch (src) {
    case Dtype::BF16: return map<bf16>(data, count, out, [](bf16 v) { return v; });
    case Dtype::F32: return map<float>(data, count, out, float_to_bf16);
    // f16 and f8 widen to float exactly, so rounding happens once, in float_to_bf16.
    case Dtype::F16:
      return map<std::uint16_t>(data, count, out,
                                [](std::uint16_t v) { return float_to_bf16(f16_to_float(v)); });
    case Dtype::F8_E4M3:
      return map<std::uint8_t>(data, count, out,
                               [](std::uint8_t v) { return float_to_bf16(f8e4m3_to_float(v)); });
    default: break;
  }
  fail(ErrorKind::invalid_argument,
       std::string("convert_to_bf16: cannot convert ") + dtype_name(src) + " to BF16");
}

std::vector<float> read_as_f32(const SafetensorsFile& f, std::string_view name,
                               std::span<const std::int64_t> expected_shape) {
  const TensorInfo& t = checked(f, name, expected_shape);
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  convert_to_f32(t.dtype, f.data(t), out.size(), out.data());
  return out;
}

std::vector<bf16> read_as_bf16(const SafetensorsFile& f, std::string_view name,
                               std::span<const std::int64_t> expected_shape) {
  const TensorInfo& t = checked(f, name, expected_shape);
  if (is_integer(t.dtype))
    fail(ErrorKind::invalid_argument, f.path() + ": tensor '" + t.name + "' has dtype " +
                                          dtype_name(t.dtype) +
                                          ", which is not read as BF16 (expected BF16, F16, F32 or F8_E4M3)");
  std::vector<bf16> out(static_cast<std::size_t>(t.numel()));
  convert_to_bf16(t.dtype, f.data(t), out.size(), out.data());
  return out;
}

std::vector<std::int64_t> read_as_i64(const SafetensorsFile& f, std::string_view name,
                                      std::span<const std::int64_t> expected_shape) {
  const TensorInfo& t = checked(f, name, expected_shape);
  std::vector<std::int64_t> out(static_cast<std::size_t>(t.numel()));
  const std::byte* d = f.data(t);
  switch (t.dtype) {
    case Dtype::I64: map<std::int64_t>(d, out.size(), out.data(), [](std::int64_t v) { return v; }); break;
    case Dtype::I32:
      map<std::int32_t>(d, out.size(), out.data(), [](std::int32_t v) { return std::int64_t{v}; });
      break;
    case Dtype::I8:
      map<std::int8_t>(d, out.size(), out.data(), [](std::int8_t v) { return std::int64_t{v}; });
      break;
    case Dtype::U8:
      map<std::uint8_t>(d, out.size(), out.data(), [](std::uint8_t v) { return std::int64_t{v}; });
      break;
    default:
      fail(ErrorKind::invalid_argument, f.path() + ": tensor '" + t.name + "' has dtype " +
                                            dtype_name(t.dtype) +
                                            ", expected an integer dtype (I64, I32, I8 or U8)");
  }
  return out;
}

std::string shape_string(std::span<const std::int64_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace tilemoe::io
