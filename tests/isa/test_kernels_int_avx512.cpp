// The AVX512-VNNI integer kernels; SKIPPED on CPUs without AVX512-BF16 (which all have VNNI).
#include <cstring>
#include <random>
#include <vector>

#include "kernel_int_test_grid.hpp"

using namespace tilemoe::kernels;

TEST_CASE("avx512 int kernels match the exact reference") { test::check_int_kernels(Isa::avx512_bf16); }

// The AMX table's entry for few rows and int4 at group 32: the same products, codes asked for ahead.
TEST_CASE("the avx512 int kernel that prefetches matches the exact reference") {
  test::check_int_gemm_grid(gemm_int_avx512_prefetching, false);
  test::check_int_gemm_large(gemm_int_avx512_prefetching, false);
}

// Asking for lines ahead must not change the arithmetic: both entries give the same bits.
TEST_CASE("the avx512 int kernel's two entries give the same bits") {
  std::mt19937 rng(43);
  for (int form = 0; form < 3; ++form)  // int8; int4 with group scales; int4 in column form
    for (int m : {1, 2, 3, 5}) {
      const int bits = form == 0 ? 8 : 4;
      INFO("bits " << bits << " column form " << (form == 2) << " m " << m);
      const int n = 70, k = 4100;
      test::IntWeights w(rng, bits, n, k, 128, form == 2);
      const PackedIntShape& s = w.shape;
      std::vector<std::int8_t> a(static_cast<std::size_t>(m) * s.k_padded, 0);
      for (int i = 0; i < m; ++i)
        for (int q = 0; q < k; ++q)
          a[static_cast<std::size_t>(i) * s.k_padded + q] = static_cast<std::int8_t>(std::uniform_int_distribution<int>(-127, 127)(rng));
      std::vector<float> a_scale(static_cast<std::size_t>(m), 0.01f);
      const std::size_t ldc = static_cast<std::size_t>(s.panels) * 16;
      std::vector<float> plain(static_cast<std::size_t>(m) * ldc, 1.0f), ahead = plain;
      GemmIntArgs g{};
      g.a = a.data();
      g.lda = static_cast<std::size_t>(s.k_padded);
      g.m = m;
      g.a_scale = a_scale.data();
      g.shape = s;
      g.b = w.view(w.codes.data());
      g.panel_begin = 0;
      g.panel_end = s.panels;
      g.c = plain.data();
      g.ldc = ldc;
      g.accumulate = m % 2 == 1;
      gemm_int_avx512(g);
      g.c = ahead.data();
      gemm_int_avx512_prefetching(g);
      REQUIRE(std::memcmp(plain.data(), ahead.data(), plain.size() * sizeof(float)) == 0);
    }
}

// The packer of quantized weights at load: the same bytes as the element-by-element reference,
// whatever lies past each row's codes (a wider stride, an odd k's last high nibble).
TEST_CASE("the avx512 int packer writes the portable packer's bytes") {
  std::mt19937 rng(61);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int bits : {8, 4})
    for (int group : {32, 64, 128})
      for (int n : {1, 15, 16, 17, 40, 130})
        for (int k : {1, 2, 3, 31, 63, 64, 65, 127, 130, 257, 4100}) {
          if (bits == 8 && group != 128) continue;
          INFO("bits " << bits << " group " << group << " n " << n << " k " << k);
          const PackedIntShape s = packed_int_shape(bits, n, k, group);
          const std::size_t row_bytes = bits == 8 ? static_cast<std::size_t>(k) : static_cast<std::size_t>(k + 1) / 2;
          const std::size_t ld = row_bytes + static_cast<std::size_t>(n % 7);
          std::vector<std::int8_t> q(ld * static_cast<std::size_t>(n));
          for (auto& v : q) v = static_cast<std::int8_t>(byte(rng));  // garbage past the codes too
          const int source_groups = bits == 8 ? 1 : (k + group - 1) / group;
          std::vector<float> row_scales(static_cast<std::size_t>(n) * source_groups);
          for (float& v : row_scales) v = std::uniform_real_distribution<float>(0.001f, 0.05f)(rng);
          std::vector<std::uint8_t> codes_p(s.code_bytes(), 0x5a), codes_v(s.code_bytes(), 0xa5);
          std::vector<float> scales_p(s.scale_count(), -1.0f), scales_v(s.scale_count(), -2.0f);
          std::vector<std::int32_t> sums_p(s.scale_count(), 7), sums_v(s.scale_count(), -7);
          pack_int_weights_portable(s, q.data(), ld, row_scales.data(), codes_p.data(), scales_p.data(), sums_p.data());
          pack_int_weights_avx512(s, q.data(), ld, row_scales.data(), codes_v.data(), scales_v.data(), sums_v.data());
          REQUIRE(codes_p == codes_v);
          REQUIRE(std::memcmp(scales_p.data(), scales_v.data(), scales_p.size() * sizeof(float)) == 0);
          REQUIRE(sums_p == sums_v);
        }
}
