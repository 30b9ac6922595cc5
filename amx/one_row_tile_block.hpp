#pragma once
// How the AMX bf16 kernel (gemm_bf16_amx.cpp) runs a product of one row tile (m <= 16, the
// experts of 4-16 rows at 16-170 tokens of DeepSeek-V2-Lite): C tiles of 1 x 2 panels with B
// loaded into two free tile registers (pairs), or 1 x 4 panels (quads: four C tiles, A, and B
// through the three registers left, one of them loaded twice a k-block). Both make the same
// products in the same order on every C tile, so results are bit-identical; only speed differs,
// and it differs by CPU (one process, the two forms taking turns call by call, DeepSeek-V2-Lite
// 128 tokens, held r=16, session 70): Sapphire Rapids quads 6-7 % faster, Emerald Rapids quads
// 10-14 % slower.
//
// A process-wide setting, read by the kernel at every call: the CPU's default, or
// TILEMOE_ONE_ROW_BLOCK ("pairs", "quads", "auto"), or set_one_row_tile_block (tests, bench).
#include <optional>
#include <string_view>

#include "amx/isa.hpp"

namespace tilemoe::kernels {

enum class OneRowTileBlock { pairs, quads };

// quads on Sapphire Rapids (family 6, model 143), pairs elsewhere: the two CPUs measured went
// opposite ways, so a CPU not measured keeps the older form.
OneRowTileBlock default_one_row_tile_block(const CpuFeatures& f);
const char* one_row_tile_block_name(OneRowTileBlock b);  // "pairs", "quads"
std::optional<OneRowTileBlock> parse_one_row_tile_block(std::string_view name);

// The form `requested` names, or with "" / "auto" TILEMOE_ONE_ROW_BLOCK's (unset or "auto": the
// CPU's default). Throws Error(invalid_argument) naming the valid names for any other value.
OneRowTileBlock resolve_one_row_tile_block(std::string_view requested);

// The form gemm_bf16_amx uses now: the last set_one_row_tile_block, else resolve_one_row_tile_block
// with TILEMOE_ONE_ROW_BLOCK as it is (an invalid value there gives the CPU's default here: the
// kernel does not throw; resolve_isa reports it when AMX is chosen).
OneRowTileBlock one_row_tile_block();
void set_one_row_tile_block(OneRowTileBlock b);

}  // namespace tilemoe::kernels
