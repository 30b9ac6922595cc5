// The integer GEMM on plain C++, the path for CPUs without AVX512-VNNI: each packed block is read
// once per group of rows, in the order it is stored (as the bf16 portable kernel does). The
// kernel grids check it, as every integer kernel, against a double reference.
#include <algorithm>
#include <cstring>

#include "amx/gemm_int.hpp"
#include "tilemoe/bf16.hpp"

namespace tilemoe::kernels {

namespace {

constexpr int kRows = 4;  // rows that share each block's codes while the block is in L1

// Quad row r of a packed block (pack_int.hpp) as 64 int8 codes, byte c*4 + p = Q[c][4r + p].
inline void quad_row_codes(int bits, const std::uint8_t* block, int r, std::int8_t (&w)[64]) {
  if (bits == 8) {
    std::memcpy(w, block + r * 64, 64);
    return;
  }
  const std::uint8_t* raw = block + (r / 2) * 64;
  const int shift = (r & 1) * 4;
  for (int j = 0; j < 64; ++j) w[j] = static_cast<std::int8_t>(((raw[j] >> shift) & 0x0f) - 8);
}

// The 64 products of a quad row go into 64 int32 lanes (lane c*4 + p), so that every loop is
// element by element and the compiler vectorises it on any x86-64; a column's four lanes are
// summed once per scale group. The sums are those of the definition: exact int32 per group,
// scaled per group in order, then by the row's scale.
template <int R>
void row_group(const GemmIntArgs& g, int row0) {
  const PackedIntShape& s = g.shape;
  for (int nb = g.panel_begin; nb < g.panel_end; ++nb) {
    const std::uint8_t* panel = g.b.codes + static_cast<std::size_t>(nb) * s.panel_bytes();
    const float* scales = g.b.scales + static_cast<std::size_t>(nb) * s.groups * 16;
    float sum[R][16] = {};
    std::int32_t acc[R][64] = {};
    int group = 0;
    auto flush = [&] {
      for (int i = 0; i < R; ++i) {
        for (int c = 0; c < 16; ++c) {
          const std::int32_t col = acc[i][4 * c] + acc[i][4 * c + 1] + acc[i][4 * c + 2] + acc[i][4 * c + 3];
          sum[i][c] += static_cast<float>(col) * scales[group * 16 + c];
        }
        std::fill(acc[i], acc[i] + 64, 0);
      }
    };
    for (int kb = 0; kb < s.kblocks; ++kb) {
      const std::uint8_t* block = panel + static_cast<std::size_t>(kb) * s.block_bytes();
      for (int r = 0; r < 16; ++r) {
        const int quad_group = (kb * kIntBlockK + 4 * r) / s.group;  // groups hold whole quads
        if (quad_group != group) {
          flush();
          group = quad_group;
        }
        std::int8_t w[64];
        quad_row_codes(s.bits, block, r, w);
        for (int i = 0; i < R; ++i) {
          const std::int8_t* a = g.a + g.lda * static_cast<std::size_t>(row0 + i) + kb * kIntBlockK + 4 * r;
          // The row's four codes repeated over the 64 lanes: a broadcast of one 32-bit word, where
          // a[j & 3] stayed a scalar loop.
          std::uint32_t quad, repeated[16];
          std::memcpy(&quad, a, 4);
          for (int t = 0; t < 16; ++t) repeated[t] = quad;
          std::int8_t a_lanes[64];
          std::memcpy(a_lanes, repeated, 64);
          for (int j = 0; j < 64; ++j) acc[i][j] += a_lanes[j] * w[j];
        }
      }
    }
    flush();
    for (int i = 0; i < R; ++i) {
      float* out = g.c + g.ldc * static_cast<std::size_t>(row0 + i) + (nb - g.panel_begin) * 16;
      for (int c = 0; c < 16; ++c) {
        const float v = g.a_scale[row0 + i] * sum[i][c];
        out[c] = g.accumulate ? out[c] + v : v;
      }
    }
  }
}

}  // namespace

void gemm_int_portable(const GemmIntArgs& args) {
  const GemmIntArgs g = with_int_a_rows(args);
  int row = 0;
  for (; row + kRows <= g.m; row += kRows) row_group<kRows>(g, row);
  switch (g.m - row) {
    case 3: row_group<3>(g, row); break;
    case 2: row_group<2>(g, row); break;
    case 1: row_group<1>(g, row); break;
    default: break;
  }
  add_second_product(args, gemm_bf16_portable);
  write_int_result_bf16(args, convert_to_bf16_portable);
}

}  // namespace tilemoe::kernels
