// tilemoe_decode_kernel_probe: the decode kernels' own rate, one token (m = 1), per thread, with
// the weights in L2 (what the kernel's instructions allow) and streamed from memory (what the
// machine's bandwidth leaves), for bf16 (gemm_bf16_avx512) and MXFP4 (gemm_mxfp4_rows_avx512).
// Its use: telling a decode that is short of bandwidth from one whose instructions cannot keep up
// (docs/perf.md, session 57). The bench, not this, decides what the kernels keep.
//
// Each of T threads (pinned to CPU i) owns its weights and runs passes over them in items of 4
// panels, as the forward's decode items; rounds alternate the kernels. Printed per case: the
// median over rounds of the median thread's GB/s (weight bytes read) and of the sum over threads.
//
// The "pattern" cases read the MXFP4 memory cases' codes as the bench's bandwidth probe does (four
// streams, one word a line, 8 lines ahead), in items of 4, 8 or 16 panels or of 1 MiB: what the
// memory gives to a kernel of no work on the same bytes in the same items.
//
// Usage: tilemoe_decode_kernel_probe [--threads T] [--rounds R] [--k K] [--only NAME_PREFIX]
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "amx/aligned_vector.hpp"
#include "amx/gemm_bf16.hpp"
#include "amx/gemm_mxfp4.hpp"
#include "amx/isa.hpp"
#include "amx/immintrin_gcc12.hpp"
#include "amx/mxfp4_lookup_avx512.hpp"

namespace {

using namespace tilemoe;
using namespace tilemoe::kernels;

struct Weights {
  int panels = 0;
  AlignedVector<bf16> bf16_packed;
  PackedMxfp4Shape shape{};
  AlignedVector<std::uint8_t> codes, exponents;
};

Weights make_weights(int panels, int k, bool mxfp4, std::uint32_t seed) {
  Weights w;
  w.panels = panels;
  std::mt19937 rng(seed);
  if (mxfp4) {
    w.shape = packed_mxfp4_shape(panels * kPanelColumns, k);
    w.codes.resize(w.shape.code_bytes());
    w.exponents.resize(w.shape.exponent_bytes());
    for (auto& c : w.codes) c = static_cast<std::uint8_t>(rng());
    for (auto& e : w.exponents) e = static_cast<std::uint8_t>(120 + rng() % 8);
  } else {
    w.bf16_packed.resize(packed_bf16_elements(panels * kPanelColumns, k));
    std::uniform_real_distribution<float> d(-1.f, 1.f);
    for (auto& v : w.bf16_packed) v = float_to_bf16(d(rng));
  }
  return w;
}


// Variants of the MXFP4 rows kernel for one row (timing only; their sums are not the product):
// 0 the kernel's instructions with one sum a panel (no block scales), 1 no lookups (the shifted line multiplied as it is), 2 no shifts (every row looked up from the
// unshifted line), 3 a W4A8 form (VPSHUFB to int8 values, VPDPBUSD with int8 activations), 5 the lookups
// and their stores into an L1 buffer alone (no products).
template <int V>
__attribute__((noinline)) void mxfp4_variant(const PackedMxfp4Shape& s, const PackedMxfp4View& w, const bf16* a, int panel, float* c) {
  constexpr int P = 4;
  const Mxfp4LineLookup d;
  const __m512i tbl8 = _mm512_set1_epi64(0x0c0806040302010all);
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  __m512 acc[P];
  __m512i iacc[P];
  for (int p = 0; p < P; ++p) acc[p] = _mm512_setzero_ps(), iacc[p] = _mm512_setzero_si512();
  const std::size_t code_stride = static_cast<std::size_t>(s.kblocks) * kMxfp4BlockCodeBytes;
  const std::uint8_t* codes0 = w.codes + static_cast<std::size_t>(panel) * code_stride;
  for (int kb = 0; kb < s.kblocks; ++kb) {
    const std::uint8_t* codes = codes0 + static_cast<std::size_t>(kb) * kMxfp4BlockCodeBytes;
    const bf16* ak = a + static_cast<std::size_t>(kb) * kBlockK;
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      __m512i line[P];
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) {
        const std::uint8_t* line_at = codes + p * code_stride + j * 64;
        _mm_prefetch(reinterpret_cast<const char*>(line_at + 2 * kMxfp4BlockCodeBytes), _MM_HINT_T0);
        line[p] = _mm512_loadu_si512(line_at);
      }
      if constexpr (V == 5) {
        // The dequantization alone, into a 1 KiB buffer in L1 (what an AMX form would do before
        // its tile load).
        alignas(64) static thread_local std::uint16_t tile[P][16 * 32];
#pragma GCC unroll 4
        for (int p = 0; p < P; ++p)
#pragma GCC unroll 4
          for (int t = 0; t < 4; ++t) _mm512_store_si512(tile[p] + (4 * j + t) * 32, d.row(line[p], t));
        if (j == 3) {
          for (int p = 0; p < P; ++p) acc[p] = _mm512_add_ps(acc[p], _mm512_load_ps(reinterpret_cast<const float*>(tile[p]) + kb % 16 * 16));
        }
      } else if constexpr (V == 3) {
        std::int32_t v0, v1;
        std::memcpy(&v0, ak + 8 * j, 4);
        std::memcpy(&v1, ak + 8 * j + 2, 4);
        const __m512i x0 = _mm512_set1_epi32(v0), x1 = _mm512_set1_epi32(v1);
#pragma GCC unroll 4
        for (int p = 0; p < P; ++p) {
          const __m512i lo = _mm512_shuffle_epi8(tbl8, _mm512_and_si512(line[p], low4));
          const __m512i hi = _mm512_shuffle_epi8(tbl8, _mm512_and_si512(_mm512_srli_epi16(line[p], 4), low4));
          iacc[p] = _mm512_dpbusd_epi32(iacc[p], x0, lo);
          iacc[p] = _mm512_dpbusd_epi32(iacc[p], x1, hi);
        }
      } else {
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) {
          std::int32_t v;
          std::memcpy(&v, ak + 8 * j + 2 * t, 4);
          const __m512bh x = (__m512bh)_mm512_set1_epi32(v);
#pragma GCC unroll 4
          for (int p = 0; p < P; ++p) {
            __m512i row;
            if constexpr (V == 1) row = t == 0 ? line[p] : _mm512_srli_epi16(line[p], 4 * t);
            else if constexpr (V == 2) row = _mm512_permutexvar_epi16(line[p], d.table);
            else row = d.row(line[p], t);
            acc[p] = _mm512_dpbf16_ps(acc[p], x, (__m512bh)row);
          }
        }
      }
    }
  }
  for (int p = 0; p < P; ++p)
    _mm512_storeu_ps(c + p * kPanelColumns, _mm512_add_ps(acc[p], _mm512_cvtepi32_ps(iacc[p])));
}

