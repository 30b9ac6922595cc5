#pragma once
// What the integer MXFP4 decode rows kernels (gemm_mxfp4_rows_avx512.cpp, _avx2.cpp) make of their
// activation rows, the per-thread cache that keeps it between the calls of a decode item (gate,
// then up, on the same rows), and the entry both kernels share around their ISA's block calls.
// The digits' meaning is gemm_mxfp4_rows_avx512.cpp's (its top comment): each k-block of a row as
// integers q = x / step, q = 128 h + l, the high digits h then the low digits l in the weight
// lanes' input order, with step / 2 and 12 * sum q beside them.
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "amx/aligned_vector.hpp"
#include "amx/gemm_mxfp4.hpp"

namespace tilemoe::kernels {

inline constexpr int kMxfp4DigitBytes = 64;  // a row's k-block: 32 high digits, then 32 low digits
inline constexpr int kMxfp4WeightOffset = 12;  // the weights are looked up as 2 * E2M1 + 12

// One row's activations as the kernel reads them.
struct Mxfp4RowDigits {
  std::int8_t* digits;        // kblocks x kMxfp4DigitBytes
  float* steps;               // kblocks: step / 2 (the weights are looked up doubled)
  std::int32_t* corrections;  // kblocks: 12 * sum q
};

// Rows whose digits a block call writes as it goes (the first call on new rows), with the copy of
// their bf16 values the cache compares later calls against.
struct Mxfp4RowsToWrite {
  const bf16* a[kMxfp4RowsMaxRows];
  bf16* source[kMxfp4RowsMaxRows];
};

// 2^p for p in [-149, 127], from the bits (std::ldexp is a library call, and this runs for every
// k-block of every row a decode call reads).
inline float mxfp4_power_of_two(int p) {
  const std::uint32_t bits = p >= -126 ? static_cast<std::uint32_t>(p + 127) << 23 : std::uint32_t{1} << (p + 149);
  float v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

// The rows' digits, kept by each thread with the bf16 rows they were made from.
struct Mxfp4RowDigitsCache {
  int m = 0, kblocks = 0;
  AlignedVector<bf16> source;  // m x kblocks * 32
  AlignedVector<std::int8_t> digits;
  AlignedVector<float> steps;
  AlignedVector<std::int32_t> corrections;

  bool holds(const GemmBf16Args& g, int kb) const {
    if (g.m != m || kb != kblocks) return false;
    const std::size_t k = static_cast<std::size_t>(kb) * kBlockK;
    for (int i = 0; i < m; ++i)
      if (std::memcmp(g.a + static_cast<std::size_t>(i) * g.lda, source.data() + static_cast<std::size_t>(i) * k, k * sizeof(bf16)) != 0)
        return false;
    return true;
  }

  // Sized for g's rows, which the first block call then writes (Mxfp4RowsToWrite).
  void prepare(const GemmBf16Args& g, int kb, Mxfp4RowsToWrite& write) {
    const std::size_t k = static_cast<std::size_t>(kb) * kBlockK, blocks = static_cast<std::size_t>(kb);
    grow_to(source, static_cast<std::size_t>(g.m) * k);
    grow_to(digits, static_cast<std::size_t>(g.m) * blocks * kMxfp4DigitBytes);
    grow_to(steps, static_cast<std::size_t>(g.m) * blocks);
    grow_to(corrections, static_cast<std::size_t>(g.m) * blocks);
    for (int i = 0; i < g.m; ++i) {
      write.a[i] = g.a + static_cast<std::size_t>(i) * g.lda;
      write.source[i] = source.data() + static_cast<std::size_t>(i) * k;
    }
    m = g.m;
    kblocks = kb;
  }

  Mxfp4RowDigits row(int i) {
    const std::size_t blocks = static_cast<std::size_t>(kblocks);
    return {digits.data() + static_cast<std::size_t>(i) * blocks * kMxfp4DigitBytes, steps.data() + i * blocks,
            corrections.data() + i * blocks};
  }
};

// A block call's step at k-block kb when it is the first on new rows (write != nullptr): each of
// its R rows' digits there, made by the ISA's WriteBlockDigits(x, kb, digits, steps, corrections)
// beside the weights' stream so the stream does not wait for them, and the bf16 values they came
// from, which later calls compare against.
template <int R, auto WriteBlockDigits>
inline void write_rows_block(const Mxfp4RowDigits* rows, const Mxfp4RowsToWrite* write, int kb) {
  if (write == nullptr) return;
  const std::size_t at = static_cast<std::size_t>(kb) * kBlockK;
#pragma GCC unroll 4
  for (int i = 0; i < R; ++i) {
    const Mxfp4RowDigits& r = rows[i];
    WriteBlockDigits(write->a[i], kb, r.digits, r.steps, r.corrections);
    std::memcpy(write->source[i] + at, write->a[i] + at, kBlockK * sizeof(bf16));
  }
}

// A rows kernel's entry: finds g's rows in the thread's cache, or has the first block call write
// them, then calls rows_of(std::integral_constant<int, R>, rows, write) for g's R = g.m rows.
template <typename RowsOf>
inline void run_mxfp4_rows(const GemmBf16Args& g, int kblocks, Mxfp4RowDigitsCache& cache, RowsOf rows_of) {
  Mxfp4RowsToWrite to_write;
  const Mxfp4RowsToWrite* write = nullptr;
  if (g.panel_begin < g.panel_end && !cache.holds(g, kblocks)) {
    cache.prepare(g, kblocks, to_write);
    write = &to_write;
  }
  Mxfp4RowDigits rows[kMxfp4RowsMaxRows];
  for (int i = 0; i < g.m; ++i) rows[i] = cache.row(i);
  switch (g.m) {
    case 4: rows_of(std::integral_constant<int, 4>{}, rows, write); break;
    case 3: rows_of(std::integral_constant<int, 3>{}, rows, write); break;
    case 2: rows_of(std::integral_constant<int, 2>{}, rows, write); break;
    case 1: rows_of(std::integral_constant<int, 1>{}, rows, write); break;
    default: break;
  }
}

}  // namespace tilemoe::kernels
