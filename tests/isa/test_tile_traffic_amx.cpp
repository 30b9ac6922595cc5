// The AMX kernels' tile traffic, counted by the tile model (tile_emulation.hpp), as a contract:
// each (row tile, panel, k-block) is one tile product; a 32-row block's two row tiles share its B
// tiles; a panel pair shares its A tiles; C tiles are zeroed or loaded once and stored once per
// block (int: once per scale group); the configuration is loaded only when it changes. A change
// that lost one of these reuses would still compute the right numbers, only slower: here it
// fails. The numbers themselves are checked by the same harness as test_kernels_amx. Runs where
// the tiles are emulated (a TILEMOE_AMX_EMULATION build, as CI's sanitizer build); SKIPPED
// elsewhere (isa_main.cpp).
#include <cstdint>
#include <random>

#include "amx/gemm_bf16.hpp"
#include "amx/gemm_int.hpp"
#include "amx/tile_emulation.hpp"
#include "kernel_int_test_grid.hpp"
#include "kernel_test_grid.hpp"

using namespace tilemoe;
using namespace tilemoe::kernels;
namespace emu = tilemoe::kernels::tile_emulation;

namespace {

emu::TileCounts last;
GemmBf16Args last_bf16;
GemmIntArgs last_int;

void counted_bf16(const GemmBf16Args& args) {
  emu::reset_counts();
  gemm_bf16_amx(args);
  last = emu::counts();
  last_bf16 = args;
}

void counted_int(const GemmIntArgs& args) {
  emu::reset_counts();
  gemm_int_amx(args);
  last = emu::counts();
  last_int = args;
}

// tile_block.hpp's registers: tmm0-3 C, tmm4/5 A, tmm6/7 B.
std::uint64_t sum(const std::uint64_t (&per_tile)[emu::kTiles], int first, int last_tile) {
  std::uint64_t s = 0;
  for (int t = first; t <= last_tile; ++t) s += per_tile[t];
  return s;
}

struct Expected {
  std::uint64_t dots, a_loads, b_loads, c_loads, c_zeros, c_stores;
};

// m rows over `panels` panels with `kblocks` k-blocks in all (both products), C written `passes`
// times per block (bf16: once; int: once per scale group, and once more for a second product).
Expected expected(int m, int panels, int kblocks, int passes, bool c_loaded) {
  const std::uint64_t row_tiles = static_cast<std::uint64_t>((m + 15) / 16), row_blocks = static_cast<std::uint64_t>((m + 31) / 32);
  const std::uint64_t p = static_cast<std::uint64_t>(panels), pairs = (p + 1) / 2, kb = static_cast<std::uint64_t>(kblocks);
  const std::uint64_t c_tiles = row_tiles * p * static_cast<std::uint64_t>(passes);
  return {row_tiles * p * kb, row_tiles * pairs * kb, row_blocks * p * kb, c_loaded ? c_tiles : 0, c_loaded ? 0 : c_tiles, c_tiles};
}

void check_counts(const Expected& want, std::uint64_t store_bytes) {
  CHECK(last.dots == want.dots);
  CHECK(sum(last.loads, 4, 5) == want.a_loads);
  CHECK(sum(last.loads, 6, 7) == want.b_loads);
  CHECK(sum(last.loads, 0, 3) == want.c_loads);
  CHECK(sum(last.zeros, 0, 3) == want.c_zeros);
  CHECK(sum(last.stores, 0, 3) == want.c_stores);
  CHECK(sum(last.stores, 4, 7) == 0);
  CHECK(last.store_bytes == store_bytes);
}

}  // namespace

TEST_CASE("bf16 tiles: one product per tile triple, shared A and B tiles, C in and out once") {
  std::mt19937 rng(31);
  struct Case {
    int m, n, k, k2;
    bool accumulate, tiles;
    int panel_begin, panel_end;
  };
  const Case cases[] = {
      {64, 96, 128, 0, false, true, 0, -1},   {50, 100, 70, 16, true, false, 2, 5},  {17, 33, 300, 0, false, false, 0, -1},
      {40, 64, 2048, 0, true, true, 0, -1},   {5, 16, 32, 33, false, false, 0, -1},  {96, 1408, 256, 16, false, true, 10, 41},
      {33, 48, 1000, 8, true, true, 1, 3},
  };
  for (const Case& cs : cases) {
    test::GemmCase tc{cs.m, cs.n, cs.k};
    tc.k2 = cs.k2;
    tc.accumulate = cs.accumulate;
    tc.tiles = cs.tiles;
    tc.panel_begin = cs.panel_begin;
    tc.panel_end = cs.panel_end;
    INFO(tc.describe());
    test::check_gemm_case(counted_bf16, tc, rng);
    const GemmBf16Args& g = last_bf16;
    const int panels = g.panel_end - g.panel_begin;
    const int kblocks = g.k_padded / kBlockK + (g.packed_b2 != nullptr ? g.k2_padded / kBlockK : 0);
    check_counts(expected(g.m, panels, kblocks, 1, g.accumulate), static_cast<std::uint64_t>(g.m) * panels * 64);
  }
}

