// The software model of the tiles (amx/tile_emulation.hpp) against the AMX instructions: the
// same random tiles through both. CI's AMX tests run on the model, so this is what ties them to
// the hardware. Built with the AMX flags whatever the build; SKIPPED without real AMX, and in a
// TILEMOE_AMX_EMULATION build (isa_main.cpp).
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "amx/tile_emulation.hpp"
#include "catch.hpp"

namespace emu = tilemoe::kernels::tile_emulation;

namespace {

struct alignas(64) Config {
  std::uint8_t bytes[64] = {};
  Config(int m, int k_bytes, int n_bytes) {
    bytes[0] = 1;
    auto tile = [&](int t, int rows, int colsb) {
      bytes[16 + 2 * t] = static_cast<std::uint8_t>(colsb);
      bytes[48 + t] = static_cast<std::uint8_t>(rows);
    };
    tile(0, m, n_bytes);            // C
    tile(4, m, k_bytes);            // A
    tile(6, k_bytes / 4, n_bytes);  // B
  }
};

struct Shape {
  int m, k_bytes, n_bytes;
};
constexpr Shape kShapes[] = {{16, 64, 64}, {7, 40, 24}, {1, 4, 64}, {16, 64, 4}, {13, 36, 60}};

// C = C + A . B on the hardware and on the model, from the same bytes; the C tiles out.
template <bool Bf16>
void both(const Shape& s, const void* c, const void* a, const void* b, void* hw_out, void* emu_out) {
  const Config cfg(s.m, s.k_bytes, s.n_bytes);
  _tile_loadconfig(cfg.bytes);
  _tile_loadd(0, c, 64);
  _tile_loadd(4, a, 64);
  _tile_loadd(6, b, 64);
  if constexpr (Bf16) {
    _tile_dpbf16ps(0, 4, 6);
  } else {
    _tile_dpbssd(0, 4, 6);
  }
  _tile_stored(0, hw_out, 64);
  _tile_release();

  emu::load_config(cfg.bytes);
  emu::load(0, c, 64);
  emu::load(4, a, 64);
  emu::load(6, b, 64);
  if constexpr (Bf16) {
    emu::dot_bf16(0, 4, 6);
  } else {
    emu::dot_s8(0, 4, 6);
  }
  emu::store(0, emu_out, 64);
  emu::release();
}

std::uint16_t bf16_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<std::uint16_t>(u >> 16);
}

}  // namespace

TEST_CASE("the model's TDPBSSD equals the hardware's bit for bit") {
  std::mt19937 rng(21);
  std::uniform_int_distribution<int> byte(-128, 127);
  for (const Shape& s : kShapes) {
    INFO("m " << s.m << ", A bytes " << s.k_bytes << ", C bytes " << s.n_bytes);
    alignas(64) std::int8_t a[16 * 64], b[16 * 64];
    alignas(64) std::int32_t c[16 * 16], hw[16 * 16] = {}, model[16 * 16] = {};
    for (auto& v : a) v = static_cast<std::int8_t>(byte(rng));
    for (auto& v : b) v = static_cast<std::int8_t>(byte(rng));
    for (auto& v : c) v = byte(rng) * 100000;
    c[0] = std::numeric_limits<std::int32_t>::max();  // wraps
    both<false>(s, c, a, b, hw, model);
    CHECK(std::memcmp(hw, model, sizeof hw) == 0);
  }
}

TEST_CASE("the model's TDPBF16PS matches the hardware's on random and edge values") {
  std::mt19937 rng(23);
  std::normal_distribution<float> normal;
  int differing = 0, total = 0;
  for (const Shape& s : kShapes) {
    for (int trial = 0; trial < 20; ++trial) {
      INFO("m " << s.m << ", A bytes " << s.k_bytes << ", C bytes " << s.n_bytes << ", trial " << trial);
      alignas(64) std::uint16_t a[16 * 32], b[16 * 32];
      alignas(64) float c[16 * 16], hw[16 * 16] = {}, model[16 * 16] = {};
      for (auto& v : a) v = bf16_bits(normal(rng));
      for (auto& v : b) v = bf16_bits(normal(rng) * (trial % 2 ? 1e-19f : 1.0f));  // denormal products too
      for (auto& v : c) v = normal(rng) * (trial % 3 == 0 ? 1e-38f : 1.0f);        // denormal sums too
      a[1] = 0x0001;                                                              // a denormal input
      both<true>(s, c, a, b, hw, model);
      for (int m = 0; m < s.m; ++m) {
        for (int n = 0; n < s.n_bytes / 4; ++n) {
          const float h = hw[m * 16 + n], e = model[m * 16 + n];
          double scale = std::fabs(c[m * 16 + n]);
          for (int k = 0; k < s.k_bytes / 2; ++k) {
            std::uint32_t ua = static_cast<std::uint32_t>(a[m * 32 + k]) << 16;
            std::uint32_t ub = static_cast<std::uint32_t>(b[(k / 2) * 32 + 2 * n + k % 2]) << 16;
            float fa, fb;
            std::memcpy(&fa, &ua, 4);
            std::memcpy(&fb, &ub, 4);
            scale += std::fabs(static_cast<double>(fa) * fb);
          }
          ++total;
          if (std::memcmp(&h, &e, 4) != 0) ++differing;
          INFO("row " << m << " column " << n << ": hardware " << h << ", model " << e);
          REQUIRE(std::fabs(static_cast<double>(h) - e) <= 1e-6 * scale + 1e-37);
        }
      }
    }
  }
  // Within rounding either way; how often the bits differ tells whether the model's order of
  // additions is the hardware's.
  WARN("TDPBF16PS: " << differing << " of " << total << " results differ in their bits from the model");
}

TEST_CASE("the model reads back configurations as STTILECFG does") {
  for (const Shape& s : kShapes) {
    INFO("m " << s.m << ", A bytes " << s.k_bytes << ", C bytes " << s.n_bytes);
    const Config cfg(s.m, s.k_bytes, s.n_bytes);
    alignas(64) std::uint8_t hw[64], model[64];
    _tile_loadconfig(cfg.bytes);
    _tile_storeconfig(hw);
    _tile_release();
    emu::load_config(cfg.bytes);
    emu::store_config(model);
    emu::release();
    CHECK(std::memcmp(hw, model, 64) == 0);
  }
  alignas(64) std::uint8_t hw[64], model[64];
  std::memset(hw, 0xff, 64);
  std::memset(model, 0xff, 64);
  _tile_release();
  _tile_storeconfig(hw);  // no palette loaded: all zero
  emu::release();
  emu::store_config(model);
  CHECK(std::memcmp(hw, model, 64) == 0);
}
