// The LoRA gradient outer products as plain loops: the reference for the vector version and the
// path for CPUs without AVX-512. One (q, chunk of o) at a time: the f32 sums over rows live in a
// stack row that the compiler vectorises along o, then go into g in either layout.
#include <algorithm>

#include "amx/lora_grad.hpp"

namespace tilemoe::kernels {

void lora_grad_outer_portable(const bf16* v, std::size_t ldv, const int* v_rows, const float* u, std::size_t ldu, int rows, int n,
                              int rank, GradTarget g, std::size_t ldg, bool rank_major, bool overwrite) {
  if (rows <= 0) return;
  constexpr int kChunk = 256;
  float sum[kChunk];
  for (int q = 0; q < rank; ++q) {
    for (int o0 = 0; o0 < n; o0 += kChunk) {
      const int len = std::min(kChunk, n - o0);
      std::fill(sum, sum + len, 0.0f);
      for (int i = 0; i < rows; ++i) {
        const float uq = u[static_cast<std::size_t>(i) * ldu + q];
        const bf16* vi = v + static_cast<std::size_t>(v_rows ? v_rows[i] : i) * ldv + o0;
        for (int o = 0; o < len; ++o) sum[o] += uq * bf16_to_float(vi[o]);
      }
      for (int o = 0; o < len; ++o) {
        const std::size_t at = rank_major ? static_cast<std::size_t>(q) * ldg + o0 + o
                                          : static_cast<std::size_t>(o0 + o) * ldg + q;
        if (g.is_bf16()) {
          bf16& t = g.bf16s()[at];
          t = float_to_bf16(overwrite ? sum[o] : bf16_to_float(t) + sum[o]);
        } else {
          float& t = g.f32()[at];
          t = overwrite ? sum[o] : t + sum[o];
        }
      }
    }
  }
}

}  // namespace tilemoe::kernels
