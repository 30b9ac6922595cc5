#pragma once
// The reference MoE layer: plain Eigen, no tiles, no threads, no packing. Every fast path is
// tested against it; keep it simple rather than fast. S is float (tests, CLI) or double
// (finite-difference checks of the backward).
//
//   out[t] = sum_j w[t,j] * down(silu(gate(x_t)) * up(x_t)),  expert = ids[t,j] (skipped if < 0)
//   (gate and up clamped first where the shape has a swiglu_limit; gpt-oss's form with its alpha and
//   up offset; each projection's bias added where the weights have biases)
//   each projection: W v + scale_e * B_e (A_e v)
#include <cstdint>

#include "src/lora/lora_weights.hpp"
#include "src/model/expert_weights.hpp"
#include "src/quant/quantize.hpp"

namespace tilemoe {

template <typename S>
struct MoeBatch {
  int tokens = 0;
  int top_k = 0;
  const S* input = nullptr;                  // [T][H]
  const std::int64_t* expert_ids = nullptr;  // [T][k]
  const S* weights = nullptr;                // [T][k]
};

// How the base products see their inputs. int8_activations: as the int8/int4 weight kernels do,
// each row of x (gate, up) and h (down) goes through per-row int8 quantization
// (quant::quantize_activation_row) before it meets W, h rounded to bf16 first as the kernels
// keep it; LoRA terms see x exactly. In the backward, the gate and up it recomputes see x so too.
// quantized: the base weights are these codes and scales, dequantized exactly in f32 (the
// ExpertWeightsView then gives only the shape), rather than the bf16 view.
struct ReferenceOptions {
  bool int8_activations = false;
  const quant::QuantizedExperts* quantized = nullptr;
};

// output: [T][H], overwritten. Throws invalid_argument for an expert id >= E.
template <typename S>
void reference_forward(const ExpertWeightsView& w, const LayerLoraT<S>& lora, const MoeBatch<S>& batch, S* output,
                       const ReferenceOptions& options = {});

// Gradients of sum(output * grad_output): grad_input [T][H] and, when lora_grad is given (shaped
// like lora, e.g. lora.zeros_like()), the gradient of every A and B; all overwritten. Experts
// that receive no token get zero gradient.
template <typename S>
void reference_backward(const ExpertWeightsView& w, const LayerLoraT<S>& lora, const MoeBatch<S>& batch, const S* grad_output,
                        S* grad_input, LayerLoraT<S>* lora_grad, const ReferenceOptions& options = {});

}  // namespace tilemoe
