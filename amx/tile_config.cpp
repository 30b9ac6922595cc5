#include "amx/tile_config.hpp"

#include <cstring>

namespace tilemoe::kernels {

// Plain data, so built without the AMX flags: the tile model's test checks these configurations
// on CPUs without AVX-512 too, where an AMX-flagged build of this function (GCC stores the 64
// bytes with a zmm register) faults.
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

}  // namespace tilemoe::kernels
