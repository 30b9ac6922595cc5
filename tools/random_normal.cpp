#include "tools/random_normal.hpp"

#include <cmath>
#include <numbers>

namespace tilemoe::cli {
namespace {

std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double unit_open_below(std::uint64_t bits) { return (static_cast<double>(bits >> 11) + 1.0) * 0x1.0p-53; }  // (0, 1]

}  // namespace

std::vector<bf16> random_normal_bf16(std::size_t count, std::uint64_t seed, std::uint64_t stream) {
  std::uint64_t state = seed;
  std::uint64_t mix = stream;
  state ^= splitmix64(mix);
  std::vector<bf16> out(count);
  // Box-Muller: two uniforms give two independent normals.
  for (std::size_t i = 0; i < count; i += 2) {
    double r = std::sqrt(-2.0 * std::log(unit_open_below(splitmix64(state))));
    double angle = 2.0 * std::numbers::pi * unit_open_below(splitmix64(state));
    out[i] = float_to_bf16(static_cast<float>(r * std::cos(angle)));
    if (i + 1 < count) out[i + 1] = float_to_bf16(static_cast<float>(r * std::sin(angle)));
  }
  return out;
}

}  // namespace tilemoe::cli
