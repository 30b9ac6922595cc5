#pragma once
// The 2x2 tile block that the bf16 and int8 AMX kernels share (tile_config.hpp's registers):
//   tmm0..3 C: rows [0,16) / [16,32) x panels p / p+1, as tmm0 = (0, p), tmm1 = (0, p+1),
//              tmm2 = (16, p), tmm3 = (16, p+1)
//   tmm4/5 A: the two row tiles of one k-block;  tmm6/7 B: panels p and p+1 of that k-block.
// TwoRowTiles / TwoPanels drop the second row tile or panel at the edges of a matrix. Tile
// numbers are immediates of the instructions, so every tile is named by a literal here.
// Only for translation units built for AMX.
#include <cstddef>

#include "amx/tile_intrinsics.hpp"

namespace tilemoe::kernels {

enum class TileProduct { bf16, int8 };

// The four products of a step. GCC 12's tile intrinsics paste their operands into the assembly
// text, so the tile numbers must be literals, not template parameters.
template <TileProduct P, bool TwoRowTiles, bool TwoPanels>
inline void tile_products() {
  if constexpr (P == TileProduct::bf16) {
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (TwoPanels) _tile_dpbf16ps(1, 4, 7);
    if constexpr (TwoRowTiles) {
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (TwoPanels) _tile_dpbf16ps(3, 5, 7);
    }
  } else {
    _tile_dpbssd(0, 4, 6);
    if constexpr (TwoPanels) _tile_dpbssd(1, 4, 7);
    if constexpr (TwoRowTiles) {
      _tile_dpbssd(2, 5, 6);
      if constexpr (TwoPanels) _tile_dpbssd(3, 5, 7);
    }
  }
}

// One k-block of the block: both A tiles (the second `a_next_tile` bytes after the first) and
// both B tiles (`b_next_panel` bytes apart, 64-byte rows) are loaded before the four products.
// On the device (16 threads, tiles in L1 or L2) that ran 7-12 % faster than each load right
// before its first product.
// StreamB loads B by TILELOADDT1, the hint that it is not used again soon, so that B's lines do
// not push out of L1 an A that the next pairs use again.
template <TileProduct P, bool TwoRowTiles, bool TwoPanels, bool StreamB = false>
inline void tile_step(const void* a, std::size_t a_next_tile, long lda_bytes, const void* b, std::size_t b_next_panel) {
  const char* ac = static_cast<const char*>(a);
  const char* bc = static_cast<const char*>(b);
  _tile_loadd(4, ac, lda_bytes);
  if constexpr (StreamB) {
    _tile_stream_loadd(6, bc, 64);
    if constexpr (TwoPanels) _tile_stream_loadd(7, bc + b_next_panel, 64);
  } else {
    _tile_loadd(6, bc, 64);
    if constexpr (TwoPanels) _tile_loadd(7, bc + b_next_panel, 64);
  }
  if constexpr (TwoRowTiles) _tile_loadd(5, ac + a_next_tile, lda_bytes);
  tile_products<P, TwoRowTiles, TwoPanels>();
}

template <bool TwoRowTiles, bool TwoPanels>
inline void zero_c_tiles() {
  _tile_zero(0);
  if constexpr (TwoPanels) _tile_zero(1);
  if constexpr (TwoRowTiles) {
    _tile_zero(2);
    if constexpr (TwoPanels) _tile_zero(3);
  }
}

// at(t) is where C tile t's first row is; rows are ld_bytes apart.
template <bool TwoRowTiles, bool TwoPanels, typename At>
inline void load_c_tiles(At at, long ld_bytes) {
  _tile_loadd(0, at(0), ld_bytes);
  if constexpr (TwoPanels) _tile_loadd(1, at(1), ld_bytes);
  if constexpr (TwoRowTiles) {
    _tile_loadd(2, at(2), ld_bytes);
    if constexpr (TwoPanels) _tile_loadd(3, at(3), ld_bytes);
  }
}

template <bool TwoRowTiles, bool TwoPanels, typename At>
inline void store_c_tiles(At at, long ld_bytes) {
  _tile_stored(0, at(0), ld_bytes);
  if constexpr (TwoPanels) _tile_stored(1, at(1), ld_bytes);
  if constexpr (TwoRowTiles) {
    _tile_stored(2, at(2), ld_bytes);
    if constexpr (TwoPanels) _tile_stored(3, at(3), ld_bytes);
  }
}

// f(t) for every C tile t of the block, in order.
template <bool TwoRowTiles, bool TwoPanels, typename F>
inline void for_each_c_tile(F f) {
  f(0);
  if constexpr (TwoPanels) f(1);
  if constexpr (TwoRowTiles) {
    f(2);
    if constexpr (TwoPanels) f(3);
  }
}

}  // namespace tilemoe::kernels