double weight_bytes(const Weights& w, int k, int variant) {
  if (variant >= 10) return static_cast<double>(w.codes.size());
  if (!w.codes.empty()) return static_cast<double>(w.codes.size() + w.exponents.size());
  return static_cast<double>(w.panels) * kPanelColumns * k * 2.0;
}

// The bandwidth probe's read pattern (numa/bandwidth_probe.cpp: four streams, one word a line
// read, each stream's line 8 lines on asked for) over the MXFP4 codes of items of `panels` panels,
// each stream covering panels / 4 consecutive panels; panels == 0: items of 1 MiB, as the probe.
std::uint64_t read_pattern(const Weights& w, int panels) {
  constexpr std::size_t kLine = 64, kAhead = 8 * kLine;
  const std::size_t panel_bytes = w.shape.code_bytes() / static_cast<std::size_t>(w.panels);
  const std::size_t item = panels == 0 ? std::size_t(1) << 20 : panel_bytes * static_cast<std::size_t>(panels);
  const std::size_t quarter = item / 4;
  std::uint64_t sink[4] = {};
  for (std::size_t at = 0; at + item <= w.codes.size(); at += item) {
    const std::uint8_t* base = w.codes.data() + at;
    for (std::size_t j = 0; j < quarter; j += kLine)
      for (std::size_t s = 0; s < 4; ++s) {
        const std::uint8_t* q = base + s * quarter + j;
        if (j + kAhead < quarter) _mm_prefetch(reinterpret_cast<const char*>(q + kAhead), _MM_HINT_T0);
        std::uint64_t v;
        std::memcpy(&v, q, sizeof v);
        sink[s] ^= v;
      }
  }
  return sink[0] ^ sink[1] ^ sink[2] ^ sink[3];
}

