// The AMX-BF16 GEMM (and the AMX table, which sends small m to AVX-512); SKIPPED on CPUs or
// kernels without AMX. Beyond the shared grid: the tile configuration must follow m from call
// to call, survive tiles released or reconfigured by other code, and be per thread.
#include <cstdint>
#include <cstring>
#include <thread>

#include "amx/kernel_table.hpp"
#include "amx/one_row_tile_block.hpp"
#include "amx/tile_emulation.hpp"
#include "kernel_test_grid.hpp"

using namespace tilemoe;
using namespace tilemoe::kernels;

TEST_CASE("amx kernels match the double reference") { test::check_kernels(Isa::amx_bf16); }

// The suite runs the CPU's default form everywhere else; here both, whatever the CPU. Widths of
// 5-13 panels put quads beside the pairs (and a single panel) that finish a group, and panel
// sub-ranges start them off panel 0.
TEST_CASE("both one-row tile blocks match the double reference") {
  struct Restore {  // a failed REQUIRE leaves the test case early
    OneRowTileBlock before = one_row_tile_block();
    ~Restore() { set_one_row_tile_block(before); }
  } restore;
  for (OneRowTileBlock block : {OneRowTileBlock::pairs, OneRowTileBlock::quads}) {
    INFO("one-row tile block " << one_row_tile_block_name(block));
    set_one_row_tile_block(block);
    test::check_gemm_grid(gemm_bf16_amx);
    test::check_gemm_features(gemm_bf16_amx);
    std::mt19937 rng(23);
    for (int m : {4, 7, 12, 16})
      for (int n : {64, 65, 80, 130, 200, 208})
        for (int k : {32, 100, 2048}) {
          test::GemmCase tc{m, n, k};
          tc.k2 = (m + n) % 3 == 0 ? 0 : 16;
          tc.accumulate = n % 2 == 1;
          tc.tiles = k == 100;
          test::check_gemm_case(gemm_bf16_amx, tc, rng);
          tc.panel_begin = 1;
          tc.panel_end = packed_shape(n, k).panels;
          test::check_gemm_case(gemm_bf16_amx, tc, rng);
        }
  }
}

TEST_CASE("the amx table routes small m to avx512 and uses the avx512 epilogue") {
  const KernelTable& t = kernel_table(Isa::amx_bf16);
  CHECK(t.amx_min_rows == kAmxMinRows);
  CHECK(t.silu_mul_bf16 == &silu_mul_bf16_avx512);
  CHECK(t.gemm_bf16 != &gemm_bf16_avx512);
}

TEST_CASE("the tile configuration follows m across calls and tile releases") {
  std::mt19937 rng(13);
  int call = 0;
  for (int m : {40, 5, 33, 16, 100, 1, 64, 17, 64, 32, 31, 2}) {
    test::GemmCase tc{m, 70, 90};
    tc.k2 = call % 3 == 0 ? 16 : 0;
    tc.accumulate = call % 2 == 1;
    if (call % 4 == 3) release_amx_tiles();
    test::check_gemm_case(gemm_bf16_amx, tc, rng);
    ++call;
  }
}

namespace {

// A configuration some other AMX user might leave behind: every tile 2 rows × 8 bytes.
void load_foreign_tile_config() {
  alignas(64) std::uint8_t cfg[64] = {};
  cfg[0] = 1;
  for (int t = 0; t < 8; ++t) {
    cfg[16 + 2 * t] = 8;
    cfg[48 + t] = 2;
  }
#if defined(TILEMOE_AMX_EMULATION)
  tile_emulation::load_config(cfg);
#else
  // The test is built without -mamx-tile; the assembler knows the instruction anyway.
  __asm__ volatile("ldtilecfg %0" ::"m"(cfg) : "memory");
#endif
}

}  // namespace

TEST_CASE("a tile configuration left by other code is replaced") {
  std::mt19937 rng(17);
  for (int m : {64, 20, 9}) {
    load_foreign_tile_config();
    test::check_gemm_case(gemm_bf16_amx, test::GemmCase{m, 33, 64}, rng);
  }
  release_amx_tiles();
}

TEST_CASE("threads configure their own tiles") {
  // Catch2 assertions are not thread-safe: workers only compute; the main thread compares
  // every worker's result with a single-threaded run of the same (deterministic) kernel.
  const int n = 100, k = 300, max_m = 70;
  std::mt19937 rng(19);
  std::vector<bf16> w(n * k), a(max_m * k + 32);
  for (bf16& v : w) v = test::random_bf16(rng);
  std::vector<bf16> packed(packed_bf16_elements(n, k));
  pack_bf16_weights(w.data(), n, k, k, packed.data());
  const PackedShape s = packed_shape(n, k);
  const std::size_t lda = s.k_padded;
  a.assign(max_m * lda, bf16{0});
  for (int i = 0; i < max_m; ++i)
    for (int q = 0; q < k; ++q) a[i * lda + q] = test::random_bf16(rng);

  const int ms[] = {70, 3, 48, 16, 29, 64, 8, 33};
  const std::size_t ldc = s.n_padded;
  auto run = [&](int m, std::vector<float>& c) {
    c.assign(m * ldc, 0.0f);
    GemmBf16Args args{};
    args.a = a.data();
    args.lda = lda;
    args.m = m;
    args.k_padded = s.k_padded;
    args.packed_b = packed.data();
    args.panel_begin = 0;
    args.panel_end = s.panels;
    args.c = c.data();
    args.ldc = ldc;
    gemm_bf16_amx(args);
  };
  std::vector<std::vector<float>> expected(std::size(ms));
  for (std::size_t i = 0; i < std::size(ms); ++i) run(ms[i], expected[i]);

  const int threads = 4, rounds = 20;
  std::vector<std::vector<std::vector<float>>> got(threads, std::vector<std::vector<float>>(std::size(ms)));
  std::vector<int> mismatches(threads, 0);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::vector<float> c;
      for (int r = 0; r < rounds; ++r) {
        const std::size_t i = (t + r) % std::size(ms);  // threads out of step: different m at once
        run(ms[i], c);
        if (c != expected[i]) ++mismatches[t];
      }
      release_amx_tiles();
    });
  }
  for (std::thread& th : pool) th.join();
  for (int t = 0; t < threads; ++t) {
    INFO("thread " << t);
    CHECK(mismatches[t] == 0);
  }
}
