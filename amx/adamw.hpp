#pragma once
// One AdamW update of n f32 parameters in place, in the order of operations torch.optim.AdamW
// uses (decoupled weight decay first, then the moments, then the step):
//
//   p  = p * decay                          decay = 1 - lr * weight_decay
//   m  = m + w1 * (g - m)                   w1 = 1 - beta1 (torch's lerp for a weight below 0.5)
//   v  = v * beta2 + (w2 * g) * g           w2 = 1 - beta2 (addcmul)
//   p  = p + (neg_step * m) / (sqrt(v) / bias2_sqrt + eps)      (addcdiv)
//
// with neg_step = -lr / (1 - beta1^t) and bias2_sqrt = sqrt(1 - beta2^t) for the update's step
// number t. Every coefficient is computed in double and rounded to float once, and every
// operation rounds to float, in PyTorch's order (its single-tensor AdamW on CPU), so the two agree
// to the last bit or nearly. NaN or Inf in g propagates into p, m and v as it does in PyTorch.
// Pure: no allocation, no threads.
#include <cstddef>
#include <cstdint>

namespace tilemoe::kernels {

struct AdamWCoefficients {
  float decay;       // 1 - lr * weight_decay
  float w1;          // 1 - beta1
  float beta2, w2;   // beta2, 1 - beta2
  float neg_step;    // -lr / (1 - beta1^t)
  float bias2_sqrt;  // sqrt(1 - beta2^t)
  float eps;
};

// The coefficients of step number t >= 1.
AdamWCoefficients adamw_coefficients(double lr, double beta1, double beta2, double eps, double weight_decay, std::int64_t t);

using AdamWUpdateFn = void (*)(const AdamWCoefficients& c, float* p, const float* g, float* m, float* v, std::size_t n);

void adamw_update_portable(const AdamWCoefficients& c, float* p, const float* g, float* m, float* v, std::size_t n);
// The portable kernel compiled for AVX2 + FMA + F16C; only where isa_available(Isa::avx2).
void adamw_update_avx2(const AdamWCoefficients& c, float* p, const float* g, float* m, float* v, std::size_t n);
// Only where isa_available(Isa::avx512_bf16). The same bits as the portable version.
void adamw_update_avx512(const AdamWCoefficients& c, float* p, const float* g, float* m, float* v, std::size_t n);

}  // namespace tilemoe::kernels
