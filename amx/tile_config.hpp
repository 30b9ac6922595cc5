#pragma once
// The AMX tile configuration shared by the bf16 and int8 tile kernels: palette 1, every tile row
// 64 bytes (32 bf16 or 64 int8), 2×2 blocking:
//   tmm0-3 C tiles (rows0 rows for tmm0/1, rows1 for tmm2/3), tmm4/5 A tiles (rows0 / rows1
//   rows), tmm6/7 B tiles (16 rows).
#include <cstddef>
#include <cstdint>

namespace tilemoe::kernels {

// The 64-byte operand of LDTILECFG/STTILECFG (Intel SDM, palette 1: 8 tiles of at most
// 16 rows × 64 bytes). Reserved bytes must be zero or LDTILECFG faults.
struct alignas(64) TileConfig {
  std::uint8_t palette_id;
  std::uint8_t start_row;
  std::uint8_t reserved0[14];
  std::uint16_t colsb[8];  // bytes per row of tmm0..7
  std::uint8_t reserved1[16];
  std::uint8_t rows[8];  // rows of tmm0..7
  std::uint8_t reserved2[8];
};
static_assert(sizeof(TileConfig) == 64);
static_assert(offsetof(TileConfig, colsb) == 16 && offsetof(TileConfig, rows) == 48);

TileConfig make_tile_config(int rows0, int rows1);

// LDTILECFG is costly and zeroes every tile, so it runs only when the thread's live
// configuration differs. Only where AMX is available and permitted.
void ensure_tile_config(const TileConfig& wanted);

}  // namespace tilemoe::kernels
