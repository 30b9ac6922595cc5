#pragma once
// A software model of the AMX tile unit (palette 1: eight tiles of up to 16 rows x 64 bytes),
// per thread, with the instructions the kernels use. A build with TILEMOE_AMX_EMULATION runs the
// AMX kernels on it (amx/tile_intrinsics.hpp maps the intrinsics here), so machines without AMX,
// CI's among them, run the AMX path's tiling, tails and packing, and under AddressSanitizer every
// tile load and store is checked against its buffer: the model reads and writes exactly the
// bytes the instruction would.
//
// It follows the Intel SDM's pseudocode: LDTILECFG validates the configuration and zeroes every
// tile; TILELOADD fills the configured rows and bytes and zeroes the rest of the tile; TDPBF16PS
// adds the two products of each bf16 pair to the f32 accumulator one after the other (denormal
// inputs read as zero, denormal results flushed to zero); TDPBSSD adds four int8 products to an
// int32 that wraps. What the hardware faults on (an invalid configuration, a tile instruction
// before LDTILECFG, operand shapes that do not match) prints what was wrong and aborts, as the
// fault would end the process.
#include <cstdint>
#include <string>

namespace tilemoe::kernels::tile_emulation {

inline constexpr int kTiles = 8;
inline constexpr int kMaxRows = 16;
inline constexpr int kMaxRowBytes = 64;

// Why LDTILECFG would fault on these 64 bytes, or "" when it would accept them.
std::string config_error(const void* config);

void load_config(const void* config);  // LDTILECFG; palette 0 releases the tiles
void store_config(void* config);       // STTILECFG: 64 zero bytes while no palette is loaded
void release();                        // TILERELEASE

void load(int tile, const void* base, long stride);   // TILELOADD
void store(int tile, void* base, long stride);        // TILESTORED
void zero(int tile);                                  // TILEZERO
void dot_bf16(int c, int a, int b);                   // TDPBF16PS c += a . b
void dot_s8(int c, int a, int b);                     // TDPBSSD   c += a . b

// The bytes of one tile as the model holds them (kMaxRows rows of kMaxRowBytes), for tests.
const std::uint8_t* tile_bytes(int tile);

// What this thread's kernels asked of the tile unit since reset_counts: the kernels' traffic as a
// contract that tests pin down (tests/isa/test_tile_traffic_amx.cpp), since a lost reuse of a
// tile costs time, not correctness.
struct TileCounts {
  std::uint64_t configs = 0;  // LDTILECFG with palette 1
  std::uint64_t loads[kTiles] = {}, stores[kTiles] = {}, zeros[kTiles] = {};
  std::uint64_t dots = 0;  // TDPBF16PS and TDPBSSD
  std::uint64_t load_bytes = 0, store_bytes = 0;
};
TileCounts counts();
void reset_counts();

}  // namespace tilemoe::kernels::tile_emulation
