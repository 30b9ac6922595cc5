#include "f32_encode.hpp"

#include <cstring>
#include <string>

#include "tilemoe/bf16.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::io {
namespace {

template <class T, class F>
void encode(const float* src, std::size_t count, std::byte* out, F&& f) {
  for (std::size_t i = 0; i < count; ++i) {
    T v = f(src[i]);
    std::memcpy(out + i * sizeof(T), &v, sizeof v);
  }
}

}  // namespace

// F. Giesen's float_to_half_fast3_rtne, with NaN payloads kept so that f16 -> f32 -> f16 is exact.
std::uint16_t float_to_f16(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) {
    std::uint32_t payload = (a >> 13) & 0x3ffu;
    return static_cast<std::uint16_t>(sign | 0x7c00u | (payload ? payload : 0x200u));
  }
  if (a >= (143u << 23)) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65536: infinity
  if (a < (113u << 23)) {
    // Below the smallest normal half: adding 0.5f makes the FPU round to the subnormal grid (2^-24).
    const std::uint32_t magic_bits = 126u << 23;
    float magic, v;
    std::memcpy(&magic, &magic_bits, sizeof magic);
    std::memcpy(&v, &a, sizeof v);
    v += magic;
    std::uint32_t r;
    std::memcpy(&r, &v, sizeof r);
    return static_cast<std::uint16_t>(sign | (r - magic_bits));
  }
  std::uint32_t mantissa_odd = (a >> 13) & 1u;
  a += (static_cast<std::uint32_t>(15 - 127) << 23) + 0xfffu + mantissa_odd;
  return static_cast<std::uint16_t>(sign | (a >> 13));
}

void convert_from_f32(const float* src, std::size_t count, Dtype dst, std::byte* out) {
  switch (dst) {
    case Dtype::F32: std::memcpy(out, src, count * sizeof(float)); return;
    case Dtype::BF16: return encode<bf16>(src, count, out, float_to_bf16);
    case Dtype::F16: return encode<std::uint16_t>(src, count, out, float_to_f16);
    default: break;
  }
  fail(ErrorKind::invalid_argument, std::string("convert_from_f32: cannot write ") + dtype_name(dst) + " from floats");
}

}  // namespace tilemoe::io