// One pass over w in items of 4 panels.
void pass(const Weights& w, int k_padded, const bf16* x, float* c, int variant) {
  if (variant >= 10) {
    c[0] += static_cast<float>(read_pattern(w, variant == 13 ? 0 : 4 << (variant - 10)) & 1);
    return;
  }
  for (int p0 = 0; p0 < w.panels; p0 += 4) {
    if (variant != 0) {
      const PackedMxfp4View v{w.codes.data(), w.exponents.data()};
      if (variant == 4) mxfp4_variant<0>(w.shape, v, x, p0, c);
      else if (variant == 1) mxfp4_variant<1>(w.shape, v, x, p0, c);
      else if (variant == 5) mxfp4_variant<5>(w.shape, v, x, p0, c);
      else if (variant == 2) mxfp4_variant<2>(w.shape, v, x, p0, c);
      else mxfp4_variant<3>(w.shape, v, x, p0, c);
      continue;
    }
    GemmBf16Args g{};
    g.a = x;
    g.lda = static_cast<std::size_t>(k_padded);
    g.m = 1;
    g.k_padded = k_padded;
    g.panel_begin = p0;
    g.panel_end = std::min(p0 + 4, w.panels);
    g.c = c;
    g.ldc = 4 * kPanelColumns;
    if (w.codes.empty()) {
      g.packed_b = w.bf16_packed.data();
      gemm_bf16_avx512(g);
    } else {
      gemm_mxfp4_rows_avx512(g, w.shape, {w.codes.data(), w.exponents.data()});
    }
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  int rounds = 9;
  int k = 2880;
  std::string only;  // cases whose name starts with it
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--threads") threads = std::atoi(argv[i + 1]);
    else if (a == "--rounds") rounds = std::atoi(argv[i + 1]);
    else if (a == "--k") k = std::atoi(argv[i + 1]);
    else if (a == "--only") only = argv[i + 1];
  }
  auto selected = [&](const char* name) { return only.empty() || std::strncmp(name, only.c_str(), only.size()) == 0; };
  if (!isa_available(Isa::avx512_bf16)) {
    std::printf("SKIPPED: no AVX512-BF16\n");
    return 0;
  }
  const int k_padded = (k + kBlockK - 1) / kBlockK * kBlockK;
  // L2: about 0.7 MiB of bf16 (0.2 of MXFP4); memory: 96 MiB of either a thread.
  const int l2_panels = 8;
  const int mem_panels_bf16 = static_cast<int>((96u << 20) / (static_cast<std::size_t>(k_padded) * 32));
  const int mem_panels_mxfp4 = mem_panels_bf16 * 32 / 17 / 4 * 4;
  struct Case {
    const char* name;
    bool mxfp4;
    int panels;
    int passes;
    int variant = 0;
  };
  const Case cases[] = {{"bf16 L2", false, l2_panels, 400},
                        {"mxfp4 L2", true, l2_panels, 1600},
                        {"mxfp4 L2 v0", true, l2_panels, 1600, 4},
                        {"mxfp4 L2 v1", true, l2_panels, 1600, 1},
                        {"mxfp4 L2 v2", true, l2_panels, 1600, 2},
                        {"mxfp4 L2 v3", true, l2_panels, 1600, 3},
                        {"mxfp4 L2 v5", true, l2_panels, 1600, 5},
                        {"bf16 memory", false, mem_panels_bf16, 2},
                        {"mxfp4 memory", true, mem_panels_mxfp4, 2},
                        {"pattern 4 pan", true, mem_panels_mxfp4, 2, 10},
                        {"pattern 8 pan", true, mem_panels_mxfp4, 2, 11},
                        {"pattern 16 pan", true, mem_panels_mxfp4, 2, 12},
                        {"pattern 1 MiB", true, mem_panels_mxfp4, 2, 13},
                        // again: an instance's rate drifts within a run
                        {"mxfp4 memory", true, mem_panels_mxfp4, 2},
                        {"bf16 memory", false, mem_panels_bf16, 2}};
  std::vector<std::vector<Weights>> weights(std::size(cases));
  for (std::size_t c = 0; c < std::size(cases); ++c)
    for (int t = 0; t < threads && selected(cases[c].name); ++t) weights[c].push_back(make_weights(cases[c].panels, k, cases[c].mxfp4, 17 * t + c));
  std::vector<bf16> x(k_padded);
  for (int i = 0; i < k_padded; ++i) x[i] = float_to_bf16(i < k ? 0.01f * (i % 13) : 0.f);

  std::printf("threads %d, K %d; GB/s of weights read, median over %d rounds\n", threads, k, rounds);
  std::printf("%-14s %12s %12s %12s\n", "case", "median thr", "min thr", "sum");
  for (std::size_t c = 0; c < std::size(cases); ++c) {
    if (!selected(cases[c].name)) continue;
    std::vector<double> med, mins, sums;
    for (int r = 0; r < rounds; ++r) {
      std::vector<double> rate(threads);
      std::atomic<int> ready{0};
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t)
        pool.emplace_back([&, t] {
          cpu_set_t set;
          CPU_ZERO(&set);
          CPU_SET(t, &set);
          sched_setaffinity(0, sizeof set, &set);
          std::vector<float> out(4 * kPanelColumns);
          const Weights& w = weights[c][t];
          pass(w, k_padded, x.data(), out.data(), cases[c].variant);  // warm (L2) / first touch done at fill
          ready.fetch_add(1);
          while (ready.load() < threads) {
          }
          const auto t0 = std::chrono::steady_clock::now();
          for (int i = 0; i < cases[c].passes; ++i) pass(w, k_padded, x.data(), out.data(), cases[c].variant);
          const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          rate[t] = weight_bytes(w, k, cases[c].variant) * cases[c].passes / s / 1e9;
        });
      for (auto& th : pool) th.join();
      double sum = 0;
      for (double v : rate) sum += v;
      med.push_back(median(rate));
      mins.push_back(*std::min_element(rate.begin(), rate.end()));
      sums.push_back(sum);
    }
    std::printf("%-14s %12.2f %12.2f %12.1f\n", cases[c].name, median(med), median(mins), median(sums));
  }
  return 0;
}
