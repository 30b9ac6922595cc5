#include "amx/convert_bf16.hpp"

namespace tilemoe::kernels {

void convert_to_bf16_portable(const float* src, std::size_t n, float scale, bf16* dst) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = float_to_bf16(scale * src[i]);
}

}  // namespace tilemoe::kernels
