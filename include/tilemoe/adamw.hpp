#pragma once
// AdamW over the caller's f32 arrays, on the runtime's threads: the optimizer step of a trainer
// whose LoRA factors the layers read in place (MoeLayer::update_lora_weights), so that the step
// needs no copy and no Python loop over hundreds of per-expert tensors.
//
//   std::vector<tilemoe::AdamWSegment> segs;   // e.g. one per routed expert and factor
//   segs.push_back({a + e * r * in, grad_a + e * r * in, m_a + e * r * in, v_a + e * r * in, r * in, ++step_a[e]});
//   tilemoe::adamw_step(rt, {.lr = 1e-4, .weight_decay = 0.01}, segs.data(), segs.size());
//
// The update of each segment is torch.optim.AdamW's (decoupled weight decay, bias correction by
// the segment's own step number, amsgrad off, maximize off), so segments with different step
// counts (an expert that got no token in some steps keeps its own count, as PyTorch does for a
// parameter whose .grad was None) are one call. Per element, in PyTorch's order of operations
// (its single-tensor AdamW on CPU; amx/adamw.hpp has the roundings):
//   p = p * (1 - lr * weight_decay); m = m + (1 - beta1) * (g - m); v = v * beta2 + (1 - beta2) * g * g
//   p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// NaN or Inf in a gradient propagates into that element's p, m and v, as in PyTorch.
//
// The call takes its place in the runtime's queue like a layer's synchronous call: after every
// task already submitted (a submitted backward writing the gradients finishes first).
#include <cstddef>
#include <cstdint>

#include "tilemoe/runtime.hpp"

namespace tilemoe {

// Doubles, as PyTorch's hyperparameters are: the coefficients derived from them (1 - beta1,
// lr / (1 - beta1^t), ...) are computed in double and rounded to float once, as PyTorch does.
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

struct AdamWSegment {
  float* param;             // count elements, updated in place
  const float* grad;
  float* exp_avg;           // first moment, updated in place (zeros before the first step)
  float* exp_avg_sq;        // second moment, likewise
  std::size_t count;
  std::int64_t step;        // this update's step number for these elements: 1 for the first
};

// Throws Error(invalid_argument) naming the option or segment (its index) for a learning rate,
// eps or weight decay that is negative or not finite, betas outside [0, 1), a null array in a
// non-empty segment, a step below 1, or arrays it writes (param, exp_avg, exp_avg_sq) that
// overlap, within a segment or between two; nothing is updated then.
TILEMOE_CXX_API void adamw_step(Runtime& rt, const AdamWOptions& options, const AdamWSegment* segments, std::size_t count);

}  // namespace tilemoe
