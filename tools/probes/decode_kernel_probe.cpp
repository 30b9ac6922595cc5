// tilemoe_decode_kernel_probe: the decode kernels' own rate, one token (m = 1), per thread, with
// the weights in L2 (what the kernel's instructions allow) and streamed from memory (what the
// machine's bandwidth leaves), for bf16 (gemm_bf16_avx512) and MXFP4 (gemm_mxfp4_rows_avx512).
// Its use: telling a decode that is short of bandwidth from one whose instructions cannot keep up
// (docs/perf.md, session 57). The bench, not this, decides what the kernels keep.
//
// Each of T threads (pinned to CPU i) owns its weights and runs passes over them in items of 4
// panels, as the forward's decode items; each case runs its rounds before the next case. Printed
// per case: the median over rounds of the median thread's GB/s (weight bytes read) and of the sum
// over threads.
//
// The "pattern" cases read the MXFP4 memory cases' codes as the bench's bandwidth probe does (four
// streams, one word a line, 8 lines ahead), in items of 4, 8 or 16 panels or of 1 MiB: what the
// memory gives to a kernel of no work on the same bytes in the same items.
//
// --bf16-decode: instead, variants of the bf16 decode kernel's loop (prefetch distances, no
// products, two accumulators a panel) and the pattern over one shared set of bf16 weights, the
// cases taking turns round by round (session 69). --decode-calls: instead, the forward's calls of
// one token (104 MB of weights) with the items handed out by a shared counter or in fixed ranges
// (decode_calls below).
//
// Usage: tilemoe_decode_kernel_probe [--threads T] [--rounds R] [--k K] [--only NAME_PREFIX]
//                                    [--bf16-decode | --decode-calls]
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


// The decode kernels' arguments for one row of x (k_padded long) times panels [p0, p1) of `packed`,
// into c (4 panels wide).
GemmBf16Args one_row_args(const bf16* x, int k_padded, const bf16* packed, int p0, int p1, float* c) {
  GemmBf16Args g{};
  g.a = x;
  g.lda = static_cast<std::size_t>(k_padded);
  g.m = 1;
  g.k_padded = k_padded;
  g.panel_begin = p0;
  g.panel_end = p1;
  g.c = c;
  g.ldc = 4 * kPanelColumns;
  g.packed_b = packed;
  return g;
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

// Variants of the bf16 decode kernel for one row over one item of 4 panels (timing only; V 1's
// sums are not the product): where its stream from memory falls short of a loop of no work on the
// same bytes. Prefetch distances in k-blocks (1 KiB a panel) into L1 (T0) and L2 (T1), 0 = none:
// V 0 the forward's (1 / 4, gemm_bf16_avx512_prefetching); 1 the same loads and prefetches, the
// lines XORed instead of multiplied (no accumulator chain waits on a load); 2 two accumulators a
// panel (even and odd k-pairs); 3 T0 2 / T1 8; 4 T1 4 alone; 5 T0 1 alone; 6 T0 1 / T1 4 and T2
// (the LLC) 16 ahead.
template <int V>
__attribute__((noinline)) void bf16_variant(const bf16* panel0, std::size_t panel_stride, int kblocks, const bf16* a, float* c) {
  constexpr int P = 4;
  constexpr int kT0 = V == 3 ? 2 : V == 4 ? 0 : 1;
  constexpr int kT1 = V == 3 ? 8 : V == 5 ? 0 : 4;
  constexpr int kT2 = V == 6 ? 16 : 0;
  __m512 acc[P], acc2[P];
  __m512i bits[P];
  for (int p = 0; p < P; ++p) acc[p] = acc2[p] = _mm512_setzero_ps(), bits[p] = _mm512_setzero_si512();
  for (int kb = 0; kb < kblocks; ++kb) {
    const bf16* block = panel0 + static_cast<std::size_t>(kb) * kBlockElements;
    const bf16* ak = a + static_cast<std::size_t>(kb) * kBlockK;
#pragma GCC unroll 16
    for (int r = 0; r < kBlockK / 2; ++r) {
      std::int32_t v;
      std::memcpy(&v, ak + 2 * r, sizeof v);
      const __m512bh x = (__m512bh)_mm512_set1_epi32(v);
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) {
        const bf16* row = block + p * panel_stride + r * 32;
        if constexpr (kT0 > 0) _mm_prefetch(reinterpret_cast<const char*>(row + kT0 * kBlockElements), _MM_HINT_T0);
        if constexpr (kT1 > 0) _mm_prefetch(reinterpret_cast<const char*>(row + kT1 * kBlockElements), _MM_HINT_T1);
        if constexpr (kT2 > 0) _mm_prefetch(reinterpret_cast<const char*>(row + kT2 * kBlockElements), _MM_HINT_T2);
        const __m512i w = _mm512_loadu_si512(row);
        if constexpr (V == 1) {
          bits[p] = _mm512_xor_si512(bits[p], w);
        } else if constexpr (V == 2) {
          if (r % 2 == 0) acc[p] = _mm512_dpbf16_ps(acc[p], x, (__m512bh)w);
          else acc2[p] = _mm512_dpbf16_ps(acc2[p], x, (__m512bh)w);
        } else {
          acc[p] = _mm512_dpbf16_ps(acc[p], x, (__m512bh)w);
        }
      }
    }
  }
  for (int p = 0; p < P; ++p)
    _mm512_storeu_ps(c + p * kPanelColumns, _mm512_add_ps(_mm512_add_ps(acc[p], acc2[p]), _mm512_castsi512_ps(bits[p])));
}

