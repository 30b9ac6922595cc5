#include "amx/tile_config.hpp"

#include <cstring>

#include "amx/tile_intrinsics.hpp"

namespace tilemoe::kernels {

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
