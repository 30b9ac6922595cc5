#include "src/layer/moe_compute.hpp"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>

#include "amx/isa.hpp"
#include "numa/topology.hpp"
#include "src/layer/moe_forward.hpp"
#include "src/layer/moe_sft_layer.hpp"
#include "src/layer/tensor_parallel_layer.hpp"
#include "numa/node_group.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe {

std::string resolve_backend(const std::string& isa) {
  if (isa == "reference") return "reference";
  if (isa != "auto" && !kernels::parse_isa(isa))
    fail(ErrorKind::invalid_argument, "--isa '" + isa + "' is unknown: choose reference, portable, avx512, amx or auto");
  return kernels::isa_name(kernels::resolve_isa(isa == "auto" ? std::string_view{} : std::string_view{isa}));
}

numa::ThreadPool& pool_for_threads(int threads) {
  if (threads <= 0) return numa::default_pool();
  static std::mutex mu;
  static std::map<int, std::unique_ptr<numa::ThreadPool>> pools;
  std::lock_guard<std::mutex> lock(mu);
  auto& p = pools[threads];
  if (!p) {
    std::vector<int> cpus;
    for (const auto& node : numa::system_topology().nodes) cpus.insert(cpus.end(), node.cpus.begin(), node.cpus.end());
    p = std::make_unique<numa::ThreadPool>(threads, cpus);
  }
  return *p;
}

numa::NodeGroup& node_group_for(numa::ThreadPool& pool, int nodes) {
  const numa::Topology& topo = numa::system_topology();
  if (nodes == 0) nodes = std::max<int>(1, static_cast<int>(topo.nodes.size()));
  static std::mutex mu;
  static std::map<std::pair<const numa::ThreadPool*, int>, std::unique_ptr<numa::NodeGroup>> groups;
  std::lock_guard<std::mutex> lock(mu);
  auto& g = groups[{&pool, nodes}];
  if (!g) g = nodes == 1 ? std::make_unique<numa::NodeGroup>(pool, topo.nodes.empty() ? 0 : topo.nodes[0].os_index)
                         : std::make_unique<numa::NodeGroup>(topo, nodes, pool.size());
  return *g;
}

std::vector<bf16> to_bf16(const float* x, std::size_t n) {
  std::vector<bf16> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = float_to_bf16(x[i]);
  return out;
}

namespace {

// The experts as the options want them: nullptr for bf16, else quantized (made into `holder`).
const quant::QuantizedExperts* quantized_for(const ExpertWeightsView& w, const ComputeOptions& opt, quant::QuantizedExperts& holder) {
  if (opt.quantized) return opt.quantized;
  if (opt.weight_type == WeightType::bf16) return nullptr;
  holder = quant::quantize_experts(w, opt.weight_type, opt.group_size, &pool_for_threads(opt.threads));
  return &holder;
}

TensorParallelLayer split_layer(const ExpertWeightsView& w, const quant::QuantizedExperts* q, const ComputeOptions& opt, kernels::Isa isa,
                                const SftLayerOptions& options, const LayerLoraView& view) {
  numa::NodeGroup& nodes = node_group_for(pool_for_threads(opt.threads), opt.numa_nodes);
  const MoeShape shape = q ? q->shape : w.shape;
  return TensorParallelLayer(shape, q ? q->type : WeightType::bf16, q ? q->group : 0, nodes, isa, options,
                             [&](quant::IntermediateSlice s, numa::ThreadPool& pool, int node) {
                               if (!q) return PackedExpertWeights::pack_slice(w, s, pool, node);
                               return PackedExpertWeights::pack_quantized_slice(*q, s, pool, node);
                             },
                             view);
}

}  // namespace

void moe_forward(const ExpertWeightsView& w, const LayerLora& lora, const MoeBatch<float>& batch, const ComputeOptions& opt,
                 float* output) {
  std::string backend = resolve_backend(opt.isa);
  quant::QuantizedExperts holder;
  const quant::QuantizedExperts* q = quantized_for(w, opt, holder);
  if (backend == "reference") {
    if (!q) return reference_forward(w, lora, batch, output);
    // The quantized model: dequantized weights, int8 activations per token (mxfp4: bf16 ones), as
    // the kernels run it.
    const ExpertWeights dq = quant::dequantize_experts(*q);
    return reference_forward(dq.view(), lora, batch, output, ReferenceOptions{is_integer_weight_type(q->type), q});
  }
  auto isa = *kernels::parse_isa(backend);
  const LayerLoraView view = lora_view(lora);
  TensorParallelLayer layer = split_layer(w, q, opt, isa, {std::max(batch.tokens, 1), 0, view.max_rank(), std::max(batch.top_k, 1)}, view);
  auto x = to_bf16(batch.input, static_cast<std::size_t>(batch.tokens) * layer.shape().hidden);
  layer.forward_sft(batch.tokens, batch.top_k, x.data(), batch.expert_ids, batch.weights, output, false);
}

void moe_backward(const ExpertWeightsView& w, const LayerLora& lora, const MoeBatch<float>& batch, const float* grad_output,
                  const ComputeOptions& opt, float* output, float* grad_input, LayerLora* lora_grad) {
  std::string backend = resolve_backend(opt.isa);
  quant::QuantizedExperts holder;
  const quant::QuantizedExperts* q = quantized_for(w, opt, holder);
  if (backend == "reference") {
    // Through a quantized base: the gradients of the dequantized model (activation rounding is the
    // identity for them, as in the kernels), at the gate and up the forward computed.
    ExpertWeights dq;
    if (q) dq = quant::dequantize_experts(*q);
    const ExpertWeightsView rw = q ? dq.view() : w;
    const ReferenceOptions ro = q ? ReferenceOptions{is_integer_weight_type(q->type), q} : ReferenceOptions{};
    if (output) reference_forward(rw, lora, batch, output, ro);
    return reference_backward(rw, lora, batch, grad_output, grad_input, lora_grad, ro);
  }
  auto isa = *kernels::parse_isa(backend);
  const LayerLoraView view = lora_view(lora);
  SftLayerOptions options{std::max(batch.tokens, 1), 1, view.max_rank(), std::max(batch.top_k, 1)};
  options.backward_weight_copy = opt.backward_weight_copy;
  TensorParallelLayer layer = split_layer(w, q, opt, isa, options, view);
  auto x = to_bf16(batch.input, static_cast<std::size_t>(batch.tokens) * layer.shape().hidden);
  std::vector<float> scratch_out;
  if (!output) scratch_out.resize(x.size()), output = scratch_out.data();
  layer.forward_sft(batch.tokens, batch.top_k, x.data(), batch.expert_ids, batch.weights, output, true);
  layer.backward(grad_output, grad_input, lora_grad ? lora_grad_view(*lora_grad) : LayerLoraGrad{});
}

}  // namespace tilemoe
