#include <cmath>

#include "amx/activation.hpp"

namespace tilemoe::kernels {
namespace {

// g * sigmoid(alpha g); -inf / (1 + inf) would be NaN, the limit is -0. alpha 1 computes what the
// plain form always did (alpha * g is g).
inline float silu(float g, float alpha) { return g == -INFINITY ? -0.0f : g / (1.0f + std::exp(-(alpha * g))); }
// up + up_offset, leaving u (and the sign of a zero) as it is without an offset.
inline float offset_up(float u, float offset) { return offset != 0.0f ? u + offset : u; }

// The clamps of a swiglu_limit L > 0, as torch.clamp: NaN stays NaN.
inline float clamp_gate(float g, float limit) { return limit > 0.0f && g > limit ? limit : g; }
inline float clamp_up(float u, float limit) {
  if (!(limit > 0.0f)) return u;
  return u > limit ? limit : u < -limit ? -limit : u;
}

}  // namespace

void silu_mul_bf16_portable(const float* gate, std::size_t ldg, const float* up, std::size_t ldu, int m, int n,
                            bf16* h, std::size_t ldh, SwigluForm form) {
  const float limit = form.limit;
  for (int i = 0; i < m; ++i) {
    const float* gi = gate + i * ldg;
    const float* ui = up + i * ldu;
    bf16* hi = h + i * ldh;
    for (int j = 0; j < n; ++j) {
      hi[j] = float_to_bf16(silu(clamp_gate(gi[j], limit), form.alpha) * offset_up(clamp_up(ui[j], limit), form.up_offset));
    }
  }
}

void silu_mul_backward_portable(const float* dh, std::size_t ldd, const bf16* gate, const bf16* up, std::size_t ldgu, int m, int n,
                                bf16* dgate, bf16* dup, std::size_t ldo, bf16* h, std::size_t ldh, SwigluForm form) {
  const float limit = form.limit, alpha = form.alpha;
  for (int i = 0; i < m; ++i) {
    const float* di = dh + i * ldd;
    const bf16* gi = gate + i * ldgu;
    const bf16* ui = up + i * ldgu;
    for (int j = 0; j < n; ++j) {
      const float g0 = bf16_to_float(gi[j]), u0 = bf16_to_float(ui[j]), d = di[j];
      const float g = clamp_gate(g0, limit), u = offset_up(clamp_up(u0, limit), form.up_offset);
      // torch.clamp's gradient: passed where the input lies within the bounds (bounds included),
      // else 0 (a NaN input included).
      const bool pass_g = !(limit > 0.0f) || g0 <= limit;
      const bool pass_u = !(limit > 0.0f) || (u0 <= limit && u0 >= -limit);
      const float s = 1.0f / (1.0f + std::exp(-(alpha * g)));
      dup[i * ldo + j] = float_to_bf16(pass_u ? d * (g * s) : 0.0f);
      dgate[i * ldo + j] = float_to_bf16(pass_g ? d * u * (s * (1.0f + alpha * g * (1.0f - s))) : 0.0f);
      // The forward's h, bit for bit.
      if (h) h[i * ldh + j] = float_to_bf16(silu(g, alpha) * u);
    }
  }
}

void keep_clamp_sides_portable(const float* values, std::size_t ldv, int m, int n, bf16* saved, std::size_t lds, float limit,
                               bool two_sided) {
  const ClampBoundBf16 b = clamp_bound_bf16(limit);
  const bf16 sign = 0x8000;
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      const float v = values[i * ldv + j];
      bf16& s = saved[i * lds + j];
      const float r = bf16_to_float(s);
      if (v > limit && !(r > limit)) s = b.above;
      else if (!(v > limit) && r > limit) s = b.at_or_below;
      if (!two_sided) continue;
      if (v < -limit && !(r < -limit)) s = static_cast<bf16>(b.above | sign);
      else if (!(v < -limit) && r < -limit) s = static_cast<bf16>(b.at_or_below | sign);
    }
}

}  // namespace tilemoe::kernels
