#pragma once
// One body of kernel tests, run by each ISA's test executable: a sweep of GEMM shapes against a
// double-precision reference over the unpacked weights, and silu_mul against std::exp.
//
// Every buffer a kernel gets ends exactly at a PROT_NONE guard page (unless a case asks for a
// misaligned start), so a read or write past the last row of A, C or the packed weights faults
// on every ISA, including AMX tile loads that sanitizers cannot see. Output padding and
// un-requested columns carry sentinels that must survive.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "amx/kernel_table.hpp"
#include "amx/pack_bf16.hpp"
#include "catch.hpp"
#include "lora_rows_grid.hpp"

namespace tilemoe::kernels::test {

inline GemmBf16Fn raw_gemm(Isa isa) {
  switch (isa) {
    case Isa::portable: return gemm_bf16_portable;
    case Isa::avx2: return gemm_bf16_avx2;
    case Isa::avx512_bf16: return gemm_bf16_avx512;
    case Isa::amx_bf16: return gemm_bf16_amx;
  }
  return nullptr;
}

// `count` elements of T whose end sits `slack` elements before an inaccessible page.
template <typename T>
class Guarded {
 public:
  explicit Guarded(std::size_t count, std::size_t slack = 0) : count_(count) {
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    const std::size_t bytes = (count + slack) * sizeof(T);
    len_ = (bytes + page - 1) / page * page + page;
    base_ = mmap(nullptr, len_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(base_ != MAP_FAILED);
    char* guard = static_cast<char*>(base_) + len_ - page;
    REQUIRE(mprotect(guard, page, PROT_NONE) == 0);
    data_ = reinterpret_cast<T*>(guard - bytes);
  }
  Guarded(const Guarded&) = delete;
  Guarded& operator=(const Guarded&) = delete;
  ~Guarded() { munmap(base_, len_); }
  T* data() { return data_; }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }
  std::size_t size() const { return count_; }

 private:
  std::size_t count_, len_ = 0;
  void* base_ = nullptr;
  T* data_ = nullptr;
};

// Elements of slack that make a buffer of `count` T start `offset` bytes past a 64-byte line.
template <typename T>
std::size_t slack_for_offset(std::size_t count, std::size_t offset) {
  const std::size_t line = 64 / sizeof(T), want = (line - offset / sizeof(T)) % line;
  return (want + line - count % line) % line;
}

inline bf16 random_bf16(std::mt19937& rng) {
  return float_to_bf16(std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng));
}

struct GemmCase {
  int m, n, k;
  int k2 = 0;  // 0: no second product
  bool accumulate = false;
  int panel_begin = 0, panel_end = -1;  // -1: all panels
  int lda_extra = 0, ldc_extra = 0;
  bool misaligned = false;  // A, A2 and C start off a 64-byte line (A by one bf16)
  bool tiles = false;       // A given in tile order (pack_rows_as_tiles); lda then unused
  bool compact2 = false;    // the second product's W2 in the short panel form (compact_packed_panels)

  std::string describe() const {
    std::ostringstream s;
    s << "m=" << m << " n=" << n << " k=" << k << " k2=" << k2 << " accumulate=" << accumulate << " panels=["
      << panel_begin << "," << panel_end << ") lda+=" << lda_extra << " ldc+=" << ldc_extra
      << " misaligned=" << misaligned << " tiles=" << tiles << " compact2=" << compact2;
    return s.str();
  }
};

// One operand: W[n][k] unpacked and packed, A[m][k] at stride lda with the contract's padding.
struct Operand {
  int k, k_padded;
  std::size_t lda;
  std::vector<bf16> w;
  Guarded<bf16> packed;
  Guarded<bf16> a;

  Operand(std::mt19937& rng, int m, int n, int k_, int lda_extra, bool misaligned)
      : k(k_),
        k_padded(packed_shape(n, k_).k_padded),
        lda(static_cast<std::size_t>(k_padded + lda_extra)),
        w(static_cast<std::size_t>(n) * k_),
        packed(packed_bf16_elements(n, k_)),
        a(a_count(m), misaligned ? slack_for_offset<bf16>(a_count(m), 2) : 0) {
    for (bf16& v : w) v = random_bf16(rng);
    pack_bf16_weights(w.data(), n, k, static_cast<std::size_t>(k), packed.data());
    for (int i = 0; i < m; ++i) {
      for (std::size_t q = 0; q < (i + 1 < m ? lda : static_cast<std::size_t>(k_padded)); ++q) {
        // Contract: zeros in [k, k_padded); anything at all (here NaN) beyond k_padded.
        a[i * lda + q] = q < static_cast<std::size_t>(k) ? random_bf16(rng)
                         : q < static_cast<std::size_t>(k_padded) ? bf16{0}
                                                                  : bf16{0x7fc0};
      }
    }
  }
  std::size_t a_count(int m) const { return (m - 1) * lda + k_padded; }
};

