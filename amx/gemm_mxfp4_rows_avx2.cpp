// MXFP4 decode rows with AVX2 on integer products: gemm_mxfp4_rows_avx512.cpp's method (its top
// comment says what the digits and the looked-up weights are) with VPMADDUBSW + VPMADDWD where
// AVX-512 has VPDPBUSD. A ymm holds 8 of a panel's 16 columns (a half line), so a block call's unit
// is a half panel: 4 of them for one row, 2 for two rows, 1 for three or four (an int32 sum and an
// f32 sum a row and half panel stay in registers).
//
// Without this kernel avx2 decode dequantized 4 panels x 8 k-blocks into L1 and ran the bf16
// kernel over them, about one vector operation a weight, at 3.7 times the floor on a Zen 3.
//
// VPMADDUBSW saturates its word sums: here each is two products of a looked-up weight (0..24) and
// a digit (-128..127), |.| <= 6144, and two such words are added, <= 12288: no word saturates.
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <limits>

#include "amx/gemm_mxfp4.hpp"
#include "amx/mxfp4_row_digits.hpp"

namespace tilemoe::kernels {
namespace {

// Each stream asks for its codes 8 blocks (2 KiB) ahead: on a Zen 3 (2 vCPUs, KVM) at the AVX-512
// kernel's 2 blocks one token took 1.8-2.0 ms (V2-Lite's shape), at 8 1.2-1.7, at 16 about as 8.
constexpr int kPrefetchBlocks = 8;
// Each panel's exponents (16 bytes a k-block, a line every 4 k-blocks) are asked for 8 k-blocks
// ahead, as the AVX-512 kernel does: only the flush reads them.
constexpr int kExponentAheadBlocks = 8;
constexpr int kHalfColumns = 8;

// Half panels a block call reads at once.
template <int R>
constexpr int kHalvesFor = R == 1 ? 4 : R == 2 ? 2 : 1;

inline std::uint32_t horizontal_max_u32(__m256i v) {
  __m128i m = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4e));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xb1));
  return static_cast<std::uint32_t>(_mm_cvtsi128_si32(m));
}

inline std::int32_t horizontal_sum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// The 32 int32 of v[0..3], each in [-128, 127], as 32 bytes in order.
inline void store_as_bytes(std::int8_t* d, __m256i v0, __m256i v1, __m256i v2, __m256i v3) {
  // The packs work in 128-bit lanes: dword i of `bytes` is v[i % 4]'s lanes 4 (i / 4) .. + 3.
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(v0, v1), _mm256_packs_epi32(v2, v3));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(d), _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

// k-block kb of x as Mxfp4RowDigits; reads x's 32 values there. The same digits as the AVX-512
// kernel's.
inline void write_block_digits(const bf16* x, int kb, std::int8_t* digits, float* steps, std::int32_t* corrections) {
  const bf16* block = x + static_cast<std::size_t>(kb) * kBlockK;
  const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
  __m256i bits[4], largest = _mm256_setzero_si256();
  for (int g = 0; g < 4; ++g) {  // inputs 8g .. 8g + 7
    bits[g] = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 8 * g))), 16);
    // Magnitudes order as unsigned integers; a NaN's bits are above every finite value's.
    largest = _mm256_max_epu32(largest, _mm256_and_si256(bits[g], magnitude));
  }
  const int e = static_cast<int>(horizontal_max_u32(largest) >> 23);
  std::int8_t* d = digits + static_cast<std::size_t>(kb) * kMxfp4DigitBytes;
  if (e == 255) {
    std::memset(d, 0, kMxfp4DigitBytes);
    steps[kb] = std::numeric_limits<float>::quiet_NaN();
    corrections[kb] = 0;
    return;
  }
  // x * 2^(140 - e) in two exact steps (AVX-512 has VSCALEFPS): 2^140 itself is no f32. Both factors
  // have the sign of 140 - e, so the first product is never below the final one where that matters
  // (a first product that is subnormal makes a final one below 2^-126, which rounds to 0 anyway).
  const int up = 140 - e;
  const __m256 first = _mm256_set1_ps(mxfp4_power_of_two(up / 2)), second = _mm256_set1_ps(mxfp4_power_of_two(up - up / 2));
  // Within each group of 8 inputs, the order of the weight lanes' bytes: low nibbles, then high.
  const __m256i lane_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  __m256i q[4], high[4], low[4], sum = _mm256_setzero_si256();
  for (int g = 0; g < 4; ++g) {
    const __m256 scaled = _mm256_mul_ps(_mm256_mul_ps(_mm256_castsi256_ps(bits[g]), first), second);
    q[g] = _mm256_permutevar8x32_epi32(_mm256_cvtps_epi32(scaled), lane_order);
    high[g] = _mm256_srai_epi32(q[g], 7);
    low[g] = _mm256_and_si256(q[g], _mm256_set1_epi32(127));
    sum = _mm256_add_epi32(sum, q[g]);
  }
  store_as_bytes(d, high[0], high[1], high[2], high[3]);
  store_as_bytes(d + 32, low[0], low[1], low[2], low[3]);
  steps[kb] = mxfp4_power_of_two(e - 141);
  corrections[kb] = kMxfp4WeightOffset * horizontal_sum_i32(sum);
}

