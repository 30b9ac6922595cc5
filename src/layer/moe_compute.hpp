#pragma once
// One entry point for a layer's forward and backward on the implementation a user names:
// "reference" (src/reference), "portable", "avx2", "avx512", "amx", or "auto" (the fastest this CPU has).
#include <string>
#include <vector>

#include "src/quant/quantize.hpp"
#include "src/reference/moe_reference.hpp"

namespace tilemoe {

struct ComputeOptions {
  std::string isa = "auto";
  int threads = 0;     // 0: every core
  int numa_nodes = 1;  // tensor parallel over this many (real or virtual) nodes; 0: the machine's nodes
  // int8/int4: the experts quantized here (int4 in groups of group_size), or already quantized
  // (`quantized`, which then replaces the bf16 weights: their view gives the shape only).
  WeightType weight_type = WeightType::bf16;
  int group_size = 128;
  const quant::QuantizedExperts* quantized = nullptr;
  bool backward_weight_copy = false;  // SftLayerOptions::backward_weight_copy (bf16 weights)
};

// The implementation `isa` resolves to on this CPU; throws unsupported when it cannot run here.
std::string resolve_backend(const std::string& isa);

// A pool of `threads` workers (0: the process-wide pool over every core), created once per count.
namespace numa { class ThreadPool; class NodeGroup; }
numa::ThreadPool& pool_for_threads(int threads);
// The node groups of the tensor-parallel layer, created once per (pool, node count) and never
// destroyed: one node wraps `pool` itself; more split the machine's cores (numa::NodeGroup) into
// as many workers in all as `pool` has. nodes 0 means the machine's real NUMA node count.
numa::NodeGroup& node_group_for(numa::ThreadPool& pool, int nodes);

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
