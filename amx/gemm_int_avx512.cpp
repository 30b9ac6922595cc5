// AVX512-VNNI integer GEMM: the decode hot path of int8/int4 weights, where the cost is streaming
// the packed codes from memory once. One 64-byte row of a packed int8 block is 16 columns × one
// k-quad; the matching quad of an activation row is broadcast as one 32-bit value, so one
// VPDPBUSD does 16 columns × 4 k. VPDPBUSD multiplies unsigned by signed bytes: activations go in
// as a + 128 (an XOR of the sign bit) and 128 × the column sums of the codes come back off at
// each group's end. int4: one 64-byte load holds two quad rows as nibbles (code + 8); a mask and
// a shift give both as unsigned bytes, which take the unsigned side (see block4).
//
// Register blocking: int8 up to 4 rows × 4 panels of int32 accumulators, scaled once at the end.
// int4 keeps sums across groups as well (f32, or int32 in column form), so it blocks at most 2 rows ×
// 4 panels.
// gemm_int_avx512_prefetching also asks for each code line some lines ahead on the pass that reads
// the codes from memory (gemm_bf16_avx512_prefetching says why, and where it pays).
#include <algorithm>
#include <cstring>

#include "amx/immintrin_gcc12.hpp"

#include "amx/bf16_avx512.hpp"
#include "amx/gemm_int.hpp"

namespace tilemoe::kernels {
namespace {

constexpr int kMaxPanels = 4;
// Panels are grouped so that one group's codes stay in L2 while every row group passes over them.
constexpr std::size_t kGroupBytes = 256 * 1024;
// The prefetching entry's distance along each panel stream: 1 KiB, 16 lines, as in the bf16 kernel.
// On an Emerald Rapids Xeon (cases taking turns in one process, held LoRA r = 16) int4 at 1 token
// went from 0.254-0.267 to 0.232-0.245 ms, int8 at 16 tokens 1.5 % faster, int8 at 1 token as before.
constexpr std::size_t kPrefetchBytes = 1024;
// int8's codes are also asked for 4 KiB ahead into L2 (PREFETCHT1), so that more of each stream's
// lines are in flight than the L1 requests alone keep. On the device (cases taking turns in one
// process, six processes over two calls, held LoRA r = 16) int8 at 1 token ran 2.9-5.2 % faster
// and at 16 tokens 1-4.5 %; 2 KiB ahead did as well, 8 KiB half as well. int4 (512 bytes a k-block)
// was 2-5 % slower with it and keeps the L1 requests alone (bf16's kernel asks into L2 since
// session 65: gemm_bf16_avx512.cpp).
constexpr std::size_t kL2PrefetchBytes = 4096;
// int4's group scales (one 64-byte line a panel and group, read by the group's flush) are asked for
// into L1 about this many bytes of each panel's codes ahead: left to the flush, the first read of
// each line was a miss that the loop waited for (perf: a fifth of the kernel's samples on the
// scale loads at 1 token). On this repository's AMX machine (2 vCPUs, KVM) int4 g128 at 1 token
// went from 1.10-1.11 to 1.04-1.07 ms and at 16 tokens 3-6 % faster; g32 4-7 %.
constexpr std::size_t kScaleAheadCodeBytes = 2048;

template <bool AlsoL2>
inline void prefetch_ahead(const std::uint8_t* line) {
  _mm_prefetch(reinterpret_cast<const char*>(line + kPrefetchBytes), _MM_HINT_T0);
  if constexpr (AlsoL2) _mm_prefetch(reinterpret_cast<const char*>(line + kL2PrefetchBytes), _MM_HINT_T1);
}

inline __m512i broadcast_quad_biased(const std::int8_t* p) {
  std::int32_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm512_xor_si512(_mm512_set1_epi32(v), _mm512_set1_epi8(static_cast<char>(0x80)));
}

template <int R, int P>
inline void store_rows(const GemmIntArgs& g, int row0, int panel, __m512 (&sum)[R][P]) {
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) {
    const __m512 sa = _mm512_set1_ps(g.a_scale[row0 + i]);
    float* ci = g.c + (row0 + i) * g.ldc + (panel - g.panel_begin) * 16;
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      __m512 v = _mm512_mul_ps(sum[i][p], sa);
      if (g.accumulate) v = _mm512_add_ps(v, _mm512_loadu_ps(ci + p * 16));
      _mm512_storeu_ps(ci + p * 16, v);
    }
  }
}