inline constexpr float kUnwritten = 12345.0f;  // target elements before a non-accumulating call
inline constexpr float kPadding = -777.0f;     // C elements the kernel must not touch

inline void check_gemm_case(GemmBf16Fn gemm, const GemmCase& tc, std::mt19937& rng) {
  INFO(tc.describe());
  const PackedShape shape = packed_shape(tc.n, tc.k);
  const int pb = tc.panel_begin, pe = tc.panel_end < 0 ? shape.panels : tc.panel_end;
  const int cols = (pe - pb) * kPanelColumns;
  const std::size_t ldc = static_cast<std::size_t>(cols + tc.ldc_extra);

  Operand x(rng, tc.m, tc.n, tc.k, tc.lda_extra, tc.misaligned);
  std::vector<Operand*> ops{&x};
  std::unique_ptr<Operand> x2;
  if (tc.k2 > 0) {
    x2 = std::make_unique<Operand>(rng, tc.m, tc.n, tc.k2, tc.lda_extra + 3, tc.misaligned);
    ops.push_back(x2.get());
  }
  const std::size_t c_count = (tc.m - 1) * ldc + cols;
  Guarded<float> c(c_count, tc.misaligned ? slack_for_offset<float>(c_count, 4) : 0);
  std::vector<float> c0(c_count);
  for (std::size_t i = 0; i < c_count; ++i) {
    const bool target = i % ldc < static_cast<std::size_t>(cols);
    c0[i] = !target ? kPadding : tc.accumulate ? std::uniform_real_distribution<float>(-1, 1)(rng) : kUnwritten;
    c[i] = c0[i];
  }

  GemmBf16Args args{};
  args.a = x.a.data();
  args.lda = x.lda;
  // Tile order: the buffer ends where the last row's last k-block ends, so a read of a row >= m
  // in the last row tile's last block faults; the other unused rows hold NaN, which would reach C.
  const std::size_t tiled_count =
      x.k_padded == 0 ? 0 : tiled_rows_elements(tc.m, x.k_padded) - static_cast<std::size_t>((kATileRows - tc.m % kATileRows) % kATileRows) * kBlockK;
  Guarded<bf16> a_tiled(tc.tiles ? tiled_count : 0);
  if (tc.tiles) {
    std::fill(a_tiled.data(), a_tiled.data() + tiled_count, bf16{0x7fc0});
    pack_rows_as_tiles(x.a.data(), x.lda, tc.m, x.k_padded, a_tiled.data());
    args.a = a_tiled.data();
    args.lda = 0;
    args.a_tiles = true;
  }
  args.m = tc.m;
  args.k_padded = x.k_padded;
  args.packed_b = x.packed.data();
  args.panel_begin = pb;
  args.panel_end = pe;
  // The short panel form ends where the last panel's last tile load ends: a longer read faults.
  Guarded<bf16> compact(x2 && tc.compact2 ? compact_packed_elements(tc.n, tc.k2) : 0);
  if (x2) {
    args.a2 = x2->a.data();
    args.lda2 = x2->lda;
    args.k2_padded = x2->k_padded;
    args.packed_b2 = x2->packed.data();
    if (tc.compact2) {
      compact_packed_panels(x2->packed.data(), tc.n, tc.k2, compact.data());
      args.packed_b2 = compact.data();
      args.b2_panel_stride = compact_panel_elements(tc.k2);
    }
  }
  args.c = c.data();
  args.ldc = ldc;
  args.accumulate = tc.accumulate;
  gemm(args);

  std::ostringstream error;  // the first wrong element, if any
  for (int i = 0; i < tc.m && error.tellp() == 0; ++i) {
    for (std::size_t j = 0; j < ldc && error.tellp() == 0; ++j) {
      const std::size_t at = i * ldc + j;
      if (at >= c_count) break;
      const float got = c[at];
      if (j >= static_cast<std::size_t>(cols)) {
        if (got != kPadding) error << "C[" << i << "][" << j << "] is padding but was written: " << got;
        continue;
      }
      const int col = pb * kPanelColumns + static_cast<int>(j);
      double sum = tc.accumulate ? c0[at] : 0.0, scale = 0.0;
      for (const Operand* op : ops) {
        if (col >= tc.n) break;
        for (int q = 0; q < op->k; ++q) {
          const double av = bf16_to_float(op->a[i * op->lda + q]);
          const double wv = bf16_to_float(op->w[static_cast<std::size_t>(col) * op->k + q]);
          sum += av * wv;
          scale += std::fabs(av * wv);
        }
      }
      const double tol = 1e-3 * scale + (tc.accumulate ? 1e-6 * std::fabs(c0[at]) : 0.0);
      if (!(std::fabs(got - sum) <= tol)) {
        error << "C[" << i << "][" << j << "] = " << got << ", reference " << sum << " (tolerance " << tol << ")";
      }
    }
  }
  INFO(error.str());
  REQUIRE(error.tellp() == 0);
}

