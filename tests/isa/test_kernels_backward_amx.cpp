// The backward's kernels of the AMX table, checked like the portable and AVX-512 ones and against
// the portable ones, and the tile kernel of the LoRA gradient outer products at every row count
// (the table sends fewer than 64 rows to AVX-512). SKIPPED on CPUs without AMX; CI's sanitizer
// build runs them on the emulated tiles.
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "amx/kernel_table.hpp"
#include "kernel_backward_grid.hpp"

using namespace tilemoe;
using namespace tilemoe::kernels;

TEST_CASE("amx backward kernels match W, the double reference and the portable kernels") {
  const KernelTable& t = kernel_table(Isa::amx_bf16);
  CHECK(t.lora_grad_outer == &lora_grad_outer_amx);
  const test::BackwardKernels portable{pack_transposed_kblock_portable, lora_grad_outer_portable, gemm_bf16_portable};
  test::check_backward_kernels({t.pack_transposed_kblock, t.lora_grad_outer, t.gemm_bf16}, &portable);
}

TEST_CASE("amx outer products on tiles at every row count match the double reference and the portable kernel") {
  test::check_lora_grad_grid(lora_grad_outer_amx_tiles, lora_grad_outer_portable);
  test::check_lora_grad_bf16_target(lora_grad_outer_amx_tiles);
}

TEST_CASE("amx outer products: NaN on the tiles poisons only its row or column") {
  for (int rows : {3, 16, 40, 97}) {
    INFO("rows=" << rows);
    test::check_lora_grad_nan_and_empty(lora_grad_outer_amx_tiles, rows);
  }
}

// Infinities in v or u give what the sums in doubles give: u's zero parts must not turn an
// infinite v into NaN (the kernel hands such columns to the f32 FMAs). The infinity sits in the
// second 64-column pass, so the first pass's columns come from the tiles.
TEST_CASE("amx outer products: an infinity gives the infinite sum") {
  const int rows = 40, n = 150, rank = 20;
  std::mt19937 rng(67);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (bool in_v : {true, false})
    for (bool rank_major : {true, false})
      for (bool overwrite : {true, false}) {
        INFO("in_v=" << in_v << " rank_major=" << rank_major << " overwrite=" << overwrite);
        std::vector<bf16> v(static_cast<std::size_t>(rows) * n);
        std::vector<float> u(static_cast<std::size_t>(rows) * rank);
        for (auto& x : v) x = test::random_bf16(rng);
        for (auto& x : u) x = bf16_to_float(float_to_bf16(uniform(rng)));  // bf16 values: u's mid and lo parts are 0
        const float inf = std::numeric_limits<float>::infinity();
        if (in_v) {
          v[5 * n + 100] = float_to_bf16(inf);
          for (int q = 0; q < rank; ++q) u[5 * rank + q] = q % 2 ? 0.5f : -0.75f;
        } else {
          u[7 * rank + 3] = -inf;
          for (int o = 0; o < n; ++o) v[7 * n + o] = float_to_bf16(o % 3 ? 0.5f : -2.0f);
        }
        const int g_rows = rank_major ? rank : n, g_cols = rank_major ? n : rank;
        std::vector<float> g0(static_cast<std::size_t>(g_rows) * g_cols);
        for (auto& x : g0) x = uniform(rng);
        std::vector<float> g(g0);
        lora_grad_outer_amx_tiles(v.data(), n, nullptr, u.data(), rank, rows, n, rank, g.data(), g_cols, rank_major, overwrite);
        for (int q = 0; q < rank; ++q)
          for (int o = 0; o < n; ++o) {
            const std::size_t at = rank_major ? static_cast<std::size_t>(q) * g_cols + o : static_cast<std::size_t>(o) * g_cols + q;
            double sum = overwrite ? 0.0 : g0[at], scale = std::fabs(sum);
            for (int i = 0; i < rows; ++i) {
              const double t = double(u[static_cast<std::size_t>(i) * rank + q]) * bf16_to_float(v[static_cast<std::size_t>(i) * n + o]);
              sum += t, scale += std::fabs(t);
            }
            INFO("q=" << q << " o=" << o << " got " << g[at] << ", reference " << sum);
            if (std::isinf(sum)) {
              REQUIRE(g[at] == sum);
            } else {
              REQUIRE(std::fabs(g[at] - sum) <= 1e-5 * scale);
            }
          }
      }
}