// int32 sums of one group (minus the bias term) times the group's column scales, into sum.
template <int R, int P>
inline void flush_group(const GemmIntArgs& g, int panel, int grp, __m512i (&acc)[R][P], __m512 (&sum)[R][P]) {
  const PackedIntShape& s = g.shape;
#pragma GCC unroll 4
  for (int p = 0; p < P; ++p) {
    const std::size_t at = (static_cast<std::size_t>(panel + p) * s.groups + grp) * 16;
    const __m512 scale = _mm512_loadu_ps(g.b.scales + at);
    const __m512i bias = _mm512_slli_epi32(_mm512_loadu_si512(g.b.colsums + at), 7);
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i)
      sum[i][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[i][p], bias)), scale, sum[i][p]);
  }
}

template <int R, int P, bool Prefetch>
void block8(const GemmIntArgs& g, int row0, int panel) {
  const PackedIntShape& s = g.shape;
  const std::size_t stride = s.panel_bytes();
  const std::uint8_t* b0 = g.b.codes + panel * stride;
  const std::int8_t* a0 = g.a + row0 * g.lda;
  __m512i acc[R][P];
  __m512 sum[R][P];
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      acc[i][p] = _mm512_setzero_si512();
      sum[i][p] = _mm512_setzero_ps();
    }
  const int quads = s.k_padded / 4;
  for (int q0 = 0; q0 < quads; q0 += 16) {
    const std::uint8_t* blk = b0 + static_cast<std::size_t>(q0 / 16) * 1024;
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) {
      __m512i x[R];
#pragma GCC unroll 4
      for (int i = 0; i < R; ++i) x[i] = broadcast_quad_biased(a0 + i * g.lda + 4 * (q0 + r));
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) {
        if constexpr (Prefetch) prefetch_ahead<true>(blk + p * stride + r * 64);
        const __m512i w = _mm512_loadu_si512(blk + p * stride + r * 64);
#pragma GCC unroll 4
        for (int i = 0; i < R; ++i) acc[i][p] = _mm512_dpbusd_epi32(acc[i][p], x[i], w);
      }
    }
  }
  flush_group<R, P>(g, panel, 0, acc, sum);
  store_rows<R, P>(g, row0, panel, sum);
}

inline __m512i broadcast_quad(const std::int8_t* p) {
  std::int32_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm512_set1_epi32(v);
}

