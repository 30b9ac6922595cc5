#pragma once
// One MoE layer's routed experts on this CPU, for inference and LoRA fine-tuning: the C++ API a
// server or trainer embeds.
//
//   tilemoe::Runtime rt;
//   tilemoe::MoeLayerConfig cfg{.num_experts = 64, .top_k = 6, .hidden = 2048, .intermediate = 1408,
//                               .max_tokens = 4096, .lora_rank = 16, .lora_alpha = 32, .max_cache_depth = 1};
//   tilemoe::MoeLayer layer(rt, cfg, {gate, up, down});       // packed once, here
//   layer.update_lora_weights({ga, gb, ua, ub, da, db});       // the trainer's parameters, zero copy
//   layer.forward_sft(T, k, x, ids, w, out, /*save_for_backward=*/true);
//   layer.backward(grad_out, grad_in, {dga, dgb, dua, dub, dda, ddb});
//
// Each call computes, for token t: out[t] = sum_j w[t,j] * expert_{ids[t,j]}(x[t]), expert(v) =
// down(silu(gate(v)) * up(v)), each projection W v + s * B (A v) (+ its bias, where given; the
// SwiGLU clamped and in gpt-oss's form where the config says). Ids < 0 are experts that run
// elsewhere (skipped); ids >= num_experts are an error naming the token and slot.
//
// Every call validates its arguments and throws tilemoe::Error (tilemoe/error.hpp) naming what is
// wrong; a failed call leaves the layer as it was. NaN or Inf in activations propagates as in
// PyTorch; in weights it is an error at construction naming the expert and projection.
//
// Calls run on the runtime's threads in the runtime's order (tilemoe/runtime.hpp); submit_* are
// the asynchronous forms: every pointer passed must stay valid until the task has finished.
// The layers of one runtime share the transient buffers of forward and of backward (the largest
// batch's gathered inputs, per-slot outputs and gradients), so a model's layers hold one set of
// each between them, not one each. What backward needs of a forward is kept per layer, in its
// cache stack.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tilemoe/bf16.hpp"
#include "tilemoe/config.hpp"
#include "tilemoe/lora.hpp"
#include "tilemoe/runtime.hpp"

namespace tilemoe {

struct MoeLayerConfig {
  int num_experts = 0;
  int top_k = 0;         // the largest number of routing slots a call may pass
  int hidden = 0;
  int intermediate = 0;
  int max_tokens = 0;    // the largest batch of one call
  // Base weights: bf16, or quantized at construction to int8 (one scale per output channel) or
  // int4 (one scale per group_size inputs: 32, 64 or 128), with int8 activations per token, or to
  // mxfp4 (E2M1 with a power-of-two scale per 32 inputs; bf16 activations; weights that are MXFP4
  // values, such as a gpt-oss checkpoint's, are held exactly). LoRA stays f32/bf16 on every type;
  // training through quantized weights reads them dequantized (QLoRA).
  WeightType weight_type = WeightType::bf16;
  int group_size = 128;  // int4 only
  // Tensor parallel over NUMA nodes: each node holds and computes a slice of every expert's
  // intermediate dimension from its own memory, and the partial results are added. 1: no split;
  // 0: the machine's NUMA nodes; more than the machine has: virtual nodes (its cores divided).
  // config() reports the count used.
  int numa_nodes = 1;
  // LoRA: the largest rank the layer accepts, and the scale s of sets given as LoraWeights
  // (alpha / rank, or alpha / sqrt(rank) with rsLoRA).
  int lora_rank = 0;
  double lora_alpha = 0;
  bool use_rslora = false;
  int max_cache_depth = 0;  // saved forwards held at once for backward; 0: inference only
  // Backward reads a second copy of the bf16 weights packed as Wᵀ (twice the weight memory, as
  // kt-kernel's SFT layer keeps) instead of repacking the columns it needs on every call: a
  // faster fine-tuning step for those with the memory. bf16 weights and max_cache_depth > 0 only.
  bool backward_weight_copy = false;
  // > 0: the experts' SwiGLU clamps gate to at most this and up to [-it, it] first, LoRA terms
  // included (DeepSeek-V4's swiglu_limit; MoeShape::swiglu_limit); 0: none. A checkpoint layer
  // takes its config.json's.
  double swiglu_limit = 0;
  // gpt-oss's SwiGLU: (u' + swiglu_up_offset) * g' * sigmoid(swiglu_alpha * g'), g' and u' after the
  // clamps (MoeShape::swiglu_alpha); 1 and 0: the plain silu(g') * u'. gpt-oss: limit 7, alpha
  // 1.702, offset 1, with the experts' biases (ExpertWeightsRef).
  double swiglu_alpha = 1;
  double swiglu_up_offset = 0;
};

// The caller's bf16 expert weights in Hugging Face orientation: gate, up [E][I][H], down [E][H][I],
// each expert's matrix row-major and dense. Read once, at construction, and packed; the caller
// may free them afterwards. The experts are `*_stride` elements apart (0: dense, I*H), so that
// stacked tensors are read in place: see stacked_gate_up.
// Biases (gpt-oss), each optional (null: none), dense and copied at construction: gate_bias and
// up_bias [E][I], added to those products (LoRA included) before the activation; down_bias [E][H],
// added to each expert's output before its routing weight scales it. gpt-oss's interleaved
// gate_up_proj [E][H][2I] (x W, gate in the even columns) is not a layout read in place: give gate
// and up transposed and apart.
struct ExpertWeightsRef {
  const bf16* gate = nullptr;
  const bf16* up = nullptr;
  const bf16* down = nullptr;
  std::size_t gate_stride = 0, up_stride = 0, down_stride = 0;
  const bf16* gate_bias = nullptr;
  const bf16* up_bias = nullptr;
  const bf16* down_bias = nullptr;

