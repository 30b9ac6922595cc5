#pragma once
// One body of MXFP4 kernel tests, run by each ISA's test executable: packing round trips, the
// dequantization bit for bit against the definition (mxfp4_value_bf16: E2M1 times 2^(e - 127) in
// bf16), and gemm_mxfp4 through the ISA's bf16 kernel against that kernel on the dequantized
// weights (itself checked against a double reference by kernel_test_grid.hpp) and against a double
// reference. Weights and outputs end at guard pages (kernel_test_grid.hpp's Guarded).
#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>
#include <vector>

#include "amx/gemm_mxfp4.hpp"
#include "amx/kernel_table.hpp"
#include "amx/pack_mxfp4.hpp"
#include "kernel_test_grid.hpp"

namespace tilemoe::kernels::test {

inline DequantizeMxfp4Fn raw_dequantize_mxfp4(Isa isa) {
  return isa == Isa::portable ? dequantize_mxfp4_blocks_portable : isa == Isa::avx2 ? dequantize_mxfp4_blocks_avx2 : dequantize_mxfp4_blocks_avx512;
}
inline GemmMxfp4RowsFn raw_gemm_mxfp4_rows(Isa isa) {
  return isa == Isa::portable ? gemm_mxfp4_rows_portable : isa == Isa::avx2 ? gemm_mxfp4_rows_avx2 : gemm_mxfp4_rows_avx512;
}
inline GemmMxfp4FewRowsFn raw_gemm_mxfp4_few_rows(Isa isa) { return isa == Isa::amx_bf16 ? gemm_mxfp4_few_rows_amx : nullptr; }
inline GemmMxfp4PairFirstBlockFn raw_gemm_mxfp4_pair_first_block(Isa isa) {
  return isa == Isa::amx_bf16 ? gemm_mxfp4_pair_first_block_amx : nullptr;
}

// W [n][k] in MXFP4's canonical form (nibbles, exponents [n][groups]) and packed.
struct Mxfp4Weights {
  int n, k, groups;
  std::vector<int> code;              // [n][k]
  std::vector<std::uint8_t> q, e;     // canonical
  PackedMxfp4Shape shape;
  Guarded<std::uint8_t> codes, exponents;

