#pragma once
// pack_strided_f32 against pack_weights_with (the element-by-element packer): the same bits for
// rows along k (the forward's factors), along n (the backward's transposed ones) and any other
// strides, over awkward sizes. Included by one test file per conversion routine.
#include <random>
#include <vector>

#include "amx/pack_strided.hpp"
#include "catch.hpp"

namespace tilemoe::test {

inline void run_pack_strided_grid(kernels::ConvertRowFn convert) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<bf16> scratch;
  for (int n : {1, 5, 16, 17, 33, 100, 1408})
    for (int k : {1, 2, 15, 16, 31, 32, 33, 64, 100}) {
      // row_stride, col_stride of three layouts: rows along k, rows along n, both strided.
      const std::size_t ld_k = static_cast<std::size_t>(k) + 3, ld_n = static_cast<std::size_t>(n) + 5;
      std::vector<float> data(std::max(static_cast<std::size_t>(n) * ld_k, static_cast<std::size_t>(k) * ld_n) * 2 + 8);
      for (float& v : data) v = dist(rng);
      const kernels::StridedF32 layouts[3] = {{data.data(), ld_k, 1}, {data.data(), 1, ld_n}, {data.data() + 1, 2 * ld_k, 2}};
      for (int l = 0; l < 3; ++l) {
        INFO("n " << n << " k " << k << " layout " << l);
        const kernels::StridedF32 w = layouts[l];
        std::vector<bf16> want(kernels::packed_bf16_elements(n, k)), got(want.size(), bf16{0x5555});
        kernels::pack_weights_with(n, k, want.data(), [&](int c, int kk) { return float_to_bf16(w.at(c, kk)); });
        kernels::pack_strided_f32(w, n, k, got.data(), convert, scratch);
        REQUIRE(got == want);
      }
    }
}

}  // namespace tilemoe::test