  // gate and up stacked in one [E][2I][H] tensor, gate's rows first (vLLM's and SGLang's w13,
  // transformers v5's experts.gate_up_proj), and down [E][H][I].
  static ExpertWeightsRef stacked_gate_up(const bf16* gate_up, const bf16* down, int hidden, int intermediate) {
    const std::size_t per = static_cast<std::size_t>(hidden) * static_cast<std::size_t>(intermediate);
    return {gate_up, gate_up ? gate_up + per : nullptr, down, 2 * per, 2 * per, 0};
  }
};

// A LoRA set of the layer's rank and scale on all experts: A [E][rank][in], B [E][out][rank] of
// `dtype` (const float* for f32, const bf16* for bf16). A null A and B leaves that projection
// without LoRA. Read in place at every call (zero copy); LoraGrads has a dtype of its own.
struct LoraWeights {
  const void* gate_a = nullptr;
  const void* gate_b = nullptr;
  const void* up_a = nullptr;
  const void* up_b = nullptr;
  const void* down_a = nullptr;
  const void* down_b = nullptr;
  LoraDType dtype = LoraDType::f32;
};

// Where backward writes LoRA gradients, shaped like the set's A and B, of `dtype` (float* for f32,
// bf16* for bf16: a trainer's bf16 parameters; each element is rounded once); null: not wanted.
struct LoraGrads {
  void* gate_a = nullptr;
  void* gate_b = nullptr;
  void* up_a = nullptr;
  void* up_b = nullptr;
  void* down_a = nullptr;
  void* down_b = nullptr;
  LoraDType dtype = LoraDType::f32;
};

struct CheckpointLayerOptions {
  int max_tokens = 0;
  int max_cache_depth = 0;
  int lora_rank = 0;        // the largest rank update_lora_weights accepts (an adapter raises it to its own)
  double lora_alpha = 0;    // the scale of sets given as LoraWeights, as in MoeLayerConfig
  bool use_rslora = false;
  std::string adapter;      // PEFT adapter directory or `tilemoe convert-lora` file; empty: none
  AdapterStorage adapter_storage = AdapterStorage::as_stored;  // how the layer holds it, as in load_adapter
  int numa_nodes = 1;       // as in MoeLayerConfig
  // int8/int4/mxfp4: quantize the checkpoint's experts at load, or read them from `quantized_dir` (written
  // by `tilemoe quantize` from this checkpoint: checked against it, never re-quantized; its type
  // and group are used, and a weight_type given here that differs is an error).
  WeightType weight_type = WeightType::bf16;
  int group_size = 128;
  std::string quantized_dir;
  bool backward_weight_copy = false;  // as in MoeLayerConfig
};

struct LayerPeftState;  // internal (src/api/layer_peft_state.hpp)

class TILEMOE_CXX_API MoeLayer {
 public:
  // Throws invalid_argument for a bad config or null weights, bad_file for non-finite weights
  // (naming the expert and projection).
  MoeLayer(Runtime& runtime, const MoeLayerConfig& config, const ExpertWeightsRef& weights);
  // The layer `layer` of a Hugging Face checkpoint directory (single or sharded safetensors).
  static MoeLayer from_checkpoint(Runtime& runtime, const std::string& model_dir, int layer,
                                  const CheckpointLayerOptions& options);
  ~MoeLayer();  // waits for this layer's queued tasks
  MoeLayer(MoeLayer&&) noexcept;
  MoeLayer& operator=(MoeLayer&&) noexcept;

  const MoeLayerConfig& config() const;
  double lora_scale() const;  // s for sets given as LoraWeights