  // Exponents spread over [lo, hi]; with `extremes`, some groups at the ends of the exact range
  // and some all-zero groups with exponents outside it (0, 1, 255), which must dequantize to ±0.
  Mxfp4Weights(std::mt19937& rng, int n_, int k_, int lo = 118, int hi = 131, bool extremes = false)
      : n(n_), k(k_), groups((k_ + kMxfp4Group - 1) / kMxfp4Group), shape(packed_mxfp4_shape(n_, k_)),
        codes(shape.code_bytes()), exponents(shape.exponent_bytes()) {
    code.resize(static_cast<std::size_t>(n) * k);
    for (int& c : code) c = static_cast<int>(rng() % 16);
    const std::size_t row_bytes = static_cast<std::size_t>(k + 1) / 2;
    e.resize(static_cast<std::size_t>(n) * groups);
    for (auto& x : e) x = static_cast<std::uint8_t>(std::uniform_int_distribution<int>(lo, hi)(rng));
    if (extremes) {
      for (std::size_t i = 0; i < e.size(); ++i) {
        const int row = static_cast<int>(i / groups), g = static_cast<int>(i % groups);
        switch (rng() % 8) {
          case 0: e[i] = kMxfp4MinExponent; break;
          case 1: e[i] = kMxfp4MaxExponent; break;
          case 2:
            e[i] = static_cast<std::uint8_t>(std::vector<int>{0, 1, 255}[rng() % 3]);
            for (int kk = g * kMxfp4Group; kk < std::min(k, (g + 1) * kMxfp4Group); ++kk)
              code[static_cast<std::size_t>(row) * k + kk] &= 8;  // ±0
            break;
          default: break;
        }
      }
    }
    q.assign(row_bytes * n, 0);
    for (int r = 0; r < n; ++r)
      for (int kk = 0; kk < k; ++kk)
        q[row_bytes * r + kk / 2] |= static_cast<std::uint8_t>(code[static_cast<std::size_t>(r) * k + kk] << ((kk & 1) ? 4 : 0));
    pack_mxfp4_weights(shape, q.data(), row_bytes, e.data(), static_cast<std::size_t>(groups), codes.data(), exponents.data());
  }
  PackedMxfp4View view() { return {codes.data(), exponents.data()}; }
  bf16 value(int row, int kk) const {
    return mxfp4_value_bf16(code[static_cast<std::size_t>(row) * k + kk], e[static_cast<std::size_t>(row) * groups + kk / kMxfp4Group]);
  }
  // The dequantized W [n][k], packed as bf16 weights.
  std::vector<bf16> packed_bf16() const {
    std::vector<bf16> w(static_cast<std::size_t>(n) * k), packed(packed_bf16_elements(n, k));
    for (int r = 0; r < n; ++r)
      for (int kk = 0; kk < k; ++kk) w[static_cast<std::size_t>(r) * k + kk] = value(r, kk);
    pack_bf16_weights(w.data(), n, k, static_cast<std::size_t>(k), packed.data());
    return packed;
  }
};

inline void check_mxfp4_packing() {
  std::mt19937 rng(5);
  for (int n : {1, 15, 16, 17, 40})
    for (int k : {1, 2, 31, 32, 33, 64, 95, 200}) {
      INFO("n " << n << " k " << k);
      Mxfp4Weights w(rng, n, k);
      for (int col = 0; col < w.shape.n_padded; ++col)
        for (int kk = 0; kk < w.shape.k_padded; ++kk) {
          const bool inside = col < n && kk < k;
          REQUIRE(packed_mxfp4_code(w.shape, w.codes.data(), col, kk) == (inside ? w.code[static_cast<std::size_t>(col) * k + kk] : 0));
          REQUIRE(packed_mxfp4_exponent(w.shape, w.exponents.data(), col, kk) ==
                  (col < n ? w.e[static_cast<std::size_t>(col) * w.groups + kk / kMxfp4Group] : kMxfp4ExponentBias));
        }
    }
}

// Every E2M1 code at every exponent of the exact range: the bits are the value's.
inline void check_mxfp4_values() {
  for (int e = kMxfp4MinExponent; e <= kMxfp4MaxExponent; ++e)
    for (int c = 0; c < 16; ++c) {
      const double want = static_cast<double>(kE2m1Values[c]) * std::ldexp(1.0, e - kMxfp4ExponentBias);
      const bf16 got = mxfp4_value_bf16(c, e);
      INFO("code " << c << " exponent " << e);
      REQUIRE(static_cast<double>(bf16_to_float(got)) == want);
      REQUIRE(std::signbit(bf16_to_float(got)) == (c >= 8));
    }
}

// Sub-ranges of panels and k-blocks into packed bf16, against the definition, and nothing written
// past the output (it ends at a guard page).
inline void check_mxfp4_dequantize(DequantizeMxfp4Fn dequantize) {
  std::mt19937 rng(17);
  for (int n : {1, 16, 17, 50})
    for (int k : {1, 33, 64, 300}) {
      Mxfp4Weights w(rng, n, k, kMxfp4MinExponent, kMxfp4MaxExponent, true);
      const std::vector<bf16> whole = w.packed_bf16();
      for (int trial = 0; trial < 6; ++trial) {
        const int nb0 = static_cast<int>(rng() % w.shape.panels);
        const int nb1 = nb0 + 1 + static_cast<int>(rng() % (w.shape.panels - nb0));
        const int kb0 = static_cast<int>(rng() % w.shape.kblocks);
        const int kb1 = kb0 + 1 + static_cast<int>(rng() % (w.shape.kblocks - kb0));
        INFO("n " << n << " k " << k << " panels [" << nb0 << "," << nb1 << ") k-blocks [" << kb0 << "," << kb1 << ")");
        const int kbs = kb1 - kb0;
        Guarded<bf16> out(static_cast<std::size_t>(nb1 - nb0) * kbs * kBlockElements);
        dequantize(w.shape, w.view(), nb0, nb1, kb0, kb1, out.data());
        for (int nb = nb0; nb < nb1; ++nb)
          for (int kb = kb0; kb < kb1; ++kb)
            for (int i = 0; i < kBlockElements; ++i) {
              const bf16 got = out[(static_cast<std::size_t>(nb - nb0) * kbs + (kb - kb0)) * kBlockElements + i];
              const bf16 want = whole[(static_cast<std::size_t>(nb) * w.shape.kblocks + kb) * kBlockElements + i];
              if (got != want) {
                INFO("block (" << nb << "," << kb << ") element " << i << ": " << got << " against " << want);
                REQUIRE(got == want);
              }
            }
      }
    }
}

struct Mxfp4GemmCase {
  int m, n, k, k2 = 0;
  bool accumulate = false, tiles = false;
  int panel_begin = 0, panel_end = -1, ldc_extra = 0;
};

// gemm_mxfp4 through `gemm` against `gemm` on the dequantized weights (the same A, A2, W2 and C),
// within f32 reordering (K's chunks), and both against a double reference; padding untouched.
inline void check_mxfp4_gemm_case(const Mxfp4Kernels& kernels, const Mxfp4GemmCase& tc, std::mt19937& rng) {
  const GemmBf16Fn gemm = kernels.gemm;
  Mxfp4Weights w(rng, tc.n, tc.k);
  const PackedMxfp4Shape& s = w.shape;
  const int pb = tc.panel_begin, pe = tc.panel_end < 0 ? s.panels : tc.panel_end;
  INFO("m " << tc.m << " n " << tc.n << " k " << tc.k << " k2 " << tc.k2 << " accumulate " << tc.accumulate << " tiles " << tc.tiles
            << " panels [" << pb << "," << pe << ")");
  const std::size_t lda = static_cast<std::size_t>(s.k_padded + 3);
  std::vector<bf16> a(static_cast<std::size_t>(tc.m) * lda, bf16{0x7fc0});
  for (int i = 0; i < tc.m; ++i)
    for (int q = 0; q < s.k_padded; ++q) a[i * lda + q] = q < tc.k ? random_bf16(rng) : bf16{0};
  std::vector<bf16> tiles;
  if (tc.tiles) {
    tiles.assign(tiled_rows_elements(tc.m, s.k_padded), bf16{0});
    pack_rows_as_tiles(a.data(), lda, tc.m, s.k_padded, tiles.data());
  }
  const int k2_padded = tc.k2 == 0 ? 0 : packed_shape(tc.n, tc.k2).k_padded;
  std::vector<bf16> a2(static_cast<std::size_t>(tc.m) * std::max(k2_padded, 1), bf16{0}), w2(static_cast<std::size_t>(tc.n) * tc.k2),
      packed2(tc.k2 == 0 ? 1 : packed_bf16_elements(tc.n, tc.k2));
  for (int i = 0; i < tc.m; ++i)
    for (int q = 0; q < tc.k2; ++q) a2[static_cast<std::size_t>(i) * k2_padded + q] = random_bf16(rng);
  for (bf16& v : w2) v = random_bf16(rng);
  if (tc.k2 > 0) pack_bf16_weights(w2.data(), tc.n, tc.k2, static_cast<std::size_t>(tc.k2), packed2.data());
  const int cols = (pe - pb) * kPanelColumns;
  const std::size_t ldc = static_cast<std::size_t>(cols + tc.ldc_extra);
  const std::size_t c_count = (tc.m - 1) * ldc + cols;
  std::vector<float> c0(c_count);
  for (std::size_t i = 0; i < c_count; ++i)
    c0[i] = i % ldc >= static_cast<std::size_t>(cols) ? kPadding : tc.accumulate ? std::uniform_real_distribution<float>(-1, 1)(rng) : kUnwritten;
  Guarded<float> got(c_count);
  std::vector<float> want(c0);
  std::copy(c0.begin(), c0.end(), got.data());

  GemmBf16Args g{};
  g.a = tc.tiles ? tiles.data() : a.data();
  g.lda = tc.tiles ? 0 : lda;
  g.a_tiles = tc.tiles;
  g.m = tc.m;
  g.k_padded = s.k_padded;
  g.panel_begin = pb;
  g.panel_end = pe;
  if (tc.k2 > 0) {
    g.a2 = a2.data();
    g.lda2 = static_cast<std::size_t>(k2_padded);
    g.k2_padded = k2_padded;
    g.packed_b2 = packed2.data();
  }
  g.ldc = ldc;
  g.accumulate = tc.accumulate;
  g.c = got.data();
  gemm_mxfp4(g, s, w.view(), kernels);
  const std::vector<bf16> dequantized = w.packed_bf16();
  // The rows kernel may round each k-block of a row to multiples of its step (gemm_mxfp4.hpp).
  const bool rows_path = kernels.rows != nullptr && !tc.tiles && tc.m <= kMxfp4RowsMaxRows;
  std::vector<std::vector<double>> rows_steps(tc.m, std::vector<double>(s.kblocks));
  for (int i = 0; i < tc.m; ++i)
    for (int kb = 0; kb < s.kblocks; ++kb) {
      float largest = 0;
      for (int q = kb * kBlockK; q < (kb + 1) * kBlockK; ++q) largest = std::max(largest, std::fabs(bf16_to_float(a[i * lda + q])));
      rows_steps[i][kb] = mxfp4_rows_step(largest);
    }
  g.packed_b = dequantized.data();
  g.c = want.data();
  gemm(g);

  for (int i = 0; i < tc.m; ++i)
    for (std::size_t j = 0; j < ldc; ++j) {
      const std::size_t at = i * ldc + j;
      if (at >= c_count) break;
      INFO("C[" << i << "][" << j << "] = " << got[at] << ", bf16 kernel " << want[at]);
      if (j >= static_cast<std::size_t>(cols)) {
        REQUIRE(got[at] == kPadding);
        continue;
      }
      const int col = pb * kPanelColumns + static_cast<int>(j);
      double sum = tc.accumulate ? c0[at] : 0.0, scale = tc.accumulate ? std::fabs(c0[at]) : 0.0, rounding = 0.0;
      if (col < tc.n) {
        for (int q = 0; q < tc.k; ++q) {
          const double p = static_cast<double>(bf16_to_float(a[i * lda + q])) * bf16_to_float(w.value(col, q));
          sum += p;
          scale += std::fabs(p);
          if (rows_path) rounding += std::fabs(static_cast<double>(bf16_to_float(w.value(col, q)))) * rows_steps[i][q / kBlockK] / 2;
        }
        for (int q = 0; q < tc.k2; ++q) {
          const double p = static_cast<double>(bf16_to_float(a2[static_cast<std::size_t>(i) * k2_padded + q])) *
                           bf16_to_float(w2[static_cast<std::size_t>(col) * tc.k2 + q]);
          sum += p;
          scale += std::fabs(p);
        }
      }
      REQUIRE(std::fabs(got[at] - want[at]) <= 1e-5 * scale + rounding + 1e-30);
      REQUIRE(std::fabs(got[at] - sum) <= 1e-3 * scale + 1e-30);
    }
}

inline void check_mxfp4_gemm_grid(const Mxfp4Kernels& kernels) {
  std::mt19937 rng(29);
  static const int ms[] = {1, 2, 3, 4, 5, 9, 12, 15, 16, 17, 31, 32, 40, 129};
  static const int ns[] = {1, 17, 33, 100};
  static const int ks[] = {0, 1, 31, 33, 64, 255, 300};
  for (int m : ms)
    for (int n : ns)
      for (int k : ks) {
        check_mxfp4_gemm_case(kernels, Mxfp4GemmCase{m, n, k}, rng);
        Mxfp4GemmCase tc{m, n, k};
        tc.k2 = std::vector<int>{0, 1, 16, 33}[rng() % 4];
        tc.accumulate = rng() % 2 == 0;
        tc.tiles = rng() % 2 == 0;
        const int panels = packed_mxfp4_shape(n, k).panels;
        tc.panel_begin = static_cast<int>(rng() % panels);
        tc.panel_end = tc.panel_begin + 1 + static_cast<int>(rng() % (panels - tc.panel_begin));
        tc.ldc_extra = static_cast<int>(rng() % 6);
        check_mxfp4_gemm_case(kernels, tc, rng);
      }
}

// A rows kernel may keep what it made of A between calls (AVX-512 keeps its digits): rows changed
// in place, at the same address, and a call with fewer rows must still give their own products,
// and NaN in a row reaches that row's outputs and no other row's.
inline void check_mxfp4_rows_reuse(const Mxfp4Kernels& kernels) {
  std::mt19937 rng(41);
  const int n = 40, k = 300;
  Mxfp4Weights w(rng, n, k);
  const PackedMxfp4Shape& s = w.shape;
  const std::size_t lda = static_cast<std::size_t>(s.k_padded);
  std::vector<bf16> a(kMxfp4RowsMaxRows * lda, bf16{0});
  for (int i = 0; i < kMxfp4RowsMaxRows; ++i)
    for (int q = 0; q < k; ++q) a[i * lda + q] = random_bf16(rng);
  const std::vector<bf16> dequantized = w.packed_bf16();
  const std::size_t ldc = static_cast<std::size_t>(s.panels) * kPanelColumns;
  auto run = [&](int m, const Mxfp4Kernels* with) {
    std::vector<float> c(m * ldc, kUnwritten);
    GemmBf16Args g = gemm_args(a.data(), lda, m, s.k_padded, with ? nullptr : dequantized.data(), 0, s.panels, c.data(), ldc);
    // The reference is the portable bf16 kernel: VDPBF16PS and the tiles take subnormal values as
    // zero, where the rows kernels (and PyTorch) keep them.
    if (with) gemm_mxfp4(g, s, w.view(), *with);
    else gemm_bf16_portable(g);
    return c;
  };
  auto check = [&](int m, const char* what) {
    INFO(what << ", " << m << " rows");
    const std::vector<float> got = run(m, &kernels), want = run(m, nullptr);
    std::vector<float> scale(m);  // a row's size: its largest |A| times W's largest |value| (6 x 2^4)
    for (int i = 0; i < m; ++i)
      for (int q = 0; q < k; ++q) scale[i] = std::max(scale[i], std::fabs(bf16_to_float(a[i * lda + q])) * 96.0f);
    for (int i = 0; i < m; ++i)
      for (int col = 0; col < n; ++col) {
        const float g = got[i * ldc + col], r = want[i * ldc + col];
        INFO("C[" << i << "][" << col << "] = " << g << ", portable bf16 kernel " << r);
        if (std::isnan(r)) {
          REQUIRE(std::isnan(g));
        } else {
          REQUIRE(std::fabs(g - r) <= 1e-3 * std::fabs(r) + 1e-3 * scale[i]);
        }
      }
  };
  check(4, "first call");
  a[2 * lda + 77] = float_to_bf16(-3.5f);
  check(4, "one value changed in place");
  check(3, "fewer rows");
  a[1 * lda + 5] = bf16{0x7fc0};
  check(3, "NaN in row 1");
  a[1 * lda + 5] = float_to_bf16(0.25f);
  check(3, "NaN gone");
  for (int q = 0; q < k; ++q) {
    a[q] = float_to_bf16(std::ldexp(bf16_to_float(a[q]), -100));
    a[lda + q] = float_to_bf16(std::ldexp(bf16_to_float(a[lda + q]), 100));
  }
  check(2, "rows scaled by 2^-100 and 2^100");
  // Subnormal values: a rows kernel that scales a k-block to integers by 2^(140 - its largest
  // exponent) must reach 2^140, which is no f32.
  for (int q = 0; q < k; ++q) a[q] = float_to_bf16(std::ldexp(bf16_to_float(a[q]), -30));
  check(2, "row 0 subnormal");
  for (int q = 0; q < k; ++q) a[q] = bf16{0};
  check(1, "a zero row");
}

inline void check_mxfp4_kernels(Isa isa) {
  const KernelTable& table = kernel_table(isa);
  SECTION("mxfp4 packing") { check_mxfp4_packing(); }
  SECTION("mxfp4 values") { check_mxfp4_values(); }
  SECTION("mxfp4 dequantize") {
    check_mxfp4_dequantize(raw_dequantize_mxfp4(isa));
    check_mxfp4_dequantize(table.dequantize_mxfp4);
  }
  SECTION("mxfp4 gemm through the table's kernels") { check_mxfp4_gemm_grid(mxfp4_kernels(table)); }
  SECTION("mxfp4 gemm through the raw kernels") {
    check_mxfp4_gemm_grid({raw_gemm(isa), raw_dequantize_mxfp4(isa), raw_gemm_mxfp4_rows(isa), raw_gemm_mxfp4_few_rows(isa),
                           raw_gemm_mxfp4_pair_first_block(isa)});
  }
  SECTION("mxfp4 gemm with every row count through whole pairs, the first 32 rows with their dequantization") {
    // 1-16 rows too, which the few-rows kernel otherwise takes.
    if (raw_gemm_mxfp4_pair_first_block(isa) != nullptr)
      check_mxfp4_gemm_grid({raw_gemm(isa), raw_dequantize_mxfp4(isa), nullptr, nullptr, raw_gemm_mxfp4_pair_first_block(isa)});
  }
  SECTION("mxfp4 gemm with every row tile's rows through the few-rows kernel") {
    // Decode's 1-4 rows too, which the rows kernel otherwise takes.
    if (raw_gemm_mxfp4_few_rows(isa) != nullptr)
      check_mxfp4_gemm_grid({raw_gemm(isa), raw_dequantize_mxfp4(isa), nullptr, raw_gemm_mxfp4_few_rows(isa)});
  }
  SECTION("mxfp4 rows kernel after rows change in place") {
    check_mxfp4_rows_reuse({raw_gemm(isa), raw_dequantize_mxfp4(isa), raw_gemm_mxfp4_rows(isa)});
  }
  SECTION("mxfp4 gemm with every row count through dequantized chunks") {
    check_mxfp4_gemm_grid({table.gemm_bf16, table.dequantize_mxfp4, nullptr});
  }
}

}  // namespace tilemoe::kernels::test
