#pragma once
// pack_strided against pack_weights_with (the element-by-element packer): the same bits for
// rows along k (the forward's factors), along n (the backward's transposed ones) and any other
// strides, over awkward sizes, with NaN, infinities, denormals and round-to-even ties among the
// values. Included by one test file per ISA.
#include <cmath>
#include <iterator>
#include <random>
#include <vector>

#include "amx/pack_strided.hpp"
#include "catch.hpp"

namespace tilemoe::test {

inline void run_pack_strided_grid(kernels::PackStridedFn pack) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<bf16> scratch;
  for (int n : {1, 5, 16, 17, 33, 100, 1408})
    for (int k : {1, 2, 15, 16, 17, 31, 32, 33, 64, 100, 130}) {
      // row_stride, col_stride of three layouts: rows along k, rows along n, both strided.
      const std::size_t ld_k = static_cast<std::size_t>(k) + 3, ld_n = static_cast<std::size_t>(n) + 5;
      std::vector<float> data(std::max(static_cast<std::size_t>(n) * ld_k, static_cast<std::size_t>(k) * ld_n) * 2 + 8);
      for (float& v : data) v = dist(rng);
      const float specials[] = {NAN, -NAN, INFINITY, -INFINITY, 1e-40f, -1e-40f, 1.00390625f, 1.01171875f, 0.0f, -0.0f, 3.0e38f};
      for (std::size_t i = 0; i < data.size(); i += 13) data[i] = specials[(i / 13) % std::size(specials)];
      std::vector<bf16> data16(data.size());
      for (std::size_t i = 0; i < data.size(); ++i) data16[i] = float_to_bf16(data[i]);
      for (std::size_t i = 5; i < data16.size(); i += 29) data16[i] = bf16{0x7f81};  // a signalling NaN: copied as it is
      const kernels::StridedFactor layouts[6] = {{data.data(), ld_k, 1},   {data.data(), 1, ld_n},   {data.data() + 1, 2 * ld_k, 2},
                                                 {data16.data(), ld_k, 1}, {data16.data(), 1, ld_n}, {data16.data() + 1, 2 * ld_k, 2}};
      for (int l = 0; l < 6; ++l) {
        INFO("n " << n << " k " << k << " layout " << l % 3 << (l < 3 ? " f32" : " bf16"));
        const kernels::StridedFactor w = layouts[l];
        const bf16* raw = w.is_bf16() ? w.as<bf16>() : nullptr;
        std::vector<bf16> want(kernels::packed_bf16_elements(n, k)), got(want.size(), bf16{0x5555});
        kernels::pack_weights_with(n, k, want.data(), [&](int c, int kk) { return raw ? raw[w.index(c, kk)] : float_to_bf16(w.at(c, kk)); });
        pack(w, n, k, got.data(), scratch);
        REQUIRE(got == want);
      }
    }
}

}  // namespace tilemoe::test
