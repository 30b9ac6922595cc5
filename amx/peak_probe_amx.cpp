#include "amx/tile_intrinsics.hpp"

#include "amx/gemm_bf16.hpp"
#include "amx/peak_probe.hpp"

namespace tilemoe::kernels {
namespace {

struct alignas(64) ProbeTileConfig {
  std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};
static_assert(sizeof(ProbeTileConfig) == 64);

}  // namespace

double peak_flops_amx(std::int64_t iterations) {
  ProbeTileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  alignas(64) static thread_local bf16 zeros[16 * 32] = {};
  _tile_loadconfig(&cfg);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_zero(4);
  _tile_zero(5);
  _tile_loadd(6, zeros, 64);
  _tile_loadd(7, zeros, 64);
  // Six independent accumulators: enough to cover TDPBF16PS latency at full throughput.
  for (std::int64_t i = 0; i < iterations; ++i) {
    _tile_dpbf16ps(0, 6, 7);
    _tile_dpbf16ps(1, 6, 7);
    _tile_dpbf16ps(2, 6, 7);
    _tile_dpbf16ps(3, 6, 7);
    _tile_dpbf16ps(4, 6, 7);
    _tile_dpbf16ps(5, 6, 7);
  }
  alignas(64) float sink[16 * 16];
  _tile_stored(0, sink, 64);
  release_amx_tiles();  // the next GEMM reloads its own configuration
  volatile float keep = sink[0];
  (void)keep;
  return static_cast<double>(iterations) * 6 * 16 * 16 * 32 * 2;
}

}  // namespace tilemoe::kernels
