#include "amx/tile_config.hpp"

#include <cstring>

#include "amx/tile_intrinsics.hpp"

namespace tilemoe::kernels {

TileConfig make_tile_config(int rows0, int rows1) {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof cfg);
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64;
  cfg.rows[0] = cfg.rows[1] = cfg.rows[4] = static_cast<std::uint8_t>(rows0);
  cfg.rows[2] = cfg.rows[3] = cfg.rows[5] = static_cast<std::uint8_t>(rows1);
  cfg.rows[6] = cfg.rows[7] = 16;  // B: 16 rows of k-pairs (bf16) or k-quads (int8)
  return cfg;
}

// The live configuration is read back with STTILECFG rather than remembered in a thread_local:
// other AMX code on this thread (oneDNN, release_amx_tiles) may have changed it. GCC's
// intrinsics declare an 8-byte memory operand, so compiler barriers make the whole 64 bytes
// visible on both sides.
void ensure_tile_config(const TileConfig& wanted) {
  TileConfig live;
  _tile_storeconfig(&live);
  __asm__ volatile("" ::: "memory");
  if (std::memcmp(&live, &wanted, sizeof wanted) != 0) {
    __asm__ volatile("" ::: "memory");
    _tile_loadconfig(&wanted);
  }
}

}  // namespace tilemoe::kernels