// The full m × n × k grid once plainly and once with features drawn at random (second product,
// accumulate, panel sub-range, padded strides, misaligned starts), seeded so failures repeat.
inline void check_gemm_grid(GemmBf16Fn gemm) {
  // 33-128 rows run panel pairs outside on AMX (gemm_bf16_amx.cpp): 128 and 129 are that bound.
  static const int ms[] = {1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 32, 33, 47, 64, 100, 128, 129};
  static const int ns[] = {1, 15, 16, 17, 31, 33, 48, 100};
  static const int ks[] = {1, 15, 16, 17, 31, 32, 33, 63, 64, 100, 176, 200};
  static const int k2s[] = {0, 1, 8, 16, 33};
  static const int lda_extras[] = {0, 1, 7, 32, 33};
  static const int ldc_extras[] = {0, 1, 5, 16};
  std::mt19937 rng(20240611);
  auto pick = [&](auto& list) { return list[std::uniform_int_distribution<std::size_t>(0, std::size(list) - 1)(rng)]; };
  for (int m : ms) {
    for (int n : ns) {
      for (int k : ks) {
        check_gemm_case(gemm, GemmCase{m, n, k}, rng);
        GemmCase tc{m, n, k};
        tc.k2 = pick(k2s);
        tc.accumulate = rng() % 2 == 0;
        const int panels = packed_shape(n, k).panels;
        tc.panel_begin = static_cast<int>(rng() % panels);
        tc.panel_end = tc.panel_begin + 1 + static_cast<int>(rng() % (panels - tc.panel_begin));
        tc.lda_extra = pick(lda_extras);
        tc.ldc_extra = pick(ldc_extras);
        tc.misaligned = rng() % 2 == 0;
        tc.tiles = rng() % 2 == 0;
        tc.compact2 = rng() % 2 == 0;
        check_gemm_case(gemm, tc, rng);
      }
    }
  }
}

// Every second-product width and accumulate mode on shapes with both row tails, odd panel
// counts and sub-ranges that start past panel 0.
inline void check_gemm_features(GemmBf16Fn gemm) {
  std::mt19937 rng(7);
  for (int k2 : {1, 8, 16, 33}) {
    for (bool accumulate : {false, true}) {
      for (int m : {1, 5, 17, 33, 50}) {
        GemmCase tc{m, 100, 70};  // 7 panels
        tc.k2 = k2;
        tc.compact2 = (m + k2) % 2 == 0;  // each width both ways, over the row counts
        tc.accumulate = accumulate;
        tc.panel_begin = 2;
        tc.panel_end = 5;  // three panels: a pair and a single
        tc.lda_extra = 9;
        tc.ldc_extra = 3;
        tc.misaligned = true;
        check_gemm_case(gemm, tc, rng);
        tc.panel_begin = 1;
        tc.panel_end = 7;
        tc.misaligned = false;
        check_gemm_case(gemm, tc, rng);
        tc.tiles = true;
        check_gemm_case(gemm, tc, rng);
      }
    }
  }
}

// An empty first product (k = 0): C is still written (zeros, or the second product alone).
inline void check_gemm_empty_k(GemmBf16Fn gemm) {
  std::mt19937 rng(23);
  for (int m : {1, 5, 40}) {
    check_gemm_case(gemm, GemmCase{m, 20, 0}, rng);
    GemmCase tc{m, 33, 0};
    tc.k2 = 16;
    tc.accumulate = true;
    check_gemm_case(gemm, tc, rng);
  }
}

