#include "src/layer/moe_sft_layer.hpp"

#include <algorithm>
#include <atomic>
#include <string>

#include "tilemoe/error.hpp"

namespace tilemoe {

MoeSftLayer::MoeSftLayer(const PackedExpertWeights& weights, kernels::Isa isa, numa::ThreadPool& pool, const SftLayerOptions& options,
                         const LayerLoraView& lora)
    : shape_(weights.shape()),
      options_(options),
      pool_(pool),
      forward_(weights, isa, pool),
      backward_(weights, isa, pool),
      cache_(weights.shape(), CacheLimits{options.max_tokens, options.max_top_k > 0 ? options.max_top_k : std::max(1, weights.shape().top_k), options.max_cache_depth,
                                          options.max_lora_rank},
             options.memory_node) {
  update_lora_weights(lora);
  if (options.backward_weight_copy && options.max_cache_depth > 0) {
    transposed_ = TransposedExpertWeights::build(weights, kernels::kernel_table(isa), pool, options.memory_node);
    backward_.use_transposed_copy(&transposed_);
  }
}

void MoeSftLayer::update_lora_weights(const LayerLoraView& lora, bool held) {
  validate_lora_view(lora, shape_, options_.max_lora_rank, "update_lora_weights");
  lora_ = lora;
  // A number no other held set has had, in any layer: packed factors are never taken for a set's
  // successor, even one at the same addresses.
  static std::atomic<std::uint64_t> held_sets{0};
  forward_.set_lora_held(held ? ++held_sets : 0);
}

void MoeSftLayer::forward_sft(int tokens, int top_k, const bf16* x, const std::int64_t* expert_ids, const float* weights, float* out,
                              bool save_for_backward, const ForwardNodes& nodes) {
  if (tokens < 0 || top_k <= 0)
    fail(ErrorKind::invalid_argument, "forward_sft: tokens (" + std::to_string(tokens) + ") must be >= 0 and top_k (" +
                                          std::to_string(top_k) + ") positive");
  if (!save_for_backward) return forward_.forward(lora_, tokens, top_k, x, expert_ids, weights, out, nullptr, nodes);

  ForwardCacheEntry& slot = cache_.slot_for_push("forward_sft");
  const CacheLimits& lim = cache_.limits();
  if (tokens > lim.max_tokens || top_k > lim.max_top_k)
    fail(ErrorKind::invalid_argument, "forward_sft: a batch of " + std::to_string(tokens) + " tokens x top-" + std::to_string(top_k) +
                                          " does not fit the forward cache (max_tokens " + std::to_string(lim.max_tokens) +
                                          ", top-k " + std::to_string(lim.max_top_k) + ")");
  slot.lora = lora_;
  const ForwardSave save = slot.save_target();
  forward_.forward(lora_, tokens, top_k, x, expert_ids, weights, out, &save, nodes);  // checks the ids before writing

  const std::size_t n = static_cast<std::size_t>(tokens) * top_k;
  // The input by the pool's workers from 64 KiB up: one thread copied 2 MB (512 tokens of
  // DeepSeek-V2-Lite) while the others waited.
  const std::size_t x_elems = static_cast<std::size_t>(tokens) * shape_.hidden;
  constexpr std::size_t kCopyChunk = std::size_t{1} << 15;  // bf16 elements: 64 KiB
  if (x_elems < 2 * kCopyChunk) {
    std::copy_n(x, x_elems, slot.x.data());
  } else {
    pool_.parallel_for((x_elems + kCopyChunk - 1) / kCopyChunk, [&](std::size_t i, int) {
      const std::size_t b = i * kCopyChunk;
      std::copy_n(x + b, std::min(kCopyChunk, x_elems - b), slot.x.data() + b);
    });
  }
  std::copy_n(expert_ids, n, slot.ids.data());
  std::copy_n(weights, n, slot.weights.data());
  slot.tokens = tokens;
  slot.top_k = top_k;
  cache_.push();
}

void MoeSftLayer::backward(const float* grad_output, float* grad_input, const LayerLoraGrad& grads, bool accumulate,
                           const BackwardNodes& nodes) {
  const ForwardCacheEntry& entry = cache_.top("backward");
  backward_.backward(entry, grad_output, grad_input, grads, accumulate, nodes);
  cache_.pop();
}

void MoeSftLayer::discard_newest_saved() {
  cache_.top("discard_newest_saved");
  cache_.pop();
}

}  // namespace tilemoe
