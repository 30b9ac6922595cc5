#pragma once
// One entry point for a layer's forward and backward on the implementation a user names:
// "reference" (src/reference), "portable", "avx512", "amx", or "auto" (the fastest this CPU has).
#include <string>
#include <vector>

#include "src/reference/moe_reference.hpp"

namespace tilemoe {

struct ComputeOptions {
  std::string isa = "auto";
  int threads = 0;  // 0: every core
};

// The implementation `isa` resolves to on this CPU; throws unsupported when it cannot run here.
std::string resolve_backend(const std::string& isa);

// A pool of `threads` workers (0: the process-wide pool over every core), created once per count.
namespace numa { class ThreadPool; }
numa::ThreadPool& pool_for_threads(int threads);

std::vector<bf16> to_bf16(const float* x, std::size_t n);

// Packs the weights on every call: for one-shot use (the CLI). Servers and trainers keep a
// PackedExpertWeights and a MoeForward or MoeSftLayer (src/layer/).
void moe_forward(const ExpertWeightsView& w, const LayerLora& lora, const MoeBatch<float>& batch, const ComputeOptions& opt,
                 float* output);
// Forward and backward of loss = sum(output * grad_output): output (when not null), grad_input and,
// when lora_grad is given (shaped like lora), every LoRA gradient; all overwritten.
void moe_backward(const ExpertWeightsView& w, const LayerLora& lora, const MoeBatch<float>& batch, const float* grad_output,
                  const ComputeOptions& opt, float* output, float* grad_input, LayerLora* lora_grad);

}  // namespace tilemoe
