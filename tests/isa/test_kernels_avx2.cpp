// The avx2 table's bf16 kernels (gemm_bf16_avx2.cpp; the others are the portable code compiled for
// AVX2 + FMA + F16C); SKIPPED on CPUs without them.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "amx/kernel_table.hpp"
#include "amx/pack_bf16.hpp"
#include "kernel_test_grid.hpp"

using namespace tilemoe;
using namespace tilemoe::kernels;

TEST_CASE("avx2 kernels match the double reference") { test::check_kernels(Isa::avx2); }

// gemm_bf16_avx2.cpp computes each element as the portable kernel does (products and sums rounded
// one by one, in the same order): the same bits, which the layer's bit-for-bit promises across
// factor dtypes rest on. With a second product, accumulate, A in tile order, panel ranges, NaN and
// Inf in A.
TEST_CASE("the avx2 bf16 product gives the portable product's bits") {
  std::mt19937 rng(73);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int m : {1, 2, 3, 4, 5, 7, 16, 33}) {
    for (int k : {31, 70, 2050}) {
      for (int variant = 0; variant < 4; ++variant) {
        const int n = 75;
        const bool second = variant >= 1, accumulate = variant >= 2, tiles = variant == 3;
        INFO("m " << m << " k " << k << " variant " << variant);
        const PackedShape shape = packed_shape(n, k);
        std::vector<bf16> w(static_cast<std::size_t>(n) * k), a(static_cast<std::size_t>(m) * shape.k_padded, bf16{0});
        for (auto& v : w) v = float_to_bf16(dist(rng));
        for (int i = 0; i < m; ++i)
          for (int q = 0; q < k; ++q) a[static_cast<std::size_t>(i) * shape.k_padded + q] = float_to_bf16(dist(rng));
        if (m > 2) {
          a[shape.k_padded + 3] = float_to_bf16(std::nanf(""));
          a[2 * static_cast<std::size_t>(shape.k_padded) + 5] = float_to_bf16(INFINITY);
        }
        std::vector<bf16> packed(packed_bf16_elements(n, k));
        pack_bf16_weights(w.data(), n, k, static_cast<std::size_t>(k), packed.data());
        std::vector<bf16> a_tiles(tiled_rows_elements(m, shape.k_padded));
        pack_rows_as_tiles(a.data(), shape.k_padded, m, shape.k_padded, a_tiles.data());

        const int k2 = 16;
        const PackedShape shape2 = packed_shape(n, k2);
        std::vector<bf16> w2(static_cast<std::size_t>(n) * k2), a2(static_cast<std::size_t>(m) * shape2.k_padded, bf16{0});
        for (auto& v : w2) v = float_to_bf16(dist(rng));
        for (int i = 0; i < m; ++i)
          for (int q = 0; q < k2; ++q) a2[static_cast<std::size_t>(i) * shape2.k_padded + q] = float_to_bf16(dist(rng));
        std::vector<bf16> packed2(packed_bf16_elements(n, k2));
        pack_bf16_weights(w2.data(), n, k2, static_cast<std::size_t>(k2), packed2.data());

        const int panel_begin = variant == 2 ? 1 : 0, panel_end = shape.panels;
        const std::size_t ldc = static_cast<std::size_t>(panel_end - panel_begin) * kPanelColumns + 3;
        std::vector<float> portable(static_cast<std::size_t>(m) * ldc);
        for (float& v : portable) v = dist(rng);
        std::vector<float> avx2 = portable;
        GemmBf16Args g = gemm_args(tiles ? a_tiles.data() : a.data(), shape.k_padded, m, shape.k_padded, packed.data(),
                                   panel_begin, panel_end, portable.data(), ldc);
        g.a_tiles = tiles;
        g.accumulate = accumulate;
        if (second) {
          g.a2 = a2.data();
          g.lda2 = shape2.k_padded;
          g.k2_padded = shape2.k_padded;
          g.packed_b2 = packed2.data();
        }
        gemm_bf16_portable(g);
        g.c = avx2.data();
        gemm_bf16_avx2(g);
        REQUIRE(std::memcmp(portable.data(), avx2.data(), portable.size() * sizeof(float)) == 0);
      }
    }
  }
}