// K large enough that the kernels split the panels into several L2-sized groups; many rows.
inline void check_gemm_large(GemmBf16Fn gemm) {
  std::mt19937 rng(11);
  for (int m : {1, 7, 50, 100}) {
    GemmCase tc{m, 160, 4100};
    tc.k2 = 16;
    tc.accumulate = m % 2 == 0;
    tc.panel_begin = 1;
    tc.ldc_extra = 2;
    check_gemm_case(gemm, tc, rng);
    tc.tiles = true;
    tc.compact2 = true;
    check_gemm_case(gemm, tc, rng);
  }
  // Many 32-row blocks, then a row tail.
  GemmCase many{300, 100, 2000};
  many.k2 = 16;
  check_gemm_case(gemm, many, rng);
  many.tiles = true;
  many.accumulate = true;
  check_gemm_case(gemm, many, rng);
}

// A swiglu_limit's clamps in double, as torch.clamp (NaN stays NaN), and where its gradient passes
// (the input within the bounds, bounds included); limit 0: none.
inline double clamp_gate_ref(double g, double limit) { return limit > 0 && g > limit ? limit : g; }
inline double clamp_up_ref(double u, double limit) { return limit > 0 ? (u > limit ? limit : u < -limit ? -limit : u) : u; }
inline bool gate_grad_passes(double g, double limit) { return !(limit > 0) || g <= limit; }
inline bool up_grad_passes(double u, double limit) { return !(limit > 0) || (u <= limit && u >= -limit); }

// The forms the SwiGLU kernels are checked in: limits none and one that clamps many of the test
// values (gates in [-20, 20], ups in [-3, 3]), with values exactly at the bounds among the specials;
// the plain form, gpt-oss's alpha and up offset, and another general one.
inline constexpr SwigluForm kSwigluTestForms[] = {
    {0.0f, 1.0f, 0.0f}, {2.5f, 1.0f, 0.0f}, {0.0f, 1.702f, 1.0f}, {2.5f, 1.702f, 1.0f}, {0.0f, 0.75f, -0.5f}};
inline double swiglu_sigmoid_ref(double g, const SwigluForm& f) { return 1.0 / (1.0 + std::exp(-(f.alpha * g))); }

// h must equal the double reference rounded to bf16, give or take one bf16 step (f32 rounding
// can land either side of a tie), and both must be NaN together. Values that f32 exp
// overflows to -0 are compared with an absolute bound.
inline void check_silu_mul(SiluMulBf16Fn silu_mul, SwigluForm form) {
  const float limit = form.limit;
  INFO("swiglu_limit " << limit << " alpha " << form.alpha << " up_offset " << form.up_offset);
  std::mt19937 rng(5);
  std::vector<float> specials = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-40f, -1e-40f, 88.0f, -88.0f, 89.0f,
                                 -89.0f, -90.0f, 100.0f, -100.0f, 1e30f, -1e30f, 3.0e38f, -3.0e38f, 0.5f, -0.5f,
                                 2.5f, -2.5f};
  const int m = 37, n = 75;  // odd sizes: vector tails
  const std::size_t ldg = n + 3, ldu = n + 1, ldh = n + 5;
  std::vector<float> g(m * ldg), u(m * ldu);
  std::vector<bf16> h(m * ldh, bf16{0x1234});
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = std::uniform_real_distribution<float>(-20, 20)(rng);
  for (std::size_t i = 0; i < u.size(); ++i) u[i] = std::uniform_real_distribution<float>(-3, 3)(rng);
  for (std::size_t s = 0; s < specials.size(); ++s) {
    g[s] = specials[s];                    // row 0: special gates, ordinary ups
    g[ldg + s] = 1.5f;                     // row 1: ordinary gate, special ups
    u[ldu + s] = specials[s];
    g[2 * ldg + s] = specials[s];          // row 2: both special
    u[2 * ldu + s] = specials[specials.size() - 1 - s];
  }
  silu_mul(g.data(), ldg, u.data(), ldu, m, n, h.data(), ldh, form);
  int near_misses = 0;
  for (int i = 0; i < m; ++i) {
    for (std::size_t j = 0; j < ldh; ++j) {
      const bf16 got = h[i * ldh + j];
      if (j >= static_cast<std::size_t>(n)) {
        REQUIRE(got == bf16{0x1234});
        continue;
      }
      const double gd = clamp_gate_ref(g[i * ldg + j], limit), ud = clamp_up_ref(u[i * ldu + j], limit) + form.up_offset;
      const double silu = gd == -INFINITY ? -0.0 : gd * swiglu_sigmoid_ref(gd, form);
      const float ref = static_cast<float>(silu * ud);
      INFO("g=" << gd << " u=" << ud << " got=" << bf16_to_float(got) << " ref=" << ref);
      if (std::isnan(ref)) {
        REQUIRE(std::isnan(bf16_to_float(got)));
        continue;
      }
      if (got == float_to_bf16(ref)) continue;
      const double diff = std::fabs(bf16_to_float(got) - static_cast<double>(ref));
      const bool one_step = diff <= std::ldexp(std::fabs(ref), -7);
      REQUIRE((one_step || diff <= 1e-30));
      ++near_misses;
    }
  }
  // An exp good to ~1e-7 moves the bf16 result only when f32 lands next to a rounding tie.
  INFO("near misses: " << near_misses);
  REQUIRE(near_misses <= m * n / 100);
}