  // x: bf16 [T][H]; expert_ids: [T][top_k]; weights: f32 [T][top_k]; out: [T][H], overwritten.
  // f32 out is for callers that add partial results themselves.
  void forward(int tokens, int top_k, const bf16* x, const std::int64_t* expert_ids, const float* weights, bf16* out);
  void forward(int tokens, int top_k, const bf16* x, const std::int64_t* expert_ids, const float* weights, float* out);

  // forward that, with save_for_backward, pushes what backward needs on the cache stack: full
  // stack (max_cache_depth) is an Error(state) that changes nothing.
  void forward_sft(int tokens, int top_k, const bf16* x, const std::int64_t* expert_ids, const float* weights, bf16* out,
                   bool save_for_backward);
  void forward_sft(int tokens, int top_k, const bf16* x, const std::int64_t* expert_ids, const float* weights, float* out,
                   bool save_for_backward);

  // Pops the newest saved forward; for loss = sum(out * grad_output) writes grad_input [T][H]
  // (overwritten) and the LoRA gradients (overwritten, zero for experts without tokens, or added
  // to with accumulate) of the set that forward used. Empty stack: Error(state), nothing changes.
  void backward(const bf16* grad_output, bf16* grad_input, const LoraGrads& grads, bool accumulate = false);
  void backward(const float* grad_output, float* grad_input, const LoraGrads& grads, bool accumulate = false);
  void backward(const float* grad_output, float* grad_input, const LayerLoraGrad& grads, bool accumulate = false);

  // Points the layer at another LoRA set, zero copy (validated first; a bad set keeps the old
  // one). LoraWeights uses the config's rank and scale; LayerLoraView says everything itself
  // (per-expert scales and presence, a rank per projection up to lora_rank).
  void update_lora_weights(const LoraWeights& weights);
  void update_lora_weights(const LayerLoraView& view);
  // A PEFT adapter directory or a `tilemoe convert-lora` file, held by the layer; `layer` is its
  // index in the model (a checkpoint layer knows its own: pass -1). Needs an empty cache stack.
  // The layer's own copy is never written, so the forward packs it for the tile kernels once,
  // where sets given by update_lora_weights (the caller's arrays) are packed at every call.
  // `storage` (AdapterStorage, lora.hpp): by default bf16 when every factor tensor the layer takes
  // from the file is BF16 (the same values, half the memory, half the bytes read where the factors
  // are read as they are), else f32; or always f32, or always bf16. lora()'s dtype says which.
  void load_adapter(const std::string& path, int layer = -1, AdapterStorage storage = AdapterStorage::as_stored);
  void unload_adapter();  // back to no LoRA; needs an empty cache stack
  const LayerLoraView& lora() const;
  // Where the adapter the layer holds (load_adapter, CheckpointLayerOptions::adapter) keeps each
  // projection's LoRA when PEFT stacked it over the experts, so that a trainer can write factors
  // and gradients back under those keys; all empty without an adapter or for per-expert keys. Of
  // the held adapter even while update_lora_weights has another set in use.
  LayerPeftStackedKeys adapter_stacked_keys() const;

  int cached_forwards() const;
  std::size_t cache_bytes() const;
  std::size_t weight_bytes() const;  // the packed experts
  std::size_t weight_copy_bytes() const;  // the backward's Wᵀ copy (backward_weight_copy), else 0

  // Asynchronous forms: queued on the runtime, returning at once.
  Runtime::Ticket submit_forward(int tokens, int top_k, const bf16* x, const std::int64_t* expert_ids, const float* weights,
                                 bf16* out);
  Runtime::Ticket submit_forward(int tokens, int top_k, const bf16* x, const std::int64_t* expert_ids, const float* weights,
                                 float* out);
  Runtime::Ticket submit_forward_sft(int tokens, int top_k, const bf16* x, const std::int64_t* expert_ids,
                                     const float* weights, bf16* out, bool save_for_backward);
  Runtime::Ticket submit_forward_sft(int tokens, int top_k, const bf16* x, const std::int64_t* expert_ids,
                                     const float* weights, float* out, bool save_for_backward);
  Runtime::Ticket submit_backward(const bf16* grad_output, bf16* grad_input, const LoraGrads& grads, bool accumulate = false);
  Runtime::Ticket submit_backward(const float* grad_output, float* grad_input, const LoraGrads& grads,
                                  bool accumulate = false);
  // update_lora_weights as a task: the view is validated when the task runs (a bad one fails the
  // task and keeps the old set); tasks queued before it still read the old set.
  Runtime::Ticket submit_update_lora_weights(const LayerLoraView& view);

  struct Impl;

 private:
  friend LayerPeftState layer_peft_state(const MoeLayer& layer);  // save_peft_adapter's reading of the layer
  explicit MoeLayer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tilemoe
