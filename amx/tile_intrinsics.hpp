#pragma once
// The AMX tile intrinsics of the kernels: the compiler's, or, in a build with
// TILEMOE_AMX_EMULATION (a test build: CMake option of the same name), the same names run by the
// software model in tile_emulation.hpp. The kernels' code is the same either way; only the
// instructions under it change.
#include "amx/immintrin_gcc12.hpp"

#if defined(TILEMOE_AMX_EMULATION)
#include "amx/tile_emulation.hpp"

// <immintrin.h> is already in: its own uses of these names are behind us.
#undef _tile_loadd
#undef _tile_stream_loadd
#undef _tile_stored
#undef _tile_zero
#undef _tile_dpbf16ps
#undef _tile_dpbssd
#define _tile_loadd(t, base, stride) ::tilemoe::kernels::tile_emulation::load(t, base, stride)
// A load's cache hint has no meaning to the model.
#define _tile_stream_loadd(t, base, stride) ::tilemoe::kernels::tile_emulation::load(t, base, stride)
#define _tile_stored(t, base, stride) ::tilemoe::kernels::tile_emulation::store(t, base, stride)
#define _tile_zero(t) ::tilemoe::kernels::tile_emulation::zero(t)
#define _tile_dpbf16ps(c, a, b) ::tilemoe::kernels::tile_emulation::dot_bf16(c, a, b)
#define _tile_dpbssd(c, a, b) ::tilemoe::kernels::tile_emulation::dot_s8(c, a, b)
// Inline functions in GCC's header, not macros: function-like macros shadow them from here on.
#define _tile_loadconfig(config) ::tilemoe::kernels::tile_emulation::load_config(config)
#define _tile_storeconfig(config) ::tilemoe::kernels::tile_emulation::store_config(config)
#define _tile_release() ::tilemoe::kernels::tile_emulation::release()
#endif