// silu_mul_backward against PyTorch's formulas in double (s = 1 / (1 + e^-g), dup = dh g s,
// dgate = dh u s (1 + g (1 - s)); in the general form s = sigmoid(alpha g), u + up_offset for u and
// alpha g for g in the last factor): each output the reference rounded to bf16, give or take one bf16
// step, or within 1e-30 of it (f32's e^-g overflows from g = -88.7, and AVX-512 rounds values
// below the f32 normal range to 0); NaN where the reference is NaN. h is the same ISA's forward
// silu_mul of g and u, bit for bit (a NaN as any NaN). Nothing past n is written, h == nullptr
// writes the same dgate and dup, and rows past kPrefetchRowsAhead run. With a limit, g and u are
// clamped in those formulas and a gradient is 0 where the clamp does not pass it (torch.clamp's).
inline void check_silu_mul_backward(SiluMulBackwardFn backward, SiluMulBf16Fn forward, SwigluForm form) {
  const float limit = form.limit;
  INFO("swiglu_limit " << limit << " alpha " << form.alpha << " up_offset " << form.up_offset);
  std::mt19937 rng(23);
  const std::vector<float> specials = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-40f, -1e-40f, 88.0f, -88.0f, -89.0f,
                                       -100.0f, 100.0f, 1e30f, -1e30f, 0.5f, -0.5f, -1.28125f, -1.2734375f, 2.5f, -2.5f};
  for (const auto& [m, n] : std::vector<std::pair<int, int>>{{37, 75}, {1, 5}, {kPrefetchRowsAhead, 16}, {6, 33}}) {
    INFO("m " << m << " n " << n);
    const std::size_t ldd = n + 2, ldgu = n + 3, ldo = n + 5, ldh = n + 7;
    std::vector<float> dh(m * ldd);
    std::vector<bf16> g(m * ldgu), u(m * ldgu);
    for (float& v : dh) v = std::uniform_real_distribution<float>(-3, 3)(rng);
    for (bf16& v : g) v = float_to_bf16(std::uniform_real_distribution<float>(-20, 20)(rng));
    for (bf16& v : u) v = float_to_bf16(std::uniform_real_distribution<float>(-3, 3)(rng));
    for (std::size_t k = 0; k < specials.size() && k < static_cast<std::size_t>(n); ++k) {
      g[k] = float_to_bf16(specials[k]);  // row 0: special gates
      if (m == 1) continue;
      u[ldgu + k] = float_to_bf16(specials[k]);  // row 1: special ups, and gradients in reverse order
      if (const std::size_t c = specials.size() - 1 - k; c < static_cast<std::size_t>(n)) dh[ldd + c] = specials[k];
    }
    const bf16 junk{0x1234};
    std::vector<bf16> dgate(m * ldo, junk), dup(m * ldo, junk), h(m * ldh, junk);
    backward(dh.data(), ldd, g.data(), u.data(), ldgu, m, n, dgate.data(), dup.data(), ldo, h.data(), ldh, form);
    // h: the forward's, from the same g and u in f32.
    std::vector<float> gf(m * ldgu), uf(m * ldgu);
    for (std::size_t i = 0; i < g.size(); ++i) gf[i] = bf16_to_float(g[i]), uf[i] = bf16_to_float(u[i]);
    std::vector<bf16> h_forward(m * ldh, junk);
    forward(gf.data(), ldgu, uf.data(), ldgu, m, n, h_forward.data(), ldh, form);
    int near_misses = 0;
    auto check = [&](bf16 got, double ref_d, const char* what) {
      const float ref = static_cast<float>(ref_d);
      INFO(what << " got=" << bf16_to_float(got) << " ref=" << ref);
      if (std::isnan(ref)) {
        REQUIRE(std::isnan(bf16_to_float(got)));
        return;
      }
      if (got == float_to_bf16(ref)) return;
      const double diff = std::fabs(bf16_to_float(got) - static_cast<double>(ref));
      if (diff <= 1e-30) return;  // f32's e^-g overflows near g = -89, and AVX-512's rounding
      REQUIRE(diff <= std::ldexp(std::fabs(ref), -7));
      ++near_misses;
    };
    for (int i = 0; i < m; ++i) {
      for (std::size_t j = 0; j < ldo; ++j) {
        const std::size_t o = i * ldo + j;
        if (j >= static_cast<std::size_t>(n)) {
          REQUIRE(dgate[o] == junk);
          REQUIRE(dup[o] == junk);
          continue;
        }
        const double g0 = bf16_to_float(g[i * ldgu + j]), u0 = bf16_to_float(u[i * ldgu + j]), d = dh[i * ldd + j];
        const double gd = clamp_gate_ref(g0, limit), ud = clamp_up_ref(u0, limit) + form.up_offset;
        const double s = swiglu_sigmoid_ref(gd, form);
        INFO("row " << i << " column " << j << " g=" << g0 << " u=" << u0 << " dh=" << d);
        check(dup[o], up_grad_passes(u0, limit) ? d * (gd * s) : 0.0, "dup");
        check(dgate[o], gate_grad_passes(g0, limit) ? d * ud * (s * (1.0 + form.alpha * gd * (1.0 - s))) : 0.0, "dgate");
      }
      for (std::size_t j = 0; j < ldh; ++j) {
        INFO("h row " << i << " column " << j << " got " << h[i * ldh + j] << " forward " << h_forward[i * ldh + j]);
        // NaN as NaN: which operand's sign a NaN product keeps is the compiler's choice of order.
        const bool both_nan = std::isnan(bf16_to_float(h[i * ldh + j])) && std::isnan(bf16_to_float(h_forward[i * ldh + j]));
        REQUIRE((both_nan || h[i * ldh + j] == h_forward[i * ldh + j]));
      }
    }
    INFO("near misses: " << near_misses);
    REQUIRE(near_misses <= 2 * m * n / 100 + 1);
    std::vector<bf16> dgate2(m * ldo, junk), dup2(m * ldo, junk);
    backward(dh.data(), ldd, g.data(), u.data(), ldgu, m, n, dgate2.data(), dup2.data(), ldo, nullptr, 0, form);
    // The same values, a NaN as any NaN (its sign is the compiler's choice of operand order).
    auto same = [](const std::vector<bf16>& a, const std::vector<bf16>& b) {
      for (std::size_t i = 0; i < a.size(); ++i)
        if (a[i] != b[i] && !(std::isnan(bf16_to_float(a[i])) && std::isnan(bf16_to_float(b[i])))) return false;
      return true;
    };
    REQUIRE(same(dgate2, dgate));
    REQUIRE(same(dup2, dup));
  }
}

