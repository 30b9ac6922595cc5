// The avx2 table's bf16 kernels (gemm_bf16_avx2.cpp; the others are the portable code compiled for
// AVX2 + FMA + F16C); SKIPPED on CPUs without them.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "amx/kernel_table.hpp"
#include "amx/lora_rows.hpp"
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

// lora_rows_avx2.cpp forms each sum in the portable loops' order: the same bits, for f32 and bf16
// factors, ranks and lengths around the vector widths, several rows, a column offset, and the
// transposed layouts (which go to the portable loops).
TEST_CASE("the avx2 LoRA row kernels give the portable kernels' bits") {
  std::mt19937 rng(75);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (bool bf16_factors : {false, true}) {
    for (int rank : {1, 2, 3, 7, 8, 9, 16, 17, 33}) {
      for (int in : {1, 3, 4, 9, 70}) {
        for (int rows : {1, 2, 4, 5}) {
          for (bool transposed : {false, true}) {
            INFO("bf16 " << bf16_factors << " rank " << rank << " in " << in << " rows " << rows << " transposed " << transposed);
            const int n = in + 5, col0 = 3;  // the expansion's B has col0 + n rows
            std::vector<float> a32(static_cast<std::size_t>(rank) * in), b32(static_cast<std::size_t>(col0 + n) * rank);
            for (float& v : a32) v = dist(rng);
            for (float& v : b32) v = dist(rng);
            if (rank > 2) a32[1] = -0.0f, b32[2] = INFINITY;
            std::vector<bf16> a16(a32.size()), b16(b32.size());
            for (std::size_t i = 0; i < a32.size(); ++i) a16[i] = float_to_bf16(a32[i]);
            for (std::size_t i = 0; i < b32.size(); ++i) b16[i] = float_to_bf16(b32[i]);
            // A is [rank][in] and B [col0 + n][rank], row-major; transposed, the same values stored
            // the other way round and read through swapped strides.
            std::vector<float> at32(a32.size()), bt32(b32.size());
            std::vector<bf16> at16(a16.size()), bt16(b16.size());
            for (int j = 0; j < rank; ++j)
              for (int k = 0; k < in; ++k) {
                at32[static_cast<std::size_t>(k) * rank + j] = a32[static_cast<std::size_t>(j) * in + k];
                at16[static_cast<std::size_t>(k) * rank + j] = a16[static_cast<std::size_t>(j) * in + k];
              }
            for (int j = 0; j < col0 + n; ++j)
              for (int q = 0; q < rank; ++q) {
                bt32[static_cast<std::size_t>(q) * (col0 + n) + j] = b32[static_cast<std::size_t>(j) * rank + q];
                bt16[static_cast<std::size_t>(q) * (col0 + n) + j] = b16[static_cast<std::size_t>(j) * rank + q];
              }
            StridedFactor a, b;
            if (!transposed) {
              a = bf16_factors ? StridedFactor(a16.data(), in, 1) : StridedFactor(a32.data(), in, 1);
              b = bf16_factors ? StridedFactor(b16.data(), rank, 1) : StridedFactor(b32.data(), rank, 1);
            } else {
              a = bf16_factors ? StridedFactor(at16.data(), 1, rank) : StridedFactor(at32.data(), 1, rank);
              b = bf16_factors ? StridedFactor(bt16.data(), 1, col0 + n) : StridedFactor(bt32.data(), 1, col0 + n);
            }
            const std::size_t ldv = static_cast<std::size_t>(in) + 2, ldxa = static_cast<std::size_t>(rank) + 1,
                              ldc = static_cast<std::size_t>(n) + 4;
            std::vector<bf16> v(static_cast<std::size_t>(rows) * ldv);
            for (bf16& x : v) x = float_to_bf16(dist(rng));
            if (rows > 1) v[ldv] = float_to_bf16(std::nanf(""));
            std::vector<float> xa_portable(static_cast<std::size_t>(rows) * ldxa, 7.0f), xa_avx2 = xa_portable;
            lora_project_rows_portable(v.data(), ldv, rows, in, a, rank, 0.37f, xa_portable.data(), ldxa);
            lora_project_rows_avx2(v.data(), ldv, rows, in, a, rank, 0.37f, xa_avx2.data(), ldxa);
            REQUIRE(std::memcmp(xa_portable.data(), xa_avx2.data(), xa_portable.size() * sizeof(float)) == 0);

            std::vector<float> c_portable(static_cast<std::size_t>(rows) * ldc);
            for (float& x : c_portable) x = dist(rng);
            c_portable[0] = -0.0f;
            std::vector<float> c_avx2 = c_portable;
            lora_expand_rows_add_portable(xa_portable.data(), ldxa, rows, rank, b, col0, n, c_portable.data(), ldc);
            lora_expand_rows_add_avx2(xa_portable.data(), ldxa, rows, rank, b, col0, n, c_avx2.data(), ldc);
            REQUIRE(std::memcmp(c_portable.data(), c_avx2.data(), c_portable.size() * sizeof(float)) == 0);
          }
        }
      }
    }
  }
}
