#pragma once
// One MoE layer for LoRA fine-tuning: the forward that can save what backward needs on a cache
// stack, the backward that pops it, and LoRA weights that are the caller's memory.
//
//   MoeSftLayer layer(packed, isa, pool, {max_tokens, max_cache_depth, max_lora_rank}, lora);
//   layer.forward_sft(T, k, x, ids, w, out, /*save_for_backward=*/true);
//   layer.backward(grad_out, grad_in, grads);        // pops the newest saved forward
//   optimizer writes the LoRA arrays in place        // seen by the next forward, no call needed
//   layer.update_lora_weights(other_set);            // or point the layer at another set
//
// The base weights are frozen (no gradient). Memory: the cache stack is allocated once
// (cache_bytes()); backward reads the forward's packed weights, so it adds no weight copy unless
// asked for one (backward_weight_copy, weight_copy_bytes()).
#include <cstdint>

#include "src/layer/forward_cache.hpp"
#include "src/layer/moe_backward.hpp"
#include "src/layer/moe_forward.hpp"

namespace tilemoe {

struct SftLayerOptions {
  int max_tokens = 0;       // the largest batch forward_sft may save
  int max_cache_depth = 1;  // saved forwards held at once
  int max_lora_rank = 0;    // the largest rank update_lora_weights accepts
  int max_top_k = 0;        // routing slots per token forward_sft may save (0: the model's top-k)
  int memory_node = 0;      // the NUMA node the cache stack (and the weight copy) lives on
  // A Wᵀ copy of the bf16 weights for backward (TransposedExpertWeights): twice the weight
  // memory, no per-call repack. Built only when max_cache_depth > 0.
  bool backward_weight_copy = false;
};

class MoeSftLayer {
 public:
  // Throws invalid_argument for bad options or a LoRA set that does not fit the layer.
  MoeSftLayer(const PackedExpertWeights& weights, kernels::Isa isa, numa::ThreadPool& pool, const SftLayerOptions& options,
              const LayerLoraView& lora = {});
  // The backward points into the layer's own weight copy: not copyable or movable.
  MoeSftLayer(const MoeSftLayer&) = delete;
  MoeSftLayer& operator=(const MoeSftLayer&) = delete;

  // Points the layer at another LoRA set (no copy). Validated first: a set that does not fit
  // is an invalid_argument error and the layer keeps the old one. Saved forwards keep the set
  // they were computed with. `held`: the set belongs to the layer's owner and nothing writes it
  // until the next update (a loaded adapter), so forward packs its factors once instead of at
  // every call; the caller's own arrays, which an optimizer writes in place, are not held.
  void update_lora_weights(const LayerLoraView& lora, bool held = false);
  const LayerLoraView& lora() const { return lora_; }

  // x: bf16 [T][H]; ids, weights: [T][k]; out: f32 [T][H]. With save_for_backward the call
  // pushes one cache entry: it is an Error(state) when the stack is full, and invalid_argument
  // when T > max_tokens or k > max_top_k; either leaves the layer as it was. `nodes`: as
  // MoeForward::forward's (the nodes of a tensor-parallel layer).
  void forward_sft(int tokens, int top_k, const bf16* x, const std::int64_t* expert_ids, const float* weights, float* out,
                   bool save_for_backward, const ForwardNodes& nodes = {});

  // Pops the newest saved forward and computes, for loss = sum(out * grad_output):
  // grad_input (f32 [T][H], overwritten) and the LoRA gradients into `grads`, shaped like the
  // LoRA set that forward used (overwritten, zero for experts without tokens, or added to with
  // accumulate). An empty stack is an Error(state) that changes nothing. `nodes`: as
  // MoeBackward::backward's (the nodes of a tensor-parallel layer).
  void backward(const float* grad_output, float* grad_input, const LayerLoraGrad& grads, bool accumulate = false,
                const BackwardNodes& nodes = {});
  // Drops the newest saved forward without a backward (a NUMA node whose sibling failed to save
  // the same forward). Error(state) when there is none.
  void discard_newest_saved();

  int cached_forwards() const { return cache_.size(); }
  // Tokens of the saved forward the next backward pops; Error(state) when there is none.
  int tokens_of_newest_saved() const { return cache_.top("backward").tokens; }
  // The forward the next backward pops; Error(state) when there is none.
  const ForwardCacheEntry& newest_saved() const { return cache_.top("backward"); }
  std::size_t cache_bytes() const { return cache_.bytes(); }
  std::size_t weight_copy_bytes() const { return transposed_.bytes(); }
  const MoeShape& shape() const { return shape_; }
  MoeForward& forward_pass() { return forward_; }
  MoeBackward& backward_pass() { return backward_; }

 private:
  MoeShape shape_;
  SftLayerOptions options_;
  LayerLoraView lora_;
  numa::ThreadPool& pool_;
  MoeForward forward_;
  TransposedExpertWeights transposed_;
  MoeBackward backward_;
  ForwardCacheStack cache_;
};

}  // namespace tilemoe