// keep_clamp_sides: after bf16 rounding, every saved element lies on its f32 value's side of each
// bound (gate: limit; up: -limit and limit) as torch.clamp's gradient mask reads it; an element
// rounding did not carry across keeps its rounding; a moved one becomes the bound's bf16
// neighbour on that side; NaN never moves; nothing past n is written. Limits exact in bf16 and not,
// values packed around the bounds (within a few bf16 steps) and elsewhere.
inline void check_keep_clamp_sides(KeepClampSidesFn keep) {
  std::mt19937 rng(31);
  for (float limit : {2.5f, 0.3f, 10.0f, 1e-3f}) {
    for (bool two_sided : {false, true}) {
      INFO("limit " << limit << (two_sided ? " two-sided" : " gate"));
      const int m = 9, n = 77;
      const std::size_t ldv = n + 3, lds = n + 5;
      std::vector<float> v(m * ldv);
      for (float& x : v) {
        const float bound = std::uniform_int_distribution<int>(0, 1)(rng) ? limit : -limit;
        const int kind = std::uniform_int_distribution<int>(0, 9)(rng);
        x = kind < 7 ? bound * (1.0f + std::uniform_real_distribution<float>(-0.02f, 0.02f)(rng))
                     : std::uniform_real_distribution<float>(-4 * limit, 4 * limit)(rng);
      }
      const float specials[] = {NAN, INFINITY, -INFINITY, limit, -limit, std::nextafter(limit, 0.0f), std::nextafter(limit, INFINITY),
                                std::nextafter(-limit, 0.0f), std::nextafter(-limit, -INFINITY), 0.0f, -0.0f};
      for (std::size_t k = 0; k < std::size(specials); ++k) v[k] = specials[k];
      const bf16 junk{0x1234};
      std::vector<bf16> saved(m * lds, junk), rounded;
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) saved[i * lds + j] = float_to_bf16(v[i * ldv + j]);
      rounded = saved;
      keep(v.data(), ldv, m, n, saved.data(), lds, limit, two_sided);
      const ClampBoundBf16 b = clamp_bound_bf16(limit);
      REQUIRE(bf16_to_float(b.at_or_below) <= limit);
      REQUIRE(bf16_to_float(b.above) > limit);
      int moved = 0;
      for (int i = 0; i < m; ++i)
        for (std::size_t j = 0; j < lds; ++j) {
          const bf16 got = saved[i * lds + j], was = rounded[i * lds + j];
          if (j >= static_cast<std::size_t>(n)) {
            REQUIRE(got == junk);
            continue;
          }
          const float x = v[i * ldv + j], r = bf16_to_float(got), r0 = bf16_to_float(was);
          INFO("value " << x << " rounded " << r0 << " saved " << r);
          if (std::isnan(x)) {
            REQUIRE(got == was);
            continue;
          }
          REQUIRE((x > limit) == (r > limit));
          if (two_sided) REQUIRE((x < -limit) == (r < -limit));
          const bool crossed = (x > limit) != (r0 > limit) || (two_sided && (x < -limit) != (r0 < -limit));
          if (!crossed) {
            REQUIRE(got == was);
            continue;
          }
          ++moved;
          const bf16 sign = 0x8000;
          const bool neighbour = got == b.above || got == b.at_or_below || got == (b.above | sign) || got == (b.at_or_below | sign);
          REQUIRE(neighbour);
        }
      // Values this close to the bounds cross in rounding often enough that the moves are tested.
      REQUIRE(moved > 0);
    }
  }
}

