// MXFP4 decode rows with AVX-512 on the integer dot product (VPDPBUSD), not VDPBF16PS: on the
// device a VDPBF16PS takes about four cycles of the vector units where a VPDPBUSD takes one
// (docs/perf.md, session 57), and the bf16 form of this kernel, four of them per 64 code bytes,
// could not keep up with one core's share of the memory bandwidth.
//
// Weights: a code line's low and high nibbles (pack_mxfp4.hpp) are looked up with VPSHUFB as
// unsigned bytes 2 * E2M1 + 12 (0..24). In dword lane c of line j the low nibbles are column c's
// inputs 8j + {0, 4, 1, 5} and the high nibbles 8j + {2, 6, 3, 7}.
//
// Activations: each row's k-block of 32 bf16 values is written as integers q = x / step with
// step = 2^(E - 140), E the biased exponent of the block's largest magnitude, so |q| <= 16320 and
// every value within 2^6 of that magnitude is exact (smaller ones are rounded to the step, at most
// 2^-14 of the block's largest value); q = 128 h + l with h in [-128, 127] and l in [0, 127], two
// signed bytes, in the lanes' input order. A block's sums are then
//   sum (2w + 12) q = 128 * dot(w', h) + dot(w', l),   2 * sum w x = (that - 12 * sum q) * step,
// exact in int32 (|.| < 2^24), scaled by 2^(e - 127) / 2 as f32 and added to the row's sums.
// A block holding an infinity or NaN gets step NaN: its row's outputs are NaN.
//
// The weights stream at 4.25 bits each and never exist as bf16 in memory. Each panel stream asks
// for its codes two blocks (8 lines) ahead.
#include "amx/immintrin_gcc12.hpp"

#include <cstdint>
#include <cstring>
#include <limits>

#include "amx/gemm_mxfp4.hpp"
#include "amx/mxfp4_row_digits.hpp"

namespace tilemoe::kernels {
namespace {

constexpr int kPrefetchBlocks = 2;
// Each panel's exponents (16 bytes a k-block, a line every 4 k-blocks) are asked for 8 k-blocks
// (2 KiB of that panel's codes) ahead: read only by the flush, each new line was a miss that the
// loop waited for. On this repository's AMX machine (2 vCPUs, KVM) mxfp4 at 1 token went from
// 1.19-1.20 to 1.05-1.08 ms, at 16 tokens 3-6 % faster; 4 and 16 k-blocks ahead did about as well.
constexpr int kExponentAheadBlocks = 8;

// Panels a block call reads at once: four streams for one row, two where more rows' sums take the
// registers (two int32 sums and one f32 sum a row and panel).
template <int R>
constexpr int kPanelsFor = R == 1 ? 4 : 2;

// k-block kb of x as Mxfp4RowDigits (see the top); reads x's 32 values there.
inline void write_block_digits(const bf16* x, int kb, std::int8_t* digits, float* steps, std::int32_t* corrections) {
  // Within each group of 8 inputs, the order of the weight lanes' bytes: low nibbles, then high.
  const __m512i lane_order = _mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
  const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
  const __m512i low7 = _mm512_set1_epi32(127);
  const __m512i bits = _mm512_loadu_si512(x + static_cast<std::size_t>(kb) * kBlockK);
  const __m512 x0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(bits)), 16));
  const __m512 x1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(bits, 1)), 16));
  const __m512i largest = _mm512_max_epu32(_mm512_and_si512(_mm512_castps_si512(x0), magnitude),
                                           _mm512_and_si512(_mm512_castps_si512(x1), magnitude));
  // Magnitudes order as unsigned integers; a NaN's bits are above every finite value's.
  const int e = static_cast<int>(_mm512_reduce_max_epu32(largest) >> 23);
  std::int8_t* d = digits + static_cast<std::size_t>(kb) * kMxfp4DigitBytes;
  if (e == 255) {
    std::memset(d, 0, kMxfp4DigitBytes);
    steps[kb] = std::numeric_limits<float>::quiet_NaN();
    corrections[kb] = 0;
    return;
  }
  const __m512 up = _mm512_set1_ps(static_cast<float>(140 - e));
  const __m512i q0 = _mm512_permutexvar_epi32(lane_order, _mm512_cvtps_epi32(_mm512_scalef_ps(x0, up)));
  const __m512i q1 = _mm512_permutexvar_epi32(lane_order, _mm512_cvtps_epi32(_mm512_scalef_ps(x1, up)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(d), _mm512_cvtepi32_epi8(_mm512_srai_epi32(q0, 7)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 16), _mm512_cvtepi32_epi8(_mm512_srai_epi32(q1, 7)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 32), _mm512_cvtepi32_epi8(_mm512_and_si512(q0, low7)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 48), _mm512_cvtepi32_epi8(_mm512_and_si512(q1, low7)));
  steps[kb] = mxfp4_power_of_two(e - 141);
  corrections[kb] = kMxfp4WeightOffset * _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
}

struct Decoder {
  // 2 * E2M1 + 12 for each code: 0..7 the positive values, 8..15 the negative ones.
  __m512i table = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  __m512i low4 = _mm512_set1_epi8(0x0f);
  __m512i least_scale = _mm512_set1_epi32(0x00400000);  // 2^-127, E8M0's exponent 0, as an f32 subnormal

  __m512i low(__m512i line) const { return _mm512_shuffle_epi8(table, _mm512_and_si512(line, low4)); }
  __m512i high(__m512i line) const { return _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(line, 4), low4)); }

  // 2^(e - 127) as f32 for each column's exponent e (exponent 255, not a number in E8M0, gives
  // infinity: pack_mxfp4.hpp leaves exponents outside its range unspecified).
  __m512 scales(const std::uint8_t* exponents) const {
    const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(exponents)));
    return _mm512_castsi512_ps(_mm512_max_epu32(_mm512_slli_epi32(e, 23), least_scale));
  }
};

