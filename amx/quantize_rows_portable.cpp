// Per-row int8 quantization of activations in plain C++ (gemm_int.hpp has the definition). Also
// compiled for AVX2 as quantize_rows_avx2 (CMakeLists.txt).
#include <algorithm>
#include <cmath>

#include "amx/gemm_int.hpp"
#include "tilemoe/bf16.hpp"

namespace tilemoe::kernels {

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