struct Decoder {
  // 2 * E2M1 + 12 for each code: 0..7 the positive values, 8..15 the negative ones.
  __m256i table = _mm256_broadcastsi128_si256(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  __m256i low4 = _mm256_set1_epi8(0x0f);
  __m256i least_scale = _mm256_set1_epi32(0x00400000);  // 2^-127, E8M0's exponent 0, as an f32 subnormal
  __m256i ones = _mm256_set1_epi16(1);
  __m256i high_weight = _mm256_set1_epi16(128);  // q = 128 h + l

  __m256i low(__m256i line) const { return _mm256_shuffle_epi8(table, _mm256_and_si256(line, low4)); }
  __m256i high(__m256i line) const { return _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(line, 4), low4)); }

  // 2^(e - 127) as f32 for each of 8 columns' exponents e (255 gives infinity, as on AVX-512).
  __m256 scales(const std::uint8_t* exponents) const {
    const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(exponents)));
    return _mm256_castsi256_ps(_mm256_max_epu32(_mm256_slli_epi32(e, 23), least_scale));
  }
};

inline __m256i broadcast_digits(const std::int8_t* p) {
  std::int32_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm256_set1_epi32(v);
}

// Half panels half0 .. half0 + H - 1 (half h: panel h / 2, its columns 8 (h % 2) .. + 7) for R rows.
template <int R, int H>
__attribute__((noinline)) void block(const GemmBf16Args& g, const PackedMxfp4Shape& s, const PackedMxfp4View& w, const Decoder& d,
                                     const Mxfp4RowDigits* rows, const Mxfp4RowsToWrite* write, int half0) {
  __m256 acc[R][H];
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int h = 0; h < H; ++h) acc[i][h] = _mm256_setzero_ps();
  const std::size_t code_stride = static_cast<std::size_t>(s.kblocks) * kMxfp4BlockCodeBytes;
  const std::size_t exponent_stride = static_cast<std::size_t>(s.kblocks) * kMxfp4BlockExponentBytes;
  const std::uint8_t* codes0[H];
  const std::uint8_t* exponents0[H];
