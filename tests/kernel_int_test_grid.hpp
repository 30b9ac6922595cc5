#pragma once
// One body of integer-kernel tests (int8 and int4 weights, int8 activations), run by each ISA's
// test executable: packing round trips, the GEMM over a grid of awkward shapes against an exact
// integer reference, and activation quantization bit for bit against the portable definition.
// Buffers end at guard pages (kernel_test_grid.hpp's Guarded), so over-reads fault.
#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>
#include <vector>

#include "amx/gemm_int.hpp"
#include "amx/kernel_table.hpp"
#include "amx/pack_int.hpp"
#include "kernel_test_grid.hpp"

namespace tilemoe::kernels::test {

inline GemmIntFn raw_gemm_int(Isa isa) {
  switch (isa) {
    case Isa::portable: return gemm_int_portable;
    case Isa::avx2: return gemm_int_avx2;
    case Isa::avx512_bf16: return gemm_int_avx512;
    case Isa::amx_bf16: return gemm_int_amx;
  }
  return nullptr;
}

// Codes [n][k] (int8: -128..127, int4: -8..7) in the canonical row-major form that pack_int_weights
// reads: int8 one byte a code, int4 two codes a byte, the even k in the low nibble.
inline std::size_t canonical_int_row_bytes(int bits, int k) { return bits == 8 ? k : (k + 1) / 2; }
inline std::vector<std::int8_t> canonical_int_codes(int bits, int n, int k, const std::vector<int>& code) {
  const std::size_t row_bytes = canonical_int_row_bytes(bits, k);
  std::vector<std::int8_t> q(row_bytes * n, 0);
  for (int r = 0; r < n; ++r)
    for (int kk = 0; kk < k; ++kk) {
      const int c = code[static_cast<std::size_t>(r) * k + kk];
      if (bits == 8) {
        q[row_bytes * r + kk] = static_cast<std::int8_t>(c);
      } else {
        auto& byte = reinterpret_cast<std::uint8_t&>(q[row_bytes * r + kk / 2]);
        byte |= static_cast<std::uint8_t>((c & 0x0f) << ((kk & 1) ? 4 : 0));
      }
    }
  return q;
}

// Codes of W [n][k] in the canonical row-major form (int4: nibbles) with row scales.
struct IntWeights {
  int bits, n, k, group;
  std::vector<int> code;           // [n][k], unpacked, for the reference
  std::vector<std::int8_t> q;      // canonical form
  std::vector<float> row_scales;   // [n][source groups]
  PackedIntShape shape;
  std::vector<std::uint8_t> codes;
  std::vector<float> scales;
  std::vector<std::int32_t> colsums;
  // With `multiples` (int4): every group scale is a row scale times 0..16, so the scales decompose
  // (decompose_int4_scales) and the view carries the column form the AMX kernel reads.
  bool multiples = false;
  std::vector<float> column_scales;
  std::vector<std::uint8_t> group_multiples;

