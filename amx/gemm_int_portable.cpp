// The integer GEMM on plain C++: the definition every faster kernel is tested against, and the
// path for CPUs without AVX512-VNNI.
#include <algorithm>
#include <cmath>
#include <vector>

#include "amx/gemm_int.hpp"
#include "tilemoe/bf16.hpp"

namespace tilemoe::kernels {

GemmIntArgs with_int_a_rows(const GemmIntArgs& args) {
  if (!args.a_tiles) return args;
  thread_local std::vector<std::int8_t> rows;
  const std::size_t k_padded = static_cast<std::size_t>(args.shape.k_padded);
  rows.resize(static_cast<std::size_t>(std::max(args.m, 0)) * k_padded);
  unpack_int8_tiles_to_rows(args.a, args.m, args.shape.k_padded, rows.data(), k_padded);
  GemmIntArgs by_rows = args;
  by_rows.a = rows.data();
  by_rows.lda = k_padded;
  by_rows.a_tiles = false;
  return by_rows;
}

void add_second_product(const GemmIntArgs& args, GemmBf16Fn gemm) {
  if (!args.has_second() || args.m <= 0) return;
  GemmBf16Args g = gemm_args(nullptr, 0, args.m, 0, nullptr, args.panel_begin, args.panel_end, args.c, args.ldc);
  g.a2 = args.a2;
  g.lda2 = args.lda2;
  g.k2_padded = args.k2_padded;
  g.packed_b2 = args.packed_b2;
  g.b2_panel_stride = args.b2_panel_stride;
  g.accumulate = true;
  gemm(g);
}

void write_int_result_bf16(const GemmIntArgs& args, ConvertToBf16Fn convert) {
  if (args.y == nullptr || args.m <= 0 || args.panel_end <= args.panel_begin) return;
  const std::size_t n = static_cast<std::size_t>(args.panel_end - args.panel_begin) * 16;
  convert_rows_to_bf16(convert, args.c, args.ldc, args.m, n, 1.0f, args.y, args.ldy);
}

void gemm_int_portable(const GemmIntArgs& args) {
  const GemmIntArgs g = with_int_a_rows(args);
  const PackedIntShape& s = g.shape;
  for (int i = 0; i < g.m; ++i) {
    const std::int8_t* a = g.a + g.lda * static_cast<std::size_t>(i);
    for (int nb = g.panel_begin; nb < g.panel_end; ++nb) {
      for (int c = 0; c < 16; ++c) {
        const int col = nb * 16 + c;
        float sum = 0.0f;
        for (int grp = 0; grp < s.groups; ++grp) {
          const int k0 = grp * s.group, k1 = std::min(s.k_padded, k0 + s.group);
          std::int32_t acc = 0;
          for (int kk = k0; kk < k1; ++kk) acc += static_cast<std::int32_t>(a[kk]) * packed_int_code(s, g.b.codes, col, kk);
          sum += static_cast<float>(acc) * g.b.scales[(static_cast<std::size_t>(nb) * s.groups + grp) * 16 + c];
        }
        float& out = g.c[g.ldc * static_cast<std::size_t>(i) + (nb - g.panel_begin) * 16 + c];
        const float v = g.a_scale[i] * sum;
        out = g.accumulate ? out + v : v;
      }
    }
  }
  add_second_product(args, gemm_bf16_portable);
  write_int_result_bf16(args, convert_to_bf16_portable);
}

void quantize_rows_portable(const std::uint16_t* x, std::size_t ldx, int rows, int k, int k_padded, std::int8_t* codes,
                            std::size_t ldq, float* scales) {
  for (int i = 0; i < rows; ++i) {
    const std::uint16_t* xi = x + ldx * static_cast<std::size_t>(i);
    std::int8_t* qi = codes + ldq * static_cast<std::size_t>(i);
    float amax = 0.0f;
    bool finite = true;
    for (int kk = 0; kk < k; ++kk) {
      const float v = bf16_to_float(xi[kk]);
      finite = finite && std::isfinite(v);
      amax = std::max(amax, std::fabs(v));
    }
    std::fill(qi, qi + k_padded, std::int8_t{0});
    if (!finite) {
      scales[i] = std::nanf("");
      continue;
    }
    scales[i] = amax / 127.0f;
    if (amax == 0.0f) continue;
    const float inv = 127.0f / amax;
    for (int kk = 0; kk < k; ++kk)
      qi[kk] = static_cast<std::int8_t>(std::clamp(std::nearbyint(bf16_to_float(xi[kk]) * inv), -127.0f, 127.0f));
  }
}

}  // namespace tilemoe::kernels