double weight_bytes(const Weights& w, int k, int variant) {
  if (variant >= 10 && variant < 20) return static_cast<double>(w.codes.size());
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

// The bandwidth probe's pattern over bf16 weights in items of 4 panels (four streams, one a
// panel), `ahead` lines on asked for into L1; `whole` reads every line as one zmm instead of a word.
std::uint64_t read_pattern_bf16(const Weights& w, int k_padded, std::size_t ahead, bool whole) {
  constexpr std::size_t kLine = 64;
  const std::size_t panel_bytes = static_cast<std::size_t>(k_padded) * kPanelColumns * sizeof(bf16);
  const std::size_t item = 4 * panel_bytes;
  const std::size_t bytes = static_cast<std::size_t>(w.panels) * panel_bytes;
  const std::uint8_t* data = reinterpret_cast<const std::uint8_t*>(w.bf16_packed.data());
  std::uint64_t sink[4] = {};
  __m512i zsink[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
  for (std::size_t at = 0; at + item <= bytes; at += item) {
    const std::uint8_t* base = data + at;
    for (std::size_t j = 0; j < panel_bytes; j += kLine)
      for (std::size_t s = 0; s < 4; ++s) {
        const std::uint8_t* q = base + s * panel_bytes + j;
        if (j + ahead * kLine < panel_bytes) _mm_prefetch(reinterpret_cast<const char*>(q + ahead * kLine), _MM_HINT_T0);
        if (whole) {
          zsink[s] = _mm512_xor_si512(zsink[s], _mm512_loadu_si512(q));
        } else {
          std::uint64_t v;
          std::memcpy(&v, q, sizeof v);
          sink[s] ^= v;
        }
      }
  }
  for (int s = 0; s < 4; ++s) {
    alignas(64) std::uint64_t lanes[8];
    _mm512_store_si512(lanes, zsink[s]);
    for (std::uint64_t v : lanes) sink[s] ^= v;
  }
  return sink[0] ^ sink[1] ^ sink[2] ^ sink[3];
}

// One pass over w in items of 4 panels.
void pass(const Weights& w, int k_padded, const bf16* x, float* c, int variant) {
  if (variant >= 20 && variant < 30) {
    // bf16 weights: 20 the forward's prefetching kernel, 21 the plain one, 22-28 bf16_variant<V - 21>,
    // 29 unused.
    const std::size_t panel_stride = static_cast<std::size_t>(k_padded) / kBlockK * kBlockElements;
    for (int p0 = 0; p0 + 4 <= w.panels; p0 += 4) {
      const bf16* panel0 = w.bf16_packed.data() + static_cast<std::size_t>(p0) * panel_stride;
      const int kblocks = k_padded / kBlockK;
      switch (variant) {
        case 20:
        case 21: {
          const GemmBf16Args g = one_row_args(x, k_padded, w.bf16_packed.data(), p0, p0 + 4, c);
          if (variant == 20) gemm_bf16_avx512_prefetching(g);
          else gemm_bf16_avx512(g);
          break;
        }
        case 22: bf16_variant<1>(panel0, panel_stride, kblocks, x, c); break;
        case 23: bf16_variant<2>(panel0, panel_stride, kblocks, x, c); break;
        case 24: bf16_variant<3>(panel0, panel_stride, kblocks, x, c); break;
        case 25: bf16_variant<4>(panel0, panel_stride, kblocks, x, c); break;
        case 26: bf16_variant<5>(panel0, panel_stride, kblocks, x, c); break;
        case 27: bf16_variant<6>(panel0, panel_stride, kblocks, x, c); break;
        default: bf16_variant<0>(panel0, panel_stride, kblocks, x, c); break;
      }
    }
    return;
  }
  if (variant >= 30) {
    // The pattern over bf16 weights: 30 8 lines ahead, 31 32 lines ahead, 32 whole lines 8 ahead.
    c[0] += static_cast<float>(read_pattern_bf16(w, k_padded, variant == 31 ? 32 : 8, variant == 32) & 1);
    return;
  }
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
    const GemmBf16Args g = one_row_args(x, k_padded, w.codes.empty() ? w.bf16_packed.data() : nullptr, p0, std::min(p0 + 4, w.panels), c);
    if (w.codes.empty()) {
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

// --decode-calls: how the forward's way of handing out decode items changes the stream. One
// shared set of packed bf16 weights (1.5 GiB, K given), read as "calls" of 104 MB (DeepSeek-V2-Lite's
// bytes at one token), each call over the next window so that nothing comes from the LLC; T pinned
// threads (the caller is thread 0) take the call's items of 4 panels and meet at its end, as the
// forward's one parallel_for does. Modes take turns call by call: 0 a shared counter (the
// forward's pool), 1 contiguous ranges (thread t the t-th share, in order), 2 contiguous ranges
// whose threads, once done, take what is left of others' from their ends, 3 and 4 the bandwidth
// probe's pattern (a word a line) over the items of modes 0 and 1, 5 the forward's own items
// (DecodeCalls::forward_item), 6 the same over six experts drawn at random. Printed: the median
// call's ms and GB/s.
struct DecodeCalls {
  static constexpr int kModes = 7;
  // Mode 5: DeepSeek-V2-Lite's six experts of a token as the forward's items read them: an expert's
  // gate and up (88 panels each, K as given: 2048 there) then its down (128 panels, K = 1408);
  // gate_up items of 4 panels of gate and then the same of up, then the down items, all from the
  // shared counter (the forward's down items wait for their expert's h; these do not).
  static constexpr int kExperts = 6, kUpPanels = 88, kDownPanels = 128, kDownK = 1408;
  static constexpr int kForwardItems = kExperts * (kUpPanels / 4 + kDownPanels / 4);
  // Mode 6: the same with the call's six experts drawn at random from all the buffer holds (as the
  // bench's routing draws them from a layer's 64), not six neighbours.
  int random_experts[kExperts] = {};
  int threads = 16, k_padded = 2048, panels_per_call = 0, windows = 0, items = 0;
  std::size_t panel_elems = 0;
  std::size_t window_elems = 0;  // from one call's window to the next: the larger of the two layouts
  AlignedVector<bf16> w;
  std::vector<bf16> x;
  std::atomic<int> gen{0}, done{0}, stop{0};
  int mode = 0, window = 0;
  std::atomic<int> next{0};
  struct alignas(64) Range {
    std::atomic<int> begin{0}, end{0};
  };
  std::vector<Range> ranges;

  // Thread t's share of a call's items in the fixed-range modes: [share_begin(t), share_begin(t + 1)).
  int share_begin(int t) const { return static_cast<int>(static_cast<long>(items) * t / threads); }
  void forward_item(int i, float* c) const {
    const std::size_t up_elems = static_cast<std::size_t>(kUpPanels) * panel_elems;
    const std::size_t expert_elems = 2 * up_elems + static_cast<std::size_t>(kDownPanels) * kDownK * kPanelColumns;
    auto expert = [&](int e) {
      return mode == 6 ? w.data() + static_cast<std::size_t>(random_experts[e]) * expert_elems
                       : w.data() + static_cast<std::size_t>(window) * window_elems + e * expert_elems;
    };
    constexpr int kGateUpItems = kExperts * kUpPanels / 4;
    if (i < kGateUpItems) {
      const int e = i / (kUpPanels / 4), p0 = 4 * (i % (kUpPanels / 4));
      gemm_bf16_avx512_prefetching(one_row_args(x.data(), k_padded, expert(e), p0, p0 + 4, c));
      gemm_bf16_avx512_prefetching(one_row_args(x.data(), k_padded, expert(e) + up_elems, p0, p0 + 4, c));
      return;
    }
    i -= kGateUpItems;
    const int e = i / (kDownPanels / 4), p0 = 4 * (i % (kDownPanels / 4));
    gemm_bf16_avx512_prefetching(one_row_args(x.data(), kDownK, expert(e) + 2 * up_elems, p0, p0 + 4, c));
  }
  void item(int i, float* c) const {
    if (mode >= 5) return forward_item(i, c);
    const int p0 = 4 * i;
    if (mode >= 3) {
      c[0] += static_cast<float>(pattern_item(p0) & 1);
      return;
    }
    gemm_bf16_avx512_prefetching(one_row_args(x.data(), k_padded, w.data() + static_cast<std::size_t>(window) * window_elems, p0, p0 + 4, c));
  }
  std::uint64_t pattern_item(int p0) const {
    const std::size_t panel_bytes = panel_elems * sizeof(bf16);
    const std::uint8_t* base =
        reinterpret_cast<const std::uint8_t*>(w.data() + static_cast<std::size_t>(window) * window_elems + static_cast<std::size_t>(p0) * panel_elems);
    std::uint64_t sink = 0;
    for (std::size_t j = 0; j < panel_bytes; j += 64)
      for (std::size_t s = 0; s < 4; ++s) {
        const std::uint8_t* q = base + s * panel_bytes + j;
        _mm_prefetch(reinterpret_cast<const char*>(q + 32 * 64), _MM_HINT_T0);
        std::uint64_t v;
        std::memcpy(&v, q, sizeof v);
        sink ^= v;
      }
    return sink;
  }
  void run_share(int t, float* c) {
    if (mode == 0 || mode == 3 || mode >= 5) {
      const int n = mode >= 5 ? kForwardItems : items;
      for (int i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) item(i, c);
    } else if (mode == 1 || mode == 4) {
      for (int i = share_begin(t); i < share_begin(t + 1); ++i) item(i, c);
    } else {
      // Own range from its front; then others' from their backs.
      Range& mine = ranges[static_cast<std::size_t>(t)];
      for (;;) {
        const int i = mine.begin.fetch_add(1, std::memory_order_relaxed);
        if (i >= mine.end.load(std::memory_order_relaxed)) break;
        item(i, c);
      }
      for (int o = 1; o < threads; ++o) {
        Range& r = ranges[static_cast<std::size_t>((t + o) % threads)];
        for (;;) {
          const int i = r.end.fetch_sub(1, std::memory_order_relaxed) - 1;
          if (i < r.begin.load(std::memory_order_relaxed)) break;
          item(i, c);
        }
      }
    }
  }
};

void decode_calls(int threads, int k, int rounds) {
  DecodeCalls d;
  d.threads = threads;
  d.k_padded = (k + kBlockK - 1) / kBlockK * kBlockK;
  d.panel_elems = static_cast<std::size_t>(d.k_padded) * kPanelColumns;
  const std::size_t panel_bytes = d.panel_elems * sizeof(bf16);
  d.panels_per_call = static_cast<int>((std::size_t(104) << 20) / panel_bytes / 4 * 4);
  d.items = d.panels_per_call / 4;
  const std::size_t forward_elems = static_cast<std::size_t>(DecodeCalls::kExperts) *
                                    (2 * DecodeCalls::kUpPanels * d.panel_elems + static_cast<std::size_t>(DecodeCalls::kDownPanels) * DecodeCalls::kDownK * kPanelColumns);
  d.window_elems = std::max(d.panel_elems * d.panels_per_call, forward_elems);
  d.windows = static_cast<int>((std::size_t(3) << 29) / (d.window_elems * sizeof(bf16)));
  d.w.resize(d.window_elems * d.windows);
  d.ranges = std::vector<DecodeCalls::Range>(static_cast<std::size_t>(threads));
  d.x.assign(std::max(d.k_padded, DecodeCalls::kDownK), float_to_bf16(0.01f));  // down items read kDownK
  std::vector<std::thread> helpers;
  auto worker = [&](int t) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(t, &set);
    sched_setaffinity(0, sizeof set, &set);
    std::vector<float> c(4 * kPanelColumns);
    int seen = 0;
    for (;;) {
      int g;
      while ((g = d.gen.load(std::memory_order_acquire)) == seen) {
        if (d.stop.load(std::memory_order_relaxed)) return;
        _mm_pause();
      }
      seen = g;
      d.run_share(t, c.data());
      d.done.fetch_add(1, std::memory_order_acq_rel);
    }
  };
  for (int t = 1; t < threads; ++t) helpers.emplace_back(worker, t);
  {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(0, &set);
    sched_setaffinity(0, sizeof set, &set);
  }
  std::vector<float> c0(4 * kPanelColumns);
  const int expert_slots = static_cast<int>(d.w.size() / (forward_elems / DecodeCalls::kExperts));
  std::mt19937 pick(7);
  auto call = [&](int mode, int window) {
    for (int e = 0; e < DecodeCalls::kExperts; ++e) {
      bool again = true;
      while (again) {
        d.random_experts[e] = static_cast<int>(pick() % static_cast<unsigned>(expert_slots));
        again = std::find(d.random_experts, d.random_experts + e, d.random_experts[e]) != d.random_experts + e;
      }
    }
    d.mode = mode;
    d.window = window;
    d.next.store(0, std::memory_order_relaxed);
    for (int t = 0; t < threads; ++t) {
      d.ranges[static_cast<std::size_t>(t)].begin.store(d.share_begin(t), std::memory_order_relaxed);
      d.ranges[static_cast<std::size_t>(t)].end.store(d.share_begin(t + 1), std::memory_order_relaxed);
    }
    d.done.store(0, std::memory_order_relaxed);
    const auto t0 = std::chrono::steady_clock::now();
    d.gen.fetch_add(1, std::memory_order_acq_rel);
    d.run_share(0, c0.data());
    while (d.done.load(std::memory_order_acquire) < threads - 1) _mm_pause();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // Filled by this thread (one memory node), then every window read once.
  for (std::size_t i = 0; i < d.w.size(); ++i) d.w[i] = float_to_bf16(static_cast<float>(i % 7) * 0.01f);
  for (int win = 0; win < d.windows; ++win) call(1, win);
  std::vector<std::vector<double>> ms(DecodeCalls::kModes);
  int win = 0;
  for (int r = 0; r < rounds; ++r)
    for (int m = 0; m < DecodeCalls::kModes; ++m) {
      const int mode = (m + r) % DecodeCalls::kModes;  // each mode after each other in turn
      ms[static_cast<std::size_t>(mode)].push_back(call(mode, win) * 1e3);
      win = (win + 1) % d.windows;
    }
  d.stop.store(1);
  d.gen.fetch_add(1);
  for (auto& h : helpers) h.join();
  const double bytes = static_cast<double>(panel_bytes) * d.panels_per_call;
  const char* names[DecodeCalls::kModes] = {"shared counter", "contiguous", "contig + steal", "pattern, counter", "pattern, contig",
                                            "forward items", "fwd, random"};
  std::printf("decode calls: %d threads, K %d, %.1f MB a call, %d items of 4 panels, %d windows, %d calls a mode\n", threads, d.k_padded,
              bytes / 1e6, d.items, d.windows, rounds);
  std::printf("%-16s %9s %9s %9s\n", "mode", "median_ms", "min_ms", "GB/s");
  for (int m = 0; m < DecodeCalls::kModes; ++m) {
    const double med = median(ms[static_cast<std::size_t>(m)]);
    const double mn = *std::min_element(ms[static_cast<std::size_t>(m)].begin(), ms[static_cast<std::size_t>(m)].end());
    const double mode_bytes =
        m >= 5 ? static_cast<double>(DecodeCalls::kExperts) *
                     (2.0 * DecodeCalls::kUpPanels * panel_bytes + static_cast<double>(DecodeCalls::kDownPanels) * DecodeCalls::kDownK * 32)
               : bytes;
    std::printf("%-16s %9.3f %9.3f %9.1f\n", names[m], med, mn, mode_bytes / med / 1e6);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  int rounds = 9;
  int k = 2880;
  std::string only;  // cases whose name starts with it
  bool bf16_decode = false, calls = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--bf16-decode") bf16_decode = true;
    else if (a == "--decode-calls") calls = true;
    else if (i + 1 < argc) {
      if (a == "--threads") threads = std::atoi(argv[i + 1]);
      else if (a == "--rounds") rounds = std::atoi(argv[i + 1]);
      else if (a == "--k") k = std::atoi(argv[i + 1]);
      else if (a == "--only") only = argv[i + 1];
      ++i;
    }
  }
  if (!isa_available(Isa::avx512_bf16)) {
    std::printf("SKIPPED: no AVX512-BF16\n");
    return 0;
  }
  if (calls) {
    decode_calls(threads, k, rounds);
    return 0;
  }
  auto selected = [&](const char* name) { return only.empty() || std::strncmp(name, only.c_str(), only.size()) == 0; };
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
  const std::vector<Case> default_cases = {{"bf16 L2", false, l2_panels, 400},
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
  // --bf16-decode: the bf16 decode kernel's variants (bf16_variant) and the probe's pattern over
  // the same weights (one 96 MiB set a thread, shared by the cases), the cases taking turns round
  // by round so that the instance's drift falls on all of them alike.
  const std::vector<Case> bf16_cases = {{"tree", false, mem_panels_bf16, 2, 20},
                                        {"no prefetch", false, mem_panels_bf16, 2, 21},
                                        {"tree (copy)", false, mem_panels_bf16, 2, 28},
                                        {"xor, no dpbf16", false, mem_panels_bf16, 2, 22},
                                        {"2 acc a panel", false, mem_panels_bf16, 2, 23},
                                        {"T0 2 / T1 8", false, mem_panels_bf16, 2, 24},
                                        {"T1 4 only", false, mem_panels_bf16, 2, 25},
                                        {"T0 1 only", false, mem_panels_bf16, 2, 26},
                                        {"tree + T2 16", false, mem_panels_bf16, 2, 27},
                                        {"pattern 8", false, mem_panels_bf16, 2, 30},
                                        {"pattern 32", false, mem_panels_bf16, 2, 31},
                                        {"pattern zmm 8", false, mem_panels_bf16, 2, 32}};
  const std::vector<Case>& cases = bf16_decode ? bf16_cases : default_cases;
  std::vector<std::vector<Weights>> weights(cases.size());
  for (std::size_t c = 0; c < cases.size(); ++c) {
    if (bf16_decode && c > 0) break;  // the cases share case 0's, made whichever are selected
    for (int t = 0; t < threads && (bf16_decode || selected(cases[c].name)); ++t)
      weights[c].push_back(make_weights(cases[c].panels, k, cases[c].mxfp4, 17 * t + c));
  }
  std::vector<bf16> x(k_padded);
  for (int i = 0; i < k_padded; ++i) x[i] = float_to_bf16(i < k ? 0.01f * (i % 13) : 0.f);

  std::printf("threads %d, K %d; GB/s of weights read, median over %d rounds%s\n", threads, k, rounds,
              bf16_decode ? " (cases taking turns round by round)" : "");
  std::printf("%-14s %12s %12s %12s\n", "case", "median thr", "min thr", "sum");
  std::vector<std::vector<double>> med(cases.size()), mins(cases.size()), sums(cases.size());
  auto run_round = [&](std::size_t c) {
    const std::vector<Weights>& ws = weights[bf16_decode ? 0 : c];
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
        const Weights& w = ws[t];
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
    med[c].push_back(median(rate));
    mins[c].push_back(*std::min_element(rate.begin(), rate.end()));
    sums[c].push_back(sum);
  };
  auto print_case = [&](std::size_t c) {
    std::printf("%-14s %12.2f %12.2f %12.1f\n", cases[c].name, median(med[c]), median(mins[c]), median(sums[c]));
  };
  if (bf16_decode) {
    for (int r = 0; r < rounds; ++r)
      for (std::size_t c = 0; c < cases.size(); ++c)
        if (selected(cases[c].name)) run_round(c);
    for (std::size_t c = 0; c < cases.size(); ++c)
      if (selected(cases[c].name)) print_case(c);
  } else {
    for (std::size_t c = 0; c < cases.size(); ++c) {
      if (!selected(cases[c].name)) continue;
      for (int r = 0; r < rounds; ++r) run_round(c);
      print_case(c);
    }
  }
  return 0;
}