  IntWeights(std::mt19937& rng, int bits_, int n_, int k_, int group_, bool multiples_ = false)
      : bits(bits_), n(n_), k(k_), group(group_), multiples(multiples_) {
    shape = packed_int_shape(bits, n, k, group);
    const int lo = bits == 8 ? -127 : -8, hi = bits == 8 ? 127 : 7;
    code.resize(static_cast<std::size_t>(n) * k);
    for (int& c : code) c = std::uniform_int_distribution<int>(lo, hi)(rng);
    const std::size_t row_bytes = canonical_int_row_bytes(bits, k);
    q = canonical_int_codes(bits, n, k, code);
    const int source_groups = bits == 8 ? 1 : (k + group - 1) / group;
    row_scales.resize(static_cast<std::size_t>(n) * source_groups);
    for (float& s : row_scales) s = std::uniform_real_distribution<float>(0.001f, 0.05f)(rng);
    if (multiples) {
      for (int r = 0; r < n; ++r) {
        const float unit = std::uniform_real_distribution<float>(1e-4f, 3e-3f)(rng);
        for (int g = 0; g < source_groups; ++g)
          row_scales[static_cast<std::size_t>(r) * source_groups + g] =
              unit * static_cast<float>(std::uniform_int_distribution<int>(g == 1 ? 0 : 1, kInt4MaxGroupMultiple)(rng));
      }
    }
    codes.resize(shape.code_bytes());
    scales.resize(shape.scale_count());
    colsums.resize(shape.scale_count());
    pack_int_weights(shape, q.data(), row_bytes, row_scales.data(), codes.data(), scales.data(), colsums.data());
    if (multiples) {
      column_scales.resize(static_cast<std::size_t>(shape.panels) * 16);
      group_multiples.resize(shape.scale_count());
      REQUIRE(decompose_int4_scales(shape, scales.data(), column_scales.data(), group_multiples.data()));
    }
  }
  PackedIntView view(const std::uint8_t* packed_codes) const {
    PackedIntView v{packed_codes, scales.data(), colsums.data()};
    if (multiples) {
      v.column_scales = column_scales.data();
      v.group_multiples = group_multiples.data();
    }
    return v;
  }
  float scale_of(int r, int kk) const {
    const int source_groups = bits == 8 ? 1 : (k + group - 1) / group;
    return row_scales[static_cast<std::size_t>(r) * source_groups + (bits == 8 ? 0 : kk / group)];
  }
};

inline void check_int_packing() {
  std::mt19937 rng(3);
  for (int bits : {8, 4})
    for (int group : {32, 64, 128})
      for (int n : {1, 15, 17, 40})
        for (int k : {1, 3, 63, 64, 65, 130, 257}) {
          if (bits == 8 && group != 128) continue;
          INFO("bits " << bits << " group " << group << " n " << n << " k " << k);
          IntWeights w(rng, bits, n, k, group);
          const PackedIntShape& s = w.shape;
          for (int col = 0; col < s.n_padded; ++col) {
            std::vector<std::int32_t> sums(s.groups, 0);
            for (int kk = 0; kk < s.k_padded; ++kk) {
              const int want = (col < n && kk < k) ? w.code[static_cast<std::size_t>(col) * k + kk] : 0;
              REQUIRE(packed_int_code(s, w.codes.data(), col, kk) == want);
              sums[kk / s.group] += want;
            }
            for (int g = 0; g < s.groups; ++g) {
              const std::size_t at = (static_cast<std::size_t>(col / 16) * s.groups + g) * 16 + col % 16;
              REQUIRE(w.colsums[at] == sums[g]);
              const bool real = col < n && g * s.group < k;
              REQUIRE(w.scales[at] == (real ? w.scale_of(col, g * s.group) : 0.0f));
            }
          }
        }
}

// The column form of int4 scales: found for multiples of one scale (zero groups and zero columns
// included) and equal to them; refused for free scales, NaN and negative scales.
inline void check_int4_scale_decomposition() {
  std::mt19937 rng(5);
  for (int group : {32, 64, 128})
    for (int n : {1, 17, 40})
      for (int k : {1, 65, 300}) {
        INFO("group " << group << " n " << n << " k " << k);
        IntWeights w(rng, 4, n, k, group, true);
        const PackedIntShape& s = w.shape;
        for (int col = 0; col < s.n_padded; ++col)
          for (int g = 0; g < s.groups; ++g) {
            const std::size_t at = (static_cast<std::size_t>(col / 16) * s.groups + g) * 16 + col % 16;
            const float unit = w.column_scales[static_cast<std::size_t>(col / 16) * 16 + col % 16];
            REQUIRE(w.group_multiples[at] <= kInt4MaxGroupMultiple);
            REQUIRE(std::fabs(unit * w.group_multiples[at] - w.scales[at]) <= 1e-6f * w.scales[at]);
          }
        std::vector<float> cs(static_cast<std::size_t>(s.panels) * 16);
        std::vector<std::uint8_t> gm(s.scale_count());
        std::vector<float> scales = w.scales;
        const bool several = (k + group - 1) / group > 1;  // real groups: a single one always decomposes
        if (several) {
          scales[16] = scales[0] > 0 ? scales[0] * 1.37f : 0.0123f;  // column 0, group 1: no longer a multiple
          if (scales[0] == 0.0f) scales[0] = 0.01f;
          CHECK_FALSE(decompose_int4_scales(s, scales.data(), cs.data(), gm.data()));
        }
        scales = w.scales;
        scales[0] = std::nanf("");
        CHECK_FALSE(decompose_int4_scales(s, scales.data(), cs.data(), gm.data()));
        scales[0] = -0.01f;
        CHECK_FALSE(decompose_int4_scales(s, scales.data(), cs.data(), gm.data()));
        IntWeights free_scales(rng, 4, n, k, group);
        if (several) CHECK_FALSE(decompose_int4_scales(s, free_scales.scales.data(), cs.data(), gm.data()));
      }
  PackedIntShape int8 = packed_int_shape(8, 16, 64, 0);
  std::vector<float> cs(16), scales(int8.scale_count(), 0.5f);
  std::vector<std::uint8_t> gm(int8.scale_count());
  CHECK_FALSE(decompose_int4_scales(int8, scales.data(), cs.data(), gm.data()));
}

struct IntGemmCase {
  int bits, group, m, n, k;
  bool accumulate = false;
  int panel_begin = 0, panel_end = -1;
  int lda_extra = 0, ldc_extra = 0;
  bool nan_row = false;  // row 0's activation scale is NaN
  bool a_tiles = false;  // A passed in tile order (pack_int.hpp)
  bool multiples = false;  // int4 scales that decompose, passed in column form too
  int k2 = 0;              // > 0: a bf16 second product (a LoRA term) of this reduction length
  bool compact2 = false;   // its W2 in the short panel form (compact_packed_panels, pack_bf16.hpp)
  bool to_y = false;       // the result as bf16 into y (GemmIntArgs::y; C is then scratch), rows cols + ldy_extra apart
  int ldy_extra = 0;
  std::string describe() const {
    std::ostringstream s;
    s << "bits=" << bits << " group=" << group << " m=" << m << " n=" << n << " k=" << k << " accumulate=" << accumulate
      << " panels=[" << panel_begin << "," << panel_end << ") lda+=" << lda_extra << " ldc+=" << ldc_extra
      << " nan_row=" << nan_row << " a_tiles=" << a_tiles << " multiples=" << multiples << " k2=" << k2 << " compact2=" << compact2 << " to_y=" << to_y
      << " ldy+=" << ldy_extra;
    return s.str();
  }
};

inline void check_int_gemm_case(GemmIntFn gemm, const IntGemmCase& tc, std::mt19937& rng) {
  INFO(tc.describe());
  IntWeights w(rng, tc.bits, tc.n, tc.k, tc.group, tc.multiples);
  const PackedIntShape& s = w.shape;
  const int pb = tc.panel_begin, pe = tc.panel_end < 0 ? s.panels : tc.panel_end;
  const int cols = (pe - pb) * 16;
  const std::size_t lda = static_cast<std::size_t>(s.k_padded + tc.lda_extra);
  const std::size_t ldc = static_cast<std::size_t>(cols + tc.ldc_extra);
  Guarded<std::int8_t> a((tc.m - 1) * lda + s.k_padded);
  for (int i = 0; i < tc.m; ++i)
    for (std::size_t q = 0; q < (i + 1 < tc.m ? lda : static_cast<std::size_t>(s.k_padded)); ++q)
      a[i * lda + q] = q < static_cast<std::size_t>(tc.k) ? static_cast<std::int8_t>(std::uniform_int_distribution<int>(-127, 127)(rng))
                       : q < static_cast<std::size_t>(s.k_padded) ? std::int8_t{0}
                                                                  : std::int8_t{99};  // beyond k_padded: anything
  std::vector<float> a_scale(tc.m);
  for (float& v : a_scale) v = std::uniform_real_distribution<float>(0.001f, 0.02f)(rng);
  if (tc.nan_row) a_scale[0] = std::nanf("");
  Guarded<std::uint8_t> codes(w.codes.size());
  std::copy(w.codes.begin(), w.codes.end(), codes.data());
  const std::size_t c_count = (tc.m - 1) * ldc + cols;
  Guarded<float> c(c_count);
  std::vector<float> c0(c_count);
  for (std::size_t i = 0; i < c_count; ++i) {
    const bool target = i % ldc < static_cast<std::size_t>(cols);
    c0[i] = !target ? kPadding : tc.accumulate ? std::uniform_real_distribution<float>(-1, 1)(rng) : kUnwritten;
    c[i] = c0[i];
  }
  // Tile order: the rows past m in the last row tile hold codes that must not be used, and the
  // buffer ends at a guard page.
  Guarded<std::int8_t> tiles(tc.a_tiles ? int8_tiled_rows_bytes(tc.m, s.k_padded) : 1);
  if (tc.a_tiles) {
    for (std::size_t i = 0; i < tiles.size(); ++i) tiles[i] = static_cast<std::int8_t>(127 - static_cast<int>(i % 7));
    pack_int8_rows_as_tiles(a.data(), lda, tc.m, s.k_padded, tiles.data());
  }
  // The second product: A2 rows (bf16, zeros in [k2, k2_padded)) and W2 [n][k2] packed as bf16.
  const int k2_padded = tc.k2 > 0 ? packed_shape(tc.n, tc.k2).k_padded : 0;
  const std::size_t lda2 = static_cast<std::size_t>(k2_padded + 8);
  std::vector<bf16> a2(tc.k2 > 0 ? static_cast<std::size_t>(tc.m) * lda2 : 0, bf16{0});
  std::vector<bf16> w2(static_cast<std::size_t>(tc.n) * std::max(tc.k2, 0));
  Guarded<bf16> b2(tc.k2 > 0 ? packed_bf16_elements(tc.n, tc.k2) : 1);
  if (tc.k2 > 0) {
    for (int i = 0; i < tc.m; ++i)
      for (int q = 0; q < tc.k2; ++q) a2[i * lda2 + q] = float_to_bf16(std::uniform_real_distribution<float>(-1, 1)(rng));
    for (bf16& v : w2) v = float_to_bf16(std::uniform_real_distribution<float>(-1, 1)(rng));
    pack_bf16_weights(w2.data(), tc.n, tc.k2, static_cast<std::size_t>(tc.k2), b2.data());
  }
  // The short panel form ends where the last panel's last tile load ends: a longer read faults.
  Guarded<bf16> compact(tc.k2 > 0 && tc.compact2 ? compact_packed_elements(tc.n, tc.k2) : 1);
  GemmIntArgs args{};
  if (tc.k2 > 0) {
    args.a2 = a2.data();
    args.lda2 = lda2;
    args.k2_padded = k2_padded;
    args.packed_b2 = b2.data();
    if (tc.compact2) {
      compact_packed_panels(b2.data(), tc.n, tc.k2, compact.data());
      args.packed_b2 = compact.data();
      args.b2_panel_stride = compact_panel_elements(tc.k2);
    }
  }
  args.a = tc.a_tiles ? tiles.data() : a.data();
  args.a_tiles = tc.a_tiles;
  args.lda = lda;
  args.m = tc.m;
  args.a_scale = a_scale.data();
  args.shape = s;
  args.b = w.view(codes.data());
  args.panel_begin = pb;
  args.panel_end = pe;
  args.c = c.data();
  args.ldc = ldc;
  args.accumulate = tc.accumulate;
  // y's rows beyond the result's columns (its padding) must keep their sentinel.
  const std::size_t ldy = static_cast<std::size_t>(cols + tc.ldy_extra);
  const bf16 y_sentinel = float_to_bf16(-12345.0f);
  Guarded<bf16> y(tc.to_y ? (tc.m - 1) * ldy + cols : 1);
  if (tc.to_y) {
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = y_sentinel;
    args.y = y.data();
    args.ldy = ldy;
  }
  gemm(args);

  std::ostringstream error;
  for (int i = 0; i < tc.m && error.tellp() == 0; ++i) {
    for (std::size_t j = 0; j < ldc && error.tellp() == 0; ++j) {
      const std::size_t at = i * ldc + j;
      if (at >= c_count) break;
      if (j >= static_cast<std::size_t>(cols)) {
        if (c[at] != kPadding) error << "C[" << i << "][" << j << "] is padding but was written: " << c[at];
        continue;
      }
      // With y, C is scratch and the result is y's bf16.
      const float got = tc.to_y ? bf16_to_float(y[i * ldy + j]) : c[at];
      const int col = pb * 16 + static_cast<int>(j);
      double sum = 0.0, mag = 0.0;
      if (col < tc.n) {
        for (int kk = 0; kk < tc.k; ++kk) {
          const double t = static_cast<double>(a[i * lda + kk]) * w.code[static_cast<std::size_t>(col) * tc.k + kk] * w.scale_of(col, kk);
          sum += t;
          mag += std::fabs(t);
        }
      }
      sum = sum * a_scale[i] + (tc.accumulate ? c0[at] : 0.0);
      mag = mag * std::fabs(a_scale[i]) + (tc.accumulate ? std::fabs(c0[at]) : 0.0);
      if (col < tc.n)
        for (int q = 0; q < tc.k2; ++q) {
          const double t = static_cast<double>(bf16_to_float(a2[i * lda2 + q])) * bf16_to_float(w2[static_cast<std::size_t>(col) * tc.k2 + q]);
          sum += t;
          mag += std::fabs(t);
        }
      if (tc.nan_row && i == 0) {
        if (!std::isnan(got)) error << "C[0][" << j << "] = " << got << " but row 0's scale is NaN";
        continue;
      }
      // bf16's rounding: half a unit in the last of its 8 significant bits.
      const double tol = 1e-5 * mag + (tc.to_y ? std::fabs(sum) / 256.0 : 0.0) + 1e-30;
      if (!(std::fabs(got - sum) <= tol))
        error << (tc.to_y ? "y[" : "C[") << i << "][" << j << "] = " << got << ", reference " << sum << " (tolerance " << tol << ")";
    }
    if (tc.to_y && i + 1 < tc.m)
      for (std::size_t j = static_cast<std::size_t>(cols); j < ldy && error.tellp() == 0; ++j)
        if (y[i * ldy + j] != y_sentinel) error << "y[" << i << "][" << j << "] is padding but was written";
  }
  INFO(error.str());
  REQUIRE(error.tellp() == 0);
}

inline void check_int_gemm_grid(GemmIntFn gemm, bool amx) {
  std::mt19937 rng(77);
  static const int ms[] = {1, 2, 3, 4, 5, 6, 16, 17, 31, 33, 50, 130};
  static const int ns[] = {1, 17, 33, 100};
  static const int ks[] = {1, 31, 64, 100, 200, 257};
  for (int bits : {8, 4}) {
    for (int group : {32, 64, 128}) {
      if (bits == 8 && group != 128) continue;
      for (int m : ms)
        for (int n : ns)
          for (int k : ks) {
            if (bits == 4) {
              IntGemmCase multiples{bits, group, m, n, k};
              multiples.multiples = true;
              multiples.accumulate = rng() % 2 == 0;
              multiples.a_tiles = rng() % 2 == 0;
              check_int_gemm_case(gemm, multiples, rng);
            }
            // The AMX kernel has no form for free int4 scales at group 32: the table sends those to AVX512-VNNI.
            if (amx && bits == 4 && group == 32) continue;
            check_int_gemm_case(gemm, IntGemmCase{bits, group, m, n, k}, rng);
            IntGemmCase tc{bits, group, m, n, k};
            tc.accumulate = rng() % 2 == 0;
            const int panels = packed_int_shape(bits, n, k, group).panels;
            tc.panel_begin = static_cast<int>(rng() % panels);
            tc.panel_end = tc.panel_begin + 1 + static_cast<int>(rng() % (panels - tc.panel_begin));
            tc.lda_extra = static_cast<int>(rng() % 3) * 33;
            tc.ldc_extra = static_cast<int>(rng() % 2) * 5;
            tc.nan_row = rng() % 5 == 0;
            check_int_gemm_case(gemm, tc, rng);
            IntGemmCase tiled{bits, group, m, n, k};
            tiled.a_tiles = true;
            tiled.accumulate = rng() % 2 == 0;
            check_int_gemm_case(gemm, tiled, rng);
            IntGemmCase lora{bits, group, m, n, k};  // with a LoRA term as the second product
            // Ranks on both sides of a half and a whole k-block (the short panel form's two lengths).
            static const int k2s[] = {1, 16, 17, 32, 33, 64};
            lora.k2 = k2s[rng() % 6];
            lora.a_tiles = rng() % 2 == 0;
            lora.accumulate = rng() % 2 == 0;
            lora.nan_row = rng() % 5 == 0;
            lora.multiples = bits == 4 && rng() % 2 == 0;
            const int lora_panels = packed_int_shape(bits, n, k, group).panels;
            lora.panel_begin = static_cast<int>(rng() % lora_panels);
            check_int_gemm_case(gemm, lora, rng);
            lora.compact2 = true;
            check_int_gemm_case(gemm, lora, rng);
            IntGemmCase to_y{bits, group, m, n, k};  // the bf16 result straight into y's rows
            to_y.to_y = true;
            to_y.ldy_extra = static_cast<int>(rng() % 3) * 7;
            to_y.a_tiles = rng() % 2 == 0;
            to_y.k2 = rng() % 2 == 0 ? k2s[rng() % 6] : 0;
            to_y.multiples = bits == 4 && rng() % 2 == 0;
            to_y.nan_row = rng() % 5 == 0;
            to_y.panel_begin = static_cast<int>(rng() % lora_panels);
            check_int_gemm_case(gemm, to_y, rng);
          }
    }
  }
}

// K large enough for several L2 panel groups and many scale groups; rows on both sides of the AMX
// kernel's pairs-outside bound (128 rows).
inline void check_int_gemm_large(GemmIntFn gemm, bool amx) {
  std::mt19937 rng(12);
  for (int bits : {8, 4})
    for (int m : {1, 7, 40, 70, 161, 300}) {
      IntGemmCase tc{bits, (amx || m % 2) ? 128 : 32, m, 130, 4100};
      tc.accumulate = m % 2 == 0;
      tc.panel_begin = 1;
      check_int_gemm_case(gemm, tc, rng);
      tc.a_tiles = true;
      check_int_gemm_case(gemm, tc, rng);
      IntGemmCase yc{bits, tc.group, m, 130, 4100};
      yc.to_y = true;
      yc.ldy_extra = 9;
      yc.a_tiles = m % 2 == 1;
      yc.k2 = 16;
      check_int_gemm_case(gemm, yc, rng);
      if (bits == 4) {
        for (int group : {32, 128}) {
          IntGemmCase mc{bits, group, m, 130, 4100};
          mc.multiples = true;
          mc.a_tiles = m % 2 == 0;
          mc.accumulate = m > 40;
          check_int_gemm_case(gemm, mc, rng);
        }
      }
    }
}

inline void check_quantize_rows(QuantizeRowsFn quantize) {
  std::mt19937 rng(4);
  for (int k : {1, 15, 16, 17, 100, 2048}) {
    const int rows = 6, k_padded = (k + 63) / 64 * 64;
    const std::size_t ldx = k + 3, ldq = k_padded + 5;
    std::vector<bf16> x(rows * ldx);
    for (bf16& v : x) v = float_to_bf16(std::uniform_real_distribution<float>(-4, 4)(rng));
    for (std::size_t j = 0; j < static_cast<std::size_t>(k); ++j) x[ldx + j] = 0;  // row 1: zeros
    x[2 * ldx + k / 2] = float_to_bf16(NAN);
    x[3 * ldx + k - 1] = float_to_bf16(-INFINITY);
    x[4 * ldx] = float_to_bf16(1e30f);
    std::vector<std::int8_t> want(rows * ldq, 5), got(rows * ldq, 5);
    std::vector<float> sw(rows), sg(rows);
    quantize_rows_portable(x.data(), ldx, rows, k, k_padded, want.data(), ldq, sw.data());
    quantize(x.data(), ldx, rows, k, k_padded, got.data(), ldq, sg.data());
    for (int i = 0; i < rows; ++i) {
      INFO("k " << k << " row " << i);
      REQUIRE((sw[i] == sg[i] || (std::isnan(sw[i]) && std::isnan(sg[i]))));
      for (int j = 0; j < k_padded; ++j) REQUIRE(got[i * ldq + j] == want[i * ldq + j]);
      for (std::size_t j = k_padded; j < ldq && i + 1 < rows; ++j) REQUIRE(got[i * ldq + j] == 5);
    }
    REQUIRE(sw[1] == 0.0f);
    REQUIRE(std::isnan(sw[2]));
    REQUIRE(std::isnan(sw[3]));
    // Codes reproduce the row within half a step.
    for (int j = 0; j < k; ++j)
      REQUIRE(std::fabs(want[5 * ldq + j] * sw[5] - bf16_to_float(x[5 * ldx + j])) <= 0.5f * sw[5] * 1.0001f);
  }
}

inline void check_int_kernels(Isa isa) {
  const KernelTable& table = kernel_table(isa);
  const bool amx = isa == Isa::amx_bf16;
  SECTION("int packing") { check_int_packing(); }
  SECTION("int4 scales in column form") { check_int4_scale_decomposition(); }
  SECTION("int gemm grid") { check_int_gemm_grid(raw_gemm_int(isa), amx); }
  SECTION("int gemm large k") { check_int_gemm_large(raw_gemm_int(isa), amx); }
  SECTION("table int gemm, every group") {
    check_int_gemm_grid(table.gemm_int, false);
    check_int_gemm_large(table.gemm_int, false);
  }
  SECTION("quantize rows") { check_quantize_rows(table.quantize_rows); }
}

}  // namespace tilemoe::kernels::test
