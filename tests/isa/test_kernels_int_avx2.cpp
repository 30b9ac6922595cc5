// The integer kernels of the avx2 table (gemm_int_avx2.cpp: VPMADDUBSW; quantize_rows is the
// portable code compiled for AVX2); SKIPPED on CPUs without AVX2.
#include <cstring>
#include <random>
#include <vector>

#include "kernel_int_test_grid.hpp"

using namespace tilemoe;
using namespace tilemoe::kernels;

TEST_CASE("avx2 int kernels match the exact reference") { test::check_int_kernels(Isa::avx2); }

// The sums of codes are exact and are scaled in the portable kernel's order, so the avx2 table
// gives the portable bits (the layer's bit-for-bit promises rest on it), for every code, edge
// codes (-128 .. 127 for int8, where |q| = 128 takes VPMADDUBSW's unsigned side) included.
TEST_CASE("the avx2 integer product gives the portable product's bits") {
  std::mt19937 rng(74);
  for (int bits : {8, 4}) {
    for (int group : bits == 8 ? std::vector<int>{0} : std::vector<int>{32, 64, 128}) {
      for (int m : {1, 2, 3, 4, 5, 9}) {
        // k = 8200: panels of more than 64 KiB, so the kernel's L2 groups of panels hold their least
        // (4 panels) and n = 70 (5 panels) spans two groups that the row groups pass over in turn.
        for (int k : {64, 100, 257, 8200}) {
          for (int variant = 0; variant < 4; ++variant) {
            const int n = k > 4096 ? 70 : 37;
            // variant 3: a range of panels that starts past the first (decode's split of columns).
            const bool accumulate = variant == 1, second = variant == 2, from_second_panel = variant == 3;
            INFO("bits " << bits << " group " << group << " m " << m << " k " << k << " variant " << variant);
            const PackedIntShape s = packed_int_shape(bits, n, k, bits == 8 ? 0 : group);
            // Codes over the whole range, edges included: -128 is outside the quantizer's range
            // but a kernel must not turn it into a wrong sum.
            const int lo = bits == 8 ? -128 : -8, hi = bits == 8 ? 127 : 7;
            std::vector<int> code(static_cast<std::size_t>(n) * k);
            for (int& c : code) {
              const int pick = std::uniform_int_distribution<int>(0, 9)(rng);
              c = pick == 0 ? lo : pick == 1 ? hi : std::uniform_int_distribution<int>(lo, hi)(rng);
            }
            const std::size_t row_bytes = test::canonical_int_row_bytes(bits, k);
            const std::vector<std::int8_t> q = test::canonical_int_codes(bits, n, k, code);
            const int source_groups = bits == 8 ? 1 : (k + group - 1) / group;
            std::vector<float> row_scales(static_cast<std::size_t>(n) * source_groups);
            for (float& v : row_scales) v = std::uniform_real_distribution<float>(1e-4f, 0.05f)(rng);
            std::vector<std::uint8_t> codes(s.code_bytes());
            std::vector<float> scales(s.scale_count());
            std::vector<std::int32_t> colsums(s.scale_count());
            pack_int_weights(s, q.data(), row_bytes, row_scales.data(), codes.data(), scales.data(), colsums.data());

            std::vector<std::int8_t> a(static_cast<std::size_t>(m) * s.k_padded, 0);
            for (int i = 0; i < m; ++i)
              for (int kk = 0; kk < k; ++kk)
                a[static_cast<std::size_t>(i) * s.k_padded + kk] = static_cast<std::int8_t>(std::uniform_int_distribution<int>(-127, 127)(rng));
            std::vector<float> a_scale(m);
            for (float& v : a_scale) v = std::uniform_real_distribution<float>(1e-3f, 0.02f)(rng);
            if (m > 2) a_scale[1] = std::nanf("");

            const int k2 = 19;
            const PackedShape s2 = packed_shape(n, k2);
            std::vector<bf16> a2(static_cast<std::size_t>(m) * s2.k_padded, bf16{0}), w2(static_cast<std::size_t>(n) * k2);
            for (int i = 0; i < m; ++i)
              for (int kk = 0; kk < k2; ++kk) a2[static_cast<std::size_t>(i) * s2.k_padded + kk] = float_to_bf16(std::uniform_real_distribution<float>(-1, 1)(rng));
            for (bf16& v : w2) v = float_to_bf16(std::uniform_real_distribution<float>(-1, 1)(rng));
            std::vector<bf16> b2(packed_bf16_elements(n, k2));
            pack_bf16_weights(w2.data(), n, k2, static_cast<std::size_t>(k2), b2.data());

            const std::size_t ldc = static_cast<std::size_t>(s.panels) * 16;
            std::vector<float> start(static_cast<std::size_t>(m) * ldc);
            for (float& v : start) v = std::uniform_real_distribution<float>(-1, 1)(rng);
            std::vector<float> c_portable = start, c_avx2 = start;
            GemmIntArgs args{};
            args.a = a.data();
            args.lda = static_cast<std::size_t>(s.k_padded);
            args.m = m;
            args.a_scale = a_scale.data();
            args.shape = s;
            args.b = PackedIntView{codes.data(), scales.data(), colsums.data()};
            args.panel_begin = from_second_panel ? 1 : 0;
            args.panel_end = s.panels;
            args.ldc = ldc;
            args.accumulate = accumulate;
            if (second) {
              args.a2 = a2.data();
              args.lda2 = static_cast<std::size_t>(s2.k_padded);
              args.k2_padded = s2.k_padded;
              args.packed_b2 = b2.data();
            }
            args.c = c_portable.data();
            gemm_int_portable(args);
            args.c = c_avx2.data();
            gemm_int_avx2(args);
            REQUIRE(std::memcmp(c_portable.data(), c_avx2.data(), c_portable.size() * sizeof(float)) == 0);
          }
        }
      }
    }
  }
}
