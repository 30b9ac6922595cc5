// What every ISA's integer kernel shares (the *_portable files are compiled twice, for baseline
// x86-64 and for AVX2, so these live apart from them).
#include <algorithm>
#include <vector>

#include "amx/gemm_int.hpp"

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

}  // namespace tilemoe::kernels