TEST_CASE("bf16 tiles: the configuration is loaded only when it changes") {
  std::mt19937 rng(37);
  release_amx_tiles();
  test::check_gemm_case(counted_bf16, test::GemmCase{64, 64, 64}, rng);
  CHECK(last.configs == 1);
  test::check_gemm_case(counted_bf16, test::GemmCase{96, 40, 100}, rng);  // the same 16/16 tiles
  CHECK(last.configs == 0);
  test::check_gemm_case(counted_bf16, test::GemmCase{7, 40, 100}, rng);  // a 7-row configuration
  CHECK(last.configs == 1);
  // 33-128 rows go pair by pair, row blocks in snake order: 16/16, 7/7 | 7/7, 16/16 over pairs
  // (0,1) and (2), where the tail after every pair would take four.
  test::check_gemm_case(counted_bf16, test::GemmCase{39, 40, 100}, rng);
  CHECK(last.configs == 3);
  // From 129 rows, row blocks outside: the 16/16 blocks of the group, then its 7-row tail once.
  test::check_gemm_case(counted_bf16, test::GemmCase{135, 40, 100}, rng);
  CHECK(last.configs == 1);
  release_amx_tiles();
}

TEST_CASE("int tiles pair by pair (int8 33-128 rows, int4 up to 128): row blocks in snake order, a configuration change a pair") {
  std::mt19937 rng(43);
  for (int bits : {8, 4}) {
    for (int m : {39, 100}) {
      INFO("bits " << bits << " m " << m);
      release_amx_tiles();
      test::IntGemmCase tc{bits, 128, m, 80, 256};  // 5 panels: pairs (0,1), (2,3), (4); a 7- or 4-row tail
      tc.a_tiles = true;
      test::check_int_gemm_case(counted_int, tc, rng);
      // 16/16 .. t/t | t/t .. 16/16 | 16/16 .. t/t: four loads, where the tail after every pair would take six.
      CHECK(last.configs == 4);
      // The counts of the shared-tile contract hold in this order too (int4 g128: two scale groups).
      const int groups = bits == 8 ? 1 : 2;
      check_counts(expected(m, 5, 4, groups, false), static_cast<std::uint64_t>(m) * 5 * 64 * groups);
    }
  }
  test::IntGemmCase small{4, 128, 7, 80, 256};  // int4, one row block: 7/7 once for every pair
  test::check_int_gemm_case(counted_int, small, rng);
  CHECK(last.configs == 1);
  test::IntGemmCase even{8, 128, 48, 64, 256};  // a 16-row tail: 16/16 once (7/7 was left), for every block
  test::check_int_gemm_case(counted_int, even, rng);
  CHECK(last.configs == 1);
  release_amx_tiles();
}

TEST_CASE("int tiles: one product per tile triple, shared A and B tiles, C out once per scale group") {
  std::mt19937 rng(41);
  struct Case {
    int bits, group, m, n, k, k2;
    bool a_tiles, multiples;
  };
  const Case cases[] = {
      {8, 0, 64, 96, 256, 0, true, false},   {8, 0, 50, 100, 200, 16, false, false}, {4, 128, 40, 64, 512, 0, true, false},
      {4, 128, 33, 48, 384, 8, false, true}, {4, 64, 17, 33, 256, 0, false, false},  {8, 0, 4, 16, 64, 0, false, false},
  };
  for (const Case& cs : cases) {
    test::IntGemmCase tc{cs.bits, cs.group == 0 ? 128 : cs.group, cs.m, cs.n, cs.k};
    tc.a_tiles = cs.a_tiles;
    tc.multiples = cs.multiples;
    tc.k2 = cs.k2;
    INFO(tc.describe());
    test::check_int_gemm_case(counted_int, tc, rng);
    const GemmIntArgs& g = last_int;
    const bool multiples = g.shape.bits == 4 && g.b.column_scales != nullptr && g.b.group_multiples != nullptr;
    const int groups = multiples ? 1 : g.shape.groups;
    const bool second = g.packed_b2 != nullptr && g.k2_padded > 0;
    const int panels = g.panel_end - g.panel_begin;
    const int kblocks = g.shape.kblocks + (second ? g.k2_padded / kBlockK : 0);
    check_counts(expected(g.m, panels, kblocks, groups + (second ? 1 : 0), false),
                 static_cast<std::uint64_t>(g.m) * panels * 64 * static_cast<std::uint64_t>(groups + (second ? 1 : 0)));
  }
}