inline __m512i broadcast_digits(const std::int8_t* p) {
  std::int32_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm512_set1_epi32(v);
}

template <int R, int P>
__attribute__((noinline)) void block(const GemmBf16Args& g, const PackedMxfp4Shape& s, const PackedMxfp4View& w, const Decoder& d,
                                     const Mxfp4RowDigits* rows, const Mxfp4RowsToWrite* write, int panel) {
  __m512 acc[R][P];
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) acc[i][p] = _mm512_setzero_ps();
  const std::size_t code_stride = static_cast<std::size_t>(s.kblocks) * kMxfp4BlockCodeBytes;
  const std::size_t exponent_stride = static_cast<std::size_t>(s.kblocks) * kMxfp4BlockExponentBytes;
  const std::uint8_t* codes0 = w.codes + static_cast<std::size_t>(panel) * code_stride;
  const std::uint8_t* exponents0 = w.exponents + static_cast<std::size_t>(panel) * exponent_stride;
  for (int kb = 0; kb < s.kblocks; ++kb) {
    const std::uint8_t* codes = codes0 + static_cast<std::size_t>(kb) * kMxfp4BlockCodeBytes;
    if (kb % 4 == 0) {  // a new line of exponents every 4 k-blocks; a prefetch past the matrix never faults
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p)
        _mm_prefetch(reinterpret_cast<const char*>(exponents0 + p * exponent_stride +
                                                   static_cast<std::size_t>(kb + kExponentAheadBlocks) * kMxfp4BlockExponentBytes),
                     _MM_HINT_T0);
    }
    write_rows_block<R, write_block_digits>(rows, write, kb);
    __m512i high_sum[R][P], low_sum[R][P];
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) high_sum[i][p] = low_sum[i][p] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) {
        const std::uint8_t* line_at = codes + p * code_stride + j * 64;
        _mm_prefetch(reinterpret_cast<const char*>(line_at + kPrefetchBlocks * kMxfp4BlockCodeBytes), _MM_HINT_T0);
        const __m512i line = _mm512_loadu_si512(line_at);
        const __m512i lo = d.low(line), hi = d.high(line);
#pragma GCC unroll 4
        for (int i = 0; i < R; ++i) {
          const std::int8_t* digit = rows[i].digits + static_cast<std::size_t>(kb) * kMxfp4DigitBytes + 8 * j;
          high_sum[i][p] = _mm512_dpbusd_epi32(high_sum[i][p], lo, broadcast_digits(digit));
          high_sum[i][p] = _mm512_dpbusd_epi32(high_sum[i][p], hi, broadcast_digits(digit + 4));
          low_sum[i][p] = _mm512_dpbusd_epi32(low_sum[i][p], lo, broadcast_digits(digit + 32));
          low_sum[i][p] = _mm512_dpbusd_epi32(low_sum[i][p], hi, broadcast_digits(digit + 36));
        }
      }
    }
    const std::uint8_t* exponents = exponents0 + static_cast<std::size_t>(kb) * kMxfp4BlockExponentBytes;
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      const __m512 scale = d.scales(exponents + p * exponent_stride);
#pragma GCC unroll 4
      for (int i = 0; i < R; ++i) {
        const Mxfp4RowDigits& r = rows[i];
        const __m512i sum = _mm512_sub_epi32(_mm512_add_epi32(_mm512_slli_epi32(high_sum[i][p], 7), low_sum[i][p]),
                                             _mm512_set1_epi32(r.corrections[kb]));
        const __m512 part = _mm512_mul_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(r.steps[kb]));
        acc[i][p] = _mm512_fmadd_ps(part, scale, acc[i][p]);
      }
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      float* c = g.c + static_cast<std::size_t>(i) * g.ldc + static_cast<std::size_t>(panel - g.panel_begin + p) * kPanelColumns;
      _mm512_storeu_ps(c, g.accumulate ? _mm512_add_ps(_mm512_loadu_ps(c), acc[i][p]) : acc[i][p]);
    }
}

template <int R>
void rows_of(const GemmBf16Args& g, const PackedMxfp4Shape& s, const PackedMxfp4View& w, const Decoder& d, const Mxfp4RowDigits* rows,
             const Mxfp4RowsToWrite* write) {
  constexpr int kPanels = kPanelsFor<R>;
  int panel = g.panel_begin;
  // The first block call writes the digits (write != nullptr), the others read them.
  for (; panel + kPanels <= g.panel_end; panel += kPanels, write = nullptr) block<R, kPanels>(g, s, w, d, rows, write, panel);
  if constexpr (kPanels == 4) {
    switch (g.panel_end - panel) {
      case 3: block<R, 3>(g, s, w, d, rows, write, panel); break;
      case 2: block<R, 2>(g, s, w, d, rows, write, panel); break;
      case 1: block<R, 1>(g, s, w, d, rows, write, panel); break;
      default: break;
    }
  } else if (panel < g.panel_end) {
    block<R, 1>(g, s, w, d, rows, write, panel);
  }
}

}  // namespace

void gemm_mxfp4_rows_avx512(const GemmBf16Args& g, const PackedMxfp4Shape& s, const PackedMxfp4View& w) {
  thread_local Mxfp4RowDigitsCache cache;
  const Decoder d;
  run_mxfp4_rows(g, s.kblocks, cache, [&](auto rows_count, const Mxfp4RowDigits* rows, const Mxfp4RowsToWrite* write) {
    rows_of<decltype(rows_count)::value>(g, s, w, d, rows, write);
  });
}

}  // namespace tilemoe::kernels