// int4: the nibbles are code + 8, unsigned, so they go into VPDPBUSD's unsigned operand as they
// are and the activations into its signed one: each column's sum is then sum(code * a) +
// 8 * sum(a) over the group, the same correction for every column. VPDPBUSD of the broadcast
// quad with 8s gathers that correction in one more accumulator per row (every lane equal), so
// the loop has no subtraction and the flush reads no column sums.
template <int R, int P, bool Prefetch>
void block4(const GemmIntArgs& g, int row0, int panel) {
  const PackedIntShape& s = g.shape;
  const std::size_t stride = s.panel_bytes();
  const std::uint8_t* b0 = g.b.codes + panel * stride;
  const std::int8_t* a0 = g.a + row0 * g.lda;
  const __m512i low = _mm512_set1_epi8(0x0f), eight = _mm512_set1_epi8(8);
  // Column form (pack_int.hpp): each group's int32 sums times its integer multiple, summed over K
  // in int32 (as int8 sums all of K) and scaled once a column: a byte a group and column read
  // instead of a 4-byte scale (g128: 4.4 % fewer bytes, g32 15 %).
  const bool columns = g.b.group_multiples != nullptr && g.b.column_scales != nullptr;
  __m512 sum[R][P];
  __m512i total[R][P];
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      sum[i][p] = _mm512_setzero_ps();
      total[i][p] = _mm512_setzero_si512();
    }
  const int quads = s.k_padded / 4, group_quads = s.group / 4;
  // A group of one panel is group * 8 bytes of codes.
  const int scale_ahead = static_cast<int>(std::max<std::size_t>(1, kScaleAheadCodeBytes / (static_cast<std::size_t>(s.group) * 8)));
  if (Prefetch && columns) {
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) _mm_prefetch(reinterpret_cast<const char*>(g.b.column_scales + (panel + p) * 16), _MM_HINT_T0);
  }
  for (int grp = 0; grp < s.groups; ++grp) {
    __m512i acc[R][P], bias[R];
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i) {
      bias[i] = _mm512_setzero_si512();
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) acc[i][p] = _mm512_setzero_si512();
    }
    if constexpr (Prefetch) {
      if (grp + scale_ahead < s.groups) {
        const std::size_t ahead = static_cast<std::size_t>(grp + scale_ahead) * 16;
#pragma GCC unroll 4
        for (int p = 0; p < P; ++p) {
          const std::size_t at = static_cast<std::size_t>(panel + p) * s.groups * 16 + ahead;
          _mm_prefetch(columns ? reinterpret_cast<const char*>(g.b.group_multiples + at) : reinterpret_cast<const char*>(g.b.scales + at),
                       _MM_HINT_T0);
        }
      }
    }
    const int q_end = std::min(quads, (grp + 1) * group_quads);
    for (int q = grp * group_quads; q < q_end; q += 2) {
      const std::size_t off = static_cast<std::size_t>(q / 16) * 512 + static_cast<std::size_t>((q % 16) / 2) * 64;
      __m512i x0[R], x1[R];
#pragma GCC unroll 4
      for (int i = 0; i < R; ++i) {
        x0[i] = broadcast_quad(a0 + i * g.lda + 4 * q);
        x1[i] = broadcast_quad(a0 + i * g.lda + 4 * (q + 1));
        bias[i] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(bias[i], eight, x0[i]), eight, x1[i]);
      }
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) {
        if constexpr (Prefetch) prefetch_ahead<false>(b0 + p * stride + off);
        const __m512i raw = _mm512_loadu_si512(b0 + p * stride + off);
        const __m512i w0 = _mm512_and_si512(raw, low);
        const __m512i w1 = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
#pragma GCC unroll 4
        for (int i = 0; i < R; ++i) {
          acc[i][p] = _mm512_dpbusd_epi32(acc[i][p], w0, x0[i]);
          acc[i][p] = _mm512_dpbusd_epi32(acc[i][p], w1, x1[i]);
        }
      }
    }
    if (columns) {
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) {
        const std::uint8_t* m = g.b.group_multiples + (static_cast<std::size_t>(panel + p) * s.groups + grp) * 16;
        const __m512i multiple = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(m)));
#pragma GCC unroll 4
        for (int i = 0; i < R; ++i) total[i][p] = _mm512_add_epi32(total[i][p], _mm512_mullo_epi32(_mm512_sub_epi32(acc[i][p], bias[i]), multiple));
      }
      continue;
    }
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      const __m512 scale = _mm512_loadu_ps(g.b.scales + (static_cast<std::size_t>(panel + p) * s.groups + grp) * 16);
#pragma GCC unroll 4
      for (int i = 0; i < R; ++i)
        sum[i][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[i][p], bias[i])), scale, sum[i][p]);
    }
  }
  if (columns) {
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      const __m512 scale = _mm512_loadu_ps(g.b.column_scales + (panel + p) * 16);
#pragma GCC unroll 4
      for (int i = 0; i < R; ++i) sum[i][p] = _mm512_mul_ps(_mm512_cvtepi32_ps(total[i][p]), scale);
    }
  }
  store_rows<R, P>(g, row0, panel, sum);
}

using BlockFn = void (*)(const GemmIntArgs&, int, int);

template <int R, bool Prefetch>
constexpr BlockFn kBlocks8ForRows[kMaxPanels] = {block8<R, 1, Prefetch>, block8<R, 2, Prefetch>, block8<R, 3, Prefetch>,
                                                 block8<R, 4, Prefetch>};