// Bit-for-bit the scalar rounding of scale * x, specials included; nothing past n is written.
inline void check_convert_to_bf16(ConvertToBf16Fn convert) {
  std::mt19937 rng(9);
  const float specials[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-40f, -1e-40f, 3.0e38f, -3.0e38f, 1.00390625f, 1.01171875f};
  for (std::size_t n : {0u, 1u, 7u, 15u, 16u, 17u, 33u, 100u}) {
    for (float scale : {1.0f, 0.37f, -2.0f}) {
      std::vector<float> src(n);
      for (std::size_t i = 0; i < n; ++i)
        src[i] = i < std::size(specials) && i % 2 == 0 ? specials[i] : std::uniform_real_distribution<float>(-50, 50)(rng);
      Guarded<bf16> dst(n + 3);
      for (std::size_t i = 0; i < n + 3; ++i) dst[i] = bf16{0x1234};
      convert(src.data(), n, scale, dst.data());
      for (std::size_t i = 0; i < n + 3; ++i) {
        INFO("n " << n << " scale " << scale << " i " << i);
        REQUIRE(dst[i] == (i < n ? float_to_bf16(scale * src[i]) : bf16{0x1234}));
      }
    }
  }
}

// convert_rows_to_bf16 over strided rows (fewer and more rows than it asks for ahead): each row as
// convert would write it, and nothing between or after the rows' n values.
inline void check_convert_rows_to_bf16(ConvertToBf16Fn convert) {
  std::mt19937 rng(11);
  for (int rows : {0, 1, kPrefetchRowsAhead, kPrefetchRowsAhead + 1, 13}) {
    for (std::size_t n : {1u, 17u, 64u}) {
      const std::size_t lds = n + 5, ldd = n + 9;
      std::vector<float> src(static_cast<std::size_t>(rows) * lds + 1);
      for (float& v : src) v = std::uniform_real_distribution<float>(-8, 8)(rng);
      Guarded<bf16> dst(static_cast<std::size_t>(rows) * ldd + 3);
      for (std::size_t i = 0; i < dst.size(); ++i) dst[i] = bf16{0x1234};
      convert_rows_to_bf16(convert, src.data(), lds, rows, n, 0.5f, dst.data(), ldd);
      for (std::size_t i = 0; i < dst.size(); ++i) {
        const std::size_t r = i / ldd, c = i % ldd;
        INFO("rows " << rows << " n " << n << " at row " << r << " column " << c);
        const bool written = r < static_cast<std::size_t>(rows) && c < n;
        REQUIRE(dst[i] == (written ? float_to_bf16(0.5f * src[r * lds + c]) : bf16{0x1234}));
      }
    }
  }
}

