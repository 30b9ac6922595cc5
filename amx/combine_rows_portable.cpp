#include "amx/combine_rows.hpp"

namespace tilemoe::kernels {

void combine_bf16_rows_portable(const bf16* const* rows, const float* weights, int count, std::size_t width, float* out) {
  for (std::size_t c = 0; c < width; ++c) out[c] = 0.0f;
  for (int j = 0; j < count; ++j) {
    const bf16* y = rows[j];
    const float w = weights ? weights[j] : 1.0f;
    for (std::size_t c = 0; c < width; ++c) out[c] += w * bf16_to_float(y[c]);
  }
}

}  // namespace tilemoe::kernels
