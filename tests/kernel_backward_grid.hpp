#pragma once
// One body of tests for the backward's kernels, run by each ISA's test executable: the transposed
// repack against W itself, against pack_bf16_weights of the explicit Wᵀ and through a GEMM, and the
// LoRA gradient outer products against a double reference. Inputs end at guard pages; gaps in the
// outputs carry sentinels that must survive, gaps in the inputs carry NaN that must not be read.
#include <cmath>
#include <random>
#include <sstream>
#include <vector>

#include "amx/lora_grad.hpp"
#include "amx/pack_transposed.hpp"
#include "kernel_test_grid.hpp"

namespace tilemoe::kernels::test {

struct BackwardKernels {
  PackTransposedFn pack_transposed;
  LoraGradOuterFn lora_grad_outer;
  GemmBf16Fn gemm;
};

inline constexpr bf16 kBf16Sentinel = 0xbeef;
inline constexpr bf16 kBf16Nan = 0x7fc0;

// A random W[n][k] (row stride k) and its forward packing.
struct PackedWeight {
  int n, k;
  PackedShape shape;
  std::vector<bf16> w;
  Guarded<bf16> packed;
  PackedWeight(std::mt19937& rng, int n_, int k_)
      : n(n_), k(k_), shape(packed_shape(n_, k_)), w(static_cast<std::size_t>(n_) * k_), packed(packed_bf16_elements(n_, k_)) {
    for (bf16& x : w) x = random_bf16(rng);
    pack_bf16_weights(w.data(), n, k, static_cast<std::size_t>(k), packed.data());
  }
  bf16 at(int h, int col) const { return h < n && col < k ? w[static_cast<std::size_t>(h) * k + col] : bf16{0}; }
};

// Every k-block of one W: both panels element by element against W (padding included), the gaps
// between and after them untouched, and equal to the explicit transpose packed the forward way.
// `same_as` (optional) must produce the same bits.
inline void check_pack_transposed_case(PackTransposedFn fn, PackTransposedFn same_as, int n, int k, int stride_extra,
                                       std::mt19937& rng) {
  INFO("n=" << n << " k=" << k << " stride_extra=" << stride_extra);
  PackedWeight w(rng, n, k);
  const int panels = w.shape.panels, kblocks = w.shape.kblocks, tkb = transposed_kblocks(panels);
  const std::size_t used = static_cast<std::size_t>(tkb) * kBlockElements;
  const std::size_t stride = used + stride_extra;

  std::vector<bf16> wt(static_cast<std::size_t>(k) * n);  // Wᵀ[k][n]
  for (int h = 0; h < n; ++h)
    for (int col = 0; col < k; ++col) wt[static_cast<std::size_t>(col) * n + h] = w.at(h, col);
  const PackedShape ts = packed_shape(k, n);
  REQUIRE(ts.kblocks == tkb);
  std::vector<bf16> packed_t(packed_bf16_elements(k, n));
  pack_bf16_weights(wt.data(), k, n, static_cast<std::size_t>(n), packed_t.data());

  Guarded<bf16> dst(stride + used);  // panel 1 ends at the guard page
  std::vector<bf16> other(stride + used);
  for (int kb = 0; kb < kblocks; ++kb) {
    INFO("kb=" << kb);
    for (std::size_t e = 0; e < dst.size(); ++e) dst[e] = kBf16Sentinel;
    fn(w.packed.data(), panels, kblocks, kb, dst.data(), stride);
    std::ostringstream error;
    for (std::size_t e = used; e < stride && error.tellp() == 0; ++e) {
      if (dst[e] != kBf16Sentinel) error << "gap element " << e << " was written";
    }
    for (int q = 0; q < 2; ++q)
      for (int j = 0; j < tkb; ++j)
        for (int r = 0; r < 16; ++r)
          for (int c = 0; c < 16; ++c)
            for (int p = 0; p < 2; ++p) {
              const std::size_t e = static_cast<std::size_t>(j) * kBlockElements + r * 32 + c * 2 + p;
              const bf16 got = dst[q * stride + e];
              const int h = j * 32 + 2 * r + p, col = kb * 32 + q * 16 + c;
              if (error.tellp() == 0 && got != w.at(h, col)) {
                error << "panel " << q << " block " << j << " [" << r << "][" << c << "][" << p << "] = " << got
                      << ", W[" << h << "][" << col << "] = " << w.at(h, col);
              }
              const int tpanel = 2 * kb + q;  // absent when K's last k-block has one panel
              if (error.tellp() == 0 && tpanel < ts.panels &&
                  got != packed_t[static_cast<std::size_t>(tpanel) * tkb * kBlockElements + e]) {
                error << "differs from pack_bf16_weights(Wᵀ) in panel " << q << " at " << e;
              }
            }
    if (same_as != nullptr && error.tellp() == 0) {
      std::fill(other.begin(), other.end(), kBf16Sentinel);
      same_as(w.packed.data(), panels, kblocks, kb, other.data(), stride);
      for (std::size_t e = 0; e < other.size() && error.tellp() == 0; ++e) {
        if (other[e] != dst[e]) error << "differs from the reference kernel at " << e;
      }
    }
    INFO(error.str());
    REQUIRE(error.tellp() == 0);
  }
}

inline void check_pack_transposed_grid(PackTransposedFn fn, PackTransposedFn same_as) {
  std::mt19937 rng(31);
  const int extras[] = {0, 1, 64, 517};
  int which = 0;
  for (int n : {1, 15, 16, 17, 31, 32, 33, 48, 100, 176})
    for (int k : {1, 31, 32, 33, 64, 100, 176}) check_pack_transposed_case(fn, same_as, n, k, extras[which++ % 4], rng);
}

// C[m][K] = [A1 A2] · [W1; W2]: the transposed panels of two matrices stacked along the reduction
// in one buffer (as gate and up are), multiplied by the ordinary GEMM kernel.
inline void check_transposed_gemm_case(const BackwardKernels& kern, int m, int n1, int n2, int k, std::mt19937& rng) {
  INFO("m=" << m << " n1=" << n1 << " n2=" << n2 << " k=" << k);
  PackedWeight w1(rng, n1, k), w2(rng, n2, k);
  const int kblocks = w1.shape.kblocks;
  const int t1 = transposed_kblocks(w1.shape.panels), t2 = n2 > 0 ? transposed_kblocks(w2.shape.panels) : 0;
  const std::size_t stride = static_cast<std::size_t>(t1 + t2) * kBlockElements;
  const int out_panels = 2 * kblocks, red = (t1 + t2) * kBlockK;
  Guarded<bf16> wt(out_panels * stride);
  for (int kb = 0; kb < kblocks; ++kb) {
    bf16* dst = wt.data() + 2 * kb * stride;
    kern.pack_transposed(w1.packed.data(), w1.shape.panels, kblocks, kb, dst, stride);
    if (n2 > 0) kern.pack_transposed(w2.packed.data(), w2.shape.panels, kblocks, kb, dst + t1 * kBlockElements, stride);
  }
  // A row: A1 in [0, n1), A2 in [t1*32, t1*32 + n2), zeros elsewhere (the GEMM contract's padding).
  const std::size_t lda = red + 5;
  Guarded<bf16> a((m - 1) * lda + red);
  for (int i = 0; i < m; ++i)
    for (std::size_t h = 0; h < (i + 1 < m ? lda : static_cast<std::size_t>(red)); ++h) {
      const bool in1 = h < static_cast<std::size_t>(n1);
      const bool in2 = h >= static_cast<std::size_t>(t1 * kBlockK) && h < static_cast<std::size_t>(t1 * kBlockK + n2);
      a[i * lda + h] = in1 || in2 ? random_bf16(rng) : h < static_cast<std::size_t>(red) ? bf16{0} : kBf16Nan;
    }
  const std::size_t ldc = static_cast<std::size_t>(out_panels) * kPanelColumns;
  Guarded<float> c((m - 1) * ldc + ldc);
  GemmBf16Args args{};
  args.a = a.data();
  args.lda = lda;
  args.m = m;
  args.k_padded = red;
  args.packed_b = wt.data();
  args.panel_begin = 0;
  args.panel_end = out_panels;
  args.c = c.data();
  args.ldc = ldc;
  kern.gemm(args);
  std::ostringstream error;
  for (int i = 0; i < m && error.tellp() == 0; ++i)
    for (std::size_t col = 0; col < ldc && error.tellp() == 0; ++col) {
      double sum = 0, scale = 0;
      if (col < static_cast<std::size_t>(k)) {
        for (int h = 0; h < n1; ++h) {
          const double t = double(bf16_to_float(a[i * lda + h])) * bf16_to_float(w1.at(h, static_cast<int>(col)));
          sum += t, scale += std::fabs(t);
        }
        for (int h = 0; h < n2; ++h) {
          const double t = double(bf16_to_float(a[i * lda + t1 * kBlockK + h])) * bf16_to_float(w2.at(h, static_cast<int>(col)));
          sum += t, scale += std::fabs(t);
        }
      }
      const float got = c[i * ldc + col];
      if (!(std::fabs(got - sum) <= 1e-5 * scale)) error << "C[" << i << "][" << col << "] = " << got << ", reference " << sum;
    }
  INFO(error.str());
  REQUIRE(error.tellp() == 0);
}

inline void check_transposed_gemm(const BackwardKernels& kern) {
  std::mt19937 rng(47);
  struct Shape { int n1, n2, k; };
  for (const Shape s : {Shape{1, 0, 1}, {100, 0, 176}, {17, 33, 100}, {48, 15, 64}, {176, 100, 33}, {1, 1, 1}, {16, 32, 17}})
    for (int m : {1, 5, 17}) check_transposed_gemm_case(kern, m, s.n1, s.n2, s.k, rng);
}

// g (+)= the outer products, against a double reference: rows, n and rank tails, both layouts,
// padded strides. `also` (optional): a second kernel that must agree within the tolerance.
// overwrite: g's block starts as NaN, which must not be read (g = the sums); otherwise g += them.
// indexed: v's rows are read through a row index (some rows twice, some never), as the A
// gradients read the saved x by token.
inline void check_lora_grad_case(LoraGradOuterFn fn, LoraGradOuterFn also, int rows, int n, int rank, bool rank_major, bool overwrite,
                                 std::mt19937& rng, bool indexed = false) {
  INFO("rows=" << rows << " n=" << n << " rank=" << rank << " rank_major=" << rank_major << " overwrite=" << overwrite
                << " indexed=" << indexed);
  const std::size_t ldv = n + 3, ldu = rank + 2;
  const int g_rows = rank_major ? rank : n, g_cols = rank_major ? n : rank;
  const std::size_t ldg = g_cols + 5;
  const int v_count = indexed ? rows + 5 : rows;
  std::vector<int> index(static_cast<std::size_t>(rows));
  for (int i = 0; i < rows; ++i) index[static_cast<std::size_t>(i)] = indexed ? (i * 7 + 3) % v_count : i;
  Guarded<bf16> v((v_count - 1) * ldv + n);
  Guarded<float> u((rows - 1) * ldu + rank);
  const std::size_t g_count = (g_rows - 1) * ldg + g_cols;
  Guarded<float> g(g_count);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (std::size_t e = 0; e < v.size(); ++e) v[e] = e % ldv < static_cast<std::size_t>(n) ? random_bf16(rng) : kBf16Nan;
  for (std::size_t e = 0; e < u.size(); ++e) u[e] = e % ldu < static_cast<std::size_t>(rank) ? uniform(rng) : NAN;
  std::vector<float> g0(g_count);
  for (std::size_t e = 0; e < g_count; ++e)
    g[e] = g0[e] = e % ldg < static_cast<std::size_t>(g_cols) ? (overwrite ? NAN : uniform(rng)) : kPadding;
  std::vector<float> g_also(g0);
  const int* rows_of_v = indexed ? index.data() : nullptr;
  fn(v.data(), ldv, rows_of_v, u.data(), ldu, rows, n, rank, g.data(), ldg, rank_major, overwrite);
  if (also != nullptr) also(v.data(), ldv, rows_of_v, u.data(), ldu, rows, n, rank, g_also.data(), ldg, rank_major, overwrite);

  std::ostringstream error;
  for (std::size_t e = 0; e < g_count && error.tellp() == 0; ++e) {
    if (e % ldg >= static_cast<std::size_t>(g_cols)) {
      if (g[e] != kPadding) error << "g padding at " << e << " was written: " << g[e];
      continue;
    }
    const int row = static_cast<int>(e / ldg), col = static_cast<int>(e % ldg);
    const int q = rank_major ? row : col, o = rank_major ? col : row;
    double sum = overwrite ? 0.0 : g0[e], scale = std::fabs(sum);
    for (int i = 0; i < rows; ++i) {
      const double t = double(u[i * ldu + q]) * bf16_to_float(v[static_cast<std::size_t>(index[static_cast<std::size_t>(i)]) * ldv + o]);
      sum += t, scale += std::fabs(t);
    }
    if (!(std::fabs(g[e] - sum) <= 1e-5 * scale)) error << "g[" << q << "][" << o << "] = " << g[e] << ", reference " << sum;
    if (also != nullptr && !(std::fabs(g[e] - g_also[e]) <= 1e-5 * scale)) {
      error << "g[" << q << "][" << o << "] = " << g[e] << ", the other kernel " << g_also[e];
    }
  }
  INFO(error.str());
  REQUIRE(error.tellp() == 0);
}

inline void check_lora_grad_grid(LoraGradOuterFn fn, LoraGradOuterFn also) {
  std::mt19937 rng(59);
  // From 16 rows the AMX table's kernel runs on tiles: k-steps of 32 rows, passes of 64 columns.
  for (int rows : {1, 2, 3, 7, 16, 17, 31, 32, 33, 50, 97})
    for (int n : {1, 15, 16, 17, 33, 100})
      for (int rank : {1, 5, 8, 16, 17, 33, 64})
        for (bool rank_major : {true, false})
          for (bool overwrite : {false, true}) {
            check_lora_grad_case(fn, also, rows, n, rank, rank_major, overwrite, rng);
            if ((rows + n + rank) % 3 == 0) check_lora_grad_case(fn, also, rows, n, rank, rank_major, overwrite, rng, /*indexed=*/true);
          }
}

// A bf16 target gets float_to_bf16 of what an f32 target gets from the same start (bf16 values,
// so that both start alike): one rounding per element, after the add; padding untouched.
inline void check_lora_grad_bf16_target(LoraGradOuterFn fn) {
  std::mt19937 rng(61);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (int rows : {1, 3, 17})
    for (int n : {1, 17, 100})
      for (int rank : {1, 8, 17, 64})
        for (bool rank_major : {true, false})
          for (bool overwrite : {false, true}) {
            INFO("bf16 target rows=" << rows << " n=" << n << " rank=" << rank << " rank_major=" << rank_major << " overwrite=" << overwrite);
            const std::size_t ldv = n + 1, ldu = rank + 3;
            const int g_rows = rank_major ? rank : n, g_cols = rank_major ? n : rank;
            const std::size_t ldg = g_cols + 2, g_count = (g_rows - 1) * ldg + g_cols;
            std::vector<bf16> v(rows * ldv);
            std::vector<float> u(rows * ldu);
            for (auto& x : v) x = random_bf16(rng);
            for (auto& x : u) x = uniform(rng);
            std::vector<bf16> g16(g_count);
            std::vector<float> g32(g_count);
            for (std::size_t e = 0; e < g_count; ++e) {
              g16[e] = e % ldg < static_cast<std::size_t>(g_cols) ? float_to_bf16(uniform(rng)) : bf16{0x7777};
              g32[e] = bf16_to_float(g16[e]);
            }
            fn(v.data(), ldv, nullptr, u.data(), ldu, rows, n, rank, g32.data(), ldg, rank_major, overwrite);
            fn(v.data(), ldv, nullptr, u.data(), ldu, rows, n, rank, g16.data(), ldg, rank_major, overwrite);
            for (std::size_t e = 0; e < g_count; ++e) {
              INFO("element " << e);
              REQUIRE(g16[e] == (e % ldg < static_cast<std::size_t>(g_cols) ? float_to_bf16(g32[e]) : bf16{0x7777}));
            }
          }
}

// A NaN in v poisons its column o, a NaN in u its q; nothing else. Empty sizes change nothing, also
// when overwriting.
inline void check_lora_grad_nan_and_empty(LoraGradOuterFn fn, int rows = 3) {
  const int n = 40, rank = 12;
  std::vector<bf16> v(rows * n, float_to_bf16(0.5f));
  std::vector<float> u(rows * rank, 0.0f);  // zero multipliers must not hide the NaN
  v[1 * n + 37] = kBf16Nan;
  u[2 * rank + 3] = NAN;
  for (bool rank_major : {true, false})
  for (bool overwrite : {false, true}) {
    INFO("rank_major=" << rank_major << " overwrite=" << overwrite);
    std::vector<float> g(n * rank, 1.0f);
    fn(v.data(), n, nullptr, u.data(), rank, rows, n, rank, g.data(), rank_major ? n : rank, rank_major, overwrite);
    for (int q = 0; q < rank; ++q)
      for (int o = 0; o < n; ++o) {
        const float got = rank_major ? g[q * n + o] : g[o * rank + q];
        INFO("q=" << q << " o=" << o << " g=" << got);
        CHECK(std::isnan(got) == (q == 3 || o == 37));
      }
    std::vector<float> untouched(n * rank, 2.0f);
    fn(v.data(), n, nullptr, u.data(), rank, 0, n, rank, untouched.data(), rank_major ? n : rank, rank_major, overwrite);
    fn(v.data(), n, nullptr, u.data(), rank, rows, n, 0, untouched.data(), rank_major ? n : rank, rank_major, overwrite);
    fn(v.data(), n, nullptr, u.data(), rank, rows, 0, rank, untouched.data(), rank_major ? n : rank, rank_major, overwrite);
    CHECK(untouched == std::vector<float>(n * rank, 2.0f));
  }
}

// The whole body for one ISA's kernels; `reference` (nullable) is another ISA's, to agree with.
inline void check_backward_kernels(const BackwardKernels& kern, const BackwardKernels* reference) {
  SECTION("pack_transposed grid") {
    check_pack_transposed_grid(kern.pack_transposed, reference ? reference->pack_transposed : nullptr);
  }
  SECTION("pack_transposed through the GEMM") { check_transposed_gemm(kern); }
  SECTION("lora_grad_outer grid") { check_lora_grad_grid(kern.lora_grad_outer, reference ? reference->lora_grad_outer : nullptr); }
  SECTION("lora_grad_outer NaN and empty sizes") { check_lora_grad_nan_and_empty(kern.lora_grad_outer); }
  SECTION("lora_grad_outer into bf16") { check_lora_grad_bf16_target(kern.lora_grad_outer); }
}

}  // namespace tilemoe::kernels::test