template <bool Prefetch>
constexpr const BlockFn* kBlocks8[4] = {kBlocks8ForRows<1, Prefetch>, kBlocks8ForRows<2, Prefetch>, kBlocks8ForRows<3, Prefetch>,
                                        kBlocks8ForRows<4, Prefetch>};
template <int R, bool Prefetch>
constexpr BlockFn kBlocks4ForRows[kMaxPanels] = {block4<R, 1, Prefetch>, block4<R, 2, Prefetch>, block4<R, 3, Prefetch>,
                                                 block4<R, 4, Prefetch>};
template <bool Prefetch>
constexpr const BlockFn* kBlocks4[2] = {kBlocks4ForRows<1, Prefetch>, kBlocks4ForRows<2, Prefetch>};

template <bool Prefetch>
void gemm_by_panel_groups(const GemmIntArgs& tiled_or_rows) {
  // Tile order pays off only for AMX tile loads; this kernel reads rows.
  const GemmIntArgs args = with_int_a_rows(tiled_or_rows);
  const bool int8 = args.shape.bits == 8;
  const int max_rows = int8 ? 4 : 2;
  const std::size_t panel_bytes = std::max<std::size_t>(args.shape.panel_bytes(), 1);
  const int group = static_cast<int>(std::max<std::size_t>(kMaxPanels, kGroupBytes / panel_bytes));
  for (int g0 = args.panel_begin; g0 < args.panel_end; g0 += group) {
    const int g1 = std::min(args.panel_end, g0 + group);
    for (int row = 0; row < args.m; row += max_rows) {
      const int rows = std::min(max_rows, args.m - row);
      // Only the first row group reads the group's codes from memory; the others find them in L2.
      const bool ahead = Prefetch && row == 0;
      const BlockFn* fns = int8 ? (ahead ? kBlocks8<true>[rows - 1] : kBlocks8<false>[rows - 1])
                                : (ahead ? kBlocks4<true>[rows - 1] : kBlocks4<false>[rows - 1]);
      for (int p = g0; p < g1; p += kMaxPanels) fns[std::min(kMaxPanels, g1 - p) - 1](args, row, p);
    }
  }
  add_second_product(args, gemm_bf16_avx512);
  write_int_result_bf16(args, convert_to_bf16_avx512);
}

}  // namespace

void gemm_int_avx512(const GemmIntArgs& args) { gemm_by_panel_groups<false>(args); }

void gemm_int_avx512_prefetching(const GemmIntArgs& args) { gemm_by_panel_groups<true>(args); }

void quantize_rows_avx512(const std::uint16_t* x, std::size_t ldx, int rows, int k, int k_padded, std::int8_t* codes,
                          std::size_t ldq, float* scales) {
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (int i = 0; i < rows; ++i) {
    const std::uint16_t* xi = x + ldx * static_cast<std::size_t>(i);
    std::int8_t* qi = codes + ldq * static_cast<std::size_t>(i);
    auto load = [&](int kk) {
      const __mmask16 m = lanes16(k - kk);
      const __m512i h = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, xi + kk));
      return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
    };
    // max|x| over the row; NaN and Inf both show up as a non-finite maximum of |x| bit patterns.
    __m512i amax_bits = _mm512_setzero_si512();
    for (int kk = 0; kk < k; kk += 16)
      amax_bits = _mm512_max_epu32(amax_bits, _mm512_castps_si512(_mm512_and_ps(load(kk), abs_mask)));
    const std::uint32_t top = _mm512_reduce_max_epu32(amax_bits);
    std::memset(qi, 0, static_cast<std::size_t>(k_padded));
    if (top >= 0x7f800000u) {
      scales[i] = __builtin_nanf("");
      continue;
    }
    float amax;
    std::memcpy(&amax, &top, sizeof amax);
    scales[i] = amax / 127.0f;
    if (amax == 0.0f) continue;
    const __m512 inv = _mm512_set1_ps(127.0f / amax);
    for (int kk = 0; kk < k; kk += 16) {
      const __mmask16 m = lanes16(k - kk);
      const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(load(kk), inv));  // round to nearest even
      _mm_mask_storeu_epi8(qi + kk, m, _mm512_cvtsepi32_epi8(q));
    }
  }
}

}  // namespace tilemoe::kernels