#pragma GCC unroll 4
  for (int h = 0; h < H; ++h) {
    const int panel = (half0 + h) / 2, column0 = ((half0 + h) % 2) * kHalfColumns;
    codes0[h] = w.codes + static_cast<std::size_t>(panel) * code_stride + column0 * 4;  // 4 code bytes a column in a line
    exponents0[h] = w.exponents + static_cast<std::size_t>(panel) * exponent_stride + column0;
  }
  for (int kb = 0; kb < s.kblocks; ++kb) {
    if (kb % 4 == 0) {  // a new line of exponents every 4 k-blocks; a prefetch past the matrix never faults
#pragma GCC unroll 4
      for (int h = 0; h < H; ++h)
        _mm_prefetch(reinterpret_cast<const char*>(exponents0[h] + static_cast<std::size_t>(kb + kExponentAheadBlocks) * kMxfp4BlockExponentBytes),
                     _MM_HINT_T0);
    }
    write_rows_block<R, write_block_digits>(rows, write, kb);
    __m256i sum[R][H];
#pragma GCC unroll 4
    for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
      for (int h = 0; h < H; ++h) sum[i][h] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
#pragma GCC unroll 4
      for (int h = 0; h < H; ++h) {
        const std::uint8_t* line_at = codes0[h] + static_cast<std::size_t>(kb) * kMxfp4BlockCodeBytes + j * 64;
        _mm_prefetch(reinterpret_cast<const char*>(line_at + kPrefetchBlocks * kMxfp4BlockCodeBytes), _MM_HINT_T0);
        const __m256i line = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(line_at));
        const __m256i lo = d.low(line), hi = d.high(line);
#pragma GCC unroll 4
        for (int i = 0; i < R; ++i) {
          const std::int8_t* digit = rows[i].digits + static_cast<std::size_t>(kb) * kMxfp4DigitBytes + 8 * j;
          const __m256i high16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, broadcast_digits(digit)),
                                                  _mm256_maddubs_epi16(hi, broadcast_digits(digit + 4)));
          const __m256i low16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, broadcast_digits(digit + 32)),
                                                 _mm256_maddubs_epi16(hi, broadcast_digits(digit + 36)));
          sum[i][h] = _mm256_add_epi32(sum[i][h], _mm256_add_epi32(_mm256_madd_epi16(high16, d.high_weight), _mm256_madd_epi16(low16, d.ones)));
        }
      }
    }
#pragma GCC unroll 4
    for (int h = 0; h < H; ++h) {
      const __m256 scale = d.scales(exponents0[h] + static_cast<std::size_t>(kb) * kMxfp4BlockExponentBytes);
#pragma GCC unroll 4
      for (int i = 0; i < R; ++i) {
        const Mxfp4RowDigits& r = rows[i];
        const __m256i exact = _mm256_sub_epi32(sum[i][h], _mm256_set1_epi32(r.corrections[kb]));
        const __m256 part = _mm256_mul_ps(_mm256_cvtepi32_ps(exact), _mm256_set1_ps(r.steps[kb]));
        acc[i][h] = _mm256_fmadd_ps(part, scale, acc[i][h]);
      }
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int h = 0; h < H; ++h) {
      float* c = g.c + static_cast<std::size_t>(i) * g.ldc + static_cast<std::size_t>(half0 + h - 2 * g.panel_begin) * kHalfColumns;
      _mm256_storeu_ps(c, g.accumulate ? _mm256_add_ps(_mm256_loadu_ps(c), acc[i][h]) : acc[i][h]);
    }
}

template <int R>
void rows_of(const GemmBf16Args& g, const PackedMxfp4Shape& s, const PackedMxfp4View& w, const Decoder& d, const Mxfp4RowDigits* rows,
             const Mxfp4RowsToWrite* write) {
  constexpr int kHalves = kHalvesFor<R>;
  const int half_end = 2 * g.panel_end;
  int half = 2 * g.panel_begin;
  // The first block call writes the digits (write != nullptr), the others read them.
  for (; half + kHalves <= half_end; half += kHalves, write = nullptr) block<R, kHalves>(g, s, w, d, rows, write, half);
  if constexpr (kHalves == 4) {
    if (half < half_end) block<R, 2>(g, s, w, d, rows, write, half);  // a panel is two halves: 2 are left
  }
}

}  // namespace

void gemm_mxfp4_rows_avx2(const GemmBf16Args& g, const PackedMxfp4Shape& s, const PackedMxfp4View& w) {
  thread_local Mxfp4RowDigitsCache cache;
  const Decoder d;
  run_mxfp4_rows(g, s.kblocks, cache, [&](auto rows_count, const Mxfp4RowDigits* rows, const Mxfp4RowsToWrite* write) {
    rows_of<decltype(rows_count)::value>(g, s, w, d, rows, write);
  });
}

}  // namespace tilemoe::kernels