// The sum of weighted bf16 rows against a double sum: every column up to width written (junk
// before), nothing after it, the rows taken in order with their own weights (or 1 each); NaN and
// Inf in a row reach that column of out.
inline void check_combine_bf16_rows(CombineBf16RowsFn combine) {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal;
  for (std::size_t width : {0u, 1u, 15u, 16u, 17u, 63u, 64u, 65u, 100u, 2053u}) {
    for (int count : {0, 1, 2, 6, 9}) {
      for (bool weighted : {true, false}) {
        INFO("width " << width << " rows " << count << (weighted ? " weighted" : " unweighted"));
        std::vector<std::vector<bf16>> data(static_cast<std::size_t>(count));
        std::vector<const bf16*> rows;
        std::vector<float> w;
        for (auto& r : data) {
          for (std::size_t c = 0; c < width; ++c) r.push_back(float_to_bf16(normal(rng)));
          rows.push_back(r.data());
          w.push_back(std::uniform_real_distribution<float>(-1.5f, 1.5f)(rng));
        }
        Guarded<float> out(width + 5);
        for (std::size_t c = 0; c < width + 5; ++c) out[c] = 123.0f;
        combine(rows.data(), weighted ? w.data() : nullptr, count, width, out.data());
        for (std::size_t c = 0; c < width; ++c) {
          double ref = 0, mag = 0;
          for (int j = 0; j < count; ++j) {
            const double t = (weighted ? w[static_cast<std::size_t>(j)] : 1.0) * bf16_to_float(data[static_cast<std::size_t>(j)][c]);
            ref += t;
            mag += std::fabs(t);
          }
          INFO("column " << c);
          REQUIRE(std::fabs(out[c] - ref) <= 1e-6 * mag + 1e-30);
        }
        for (std::size_t c = width; c < width + 5; ++c) REQUIRE(out[c] == 123.0f);
      }
    }
  }
  // Specials: NaN and Inf in one row, in a full block and in the tail.
  const std::size_t width = 70;
  std::vector<bf16> a(width, float_to_bf16(1.0f)), b(width, float_to_bf16(2.0f));
  a[5] = float_to_bf16(NAN);
  b[66] = float_to_bf16(INFINITY);
  a[40] = float_to_bf16(-INFINITY);
  const bf16* rows[] = {a.data(), b.data()};
  const float w[] = {0.5f, 0.25f};
  std::vector<float> out(width);
  combine(rows, w, 2, width, out.data());
  CHECK(std::isnan(out[5]));
  CHECK(out[66] == INFINITY);
  CHECK(out[40] == -INFINITY);
  CHECK(out[0] == 1.0f);
  CHECK(out[69] == 1.0f);
}

// The whole body for one ISA: the raw kernel over every shape, the table's entries, silu_mul.
inline void check_kernels(Isa isa) {
  const KernelTable& table = kernel_table(isa);
  REQUIRE(table.isa == isa);
  SECTION("gemm grid") { check_gemm_grid(raw_gemm(isa)); }
  SECTION("gemm features") { check_gemm_features(raw_gemm(isa)); }
  SECTION("gemm large k") { check_gemm_large(raw_gemm(isa)); }
  SECTION("gemm empty k") { check_gemm_empty_k(raw_gemm(isa)); }
  SECTION("table gemm") {
    check_gemm_features(table.gemm_bf16);
    check_gemm_large(table.gemm_bf16);
  }
  SECTION("silu_mul") {
    for (const SwigluForm& form : kSwigluTestForms) check_silu_mul(table.silu_mul_bf16, form);
  }
  SECTION("keep_clamp_sides") { check_keep_clamp_sides(table.keep_clamp_sides); }
  SECTION("silu_mul_backward") {
    for (const SwigluForm& form : kSwigluTestForms) check_silu_mul_backward(table.silu_mul_backward, table.silu_mul_bf16, form);
  }
  SECTION("convert_to_bf16") {
    check_convert_to_bf16(table.convert_to_bf16);
    check_convert_rows_to_bf16(table.convert_to_bf16);
  }
  SECTION("combine_bf16_rows") { check_combine_bf16_rows(table.combine_bf16_rows); }
  SECTION("lora rows") { check_lora_rows(table.lora_project_rows, table.lora_expand_rows_add); }
}

}  // namespace tilemoe::kernels::test
