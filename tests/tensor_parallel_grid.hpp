#pragma once
// The tensor-parallel layer (the NUMA split) of one ISA against the reference path, for 1 to 4
// virtual nodes: forward and backward on the awkward-shape grid and the fixtures, accumulated
// gradients, LoRA given as strided windows, bit-identical results for any thread count at a
// given node count, and failures that leave every node's cache stack as it was.
#include <cstring>
#include <map>
#include <memory>

#include "catch.hpp"
#include "fixture_cases.hpp"
#include "moe_backward_grid.hpp"
#include "numa/node_group.hpp"
#include "shape_grid.hpp"
#include "src/io/safetensors.hpp"
#include "src/layer/moe_compute.hpp"
#include "src/layer/synthetic_layer.hpp"
#include "src/layer/tensor_parallel_layer.hpp"
#include "src/lora/peft_adapter.hpp"
#include "src/model/checkpoint.hpp"
#include "src/quant/numa_slices.hpp"
#include "src/quant/quantize.hpp"
#include "test_util.hpp"

namespace tilemoe::test {

inline std::unique_ptr<TensorParallelLayer> make_tp_layer(kernels::Isa isa, numa::NodeGroup& nodes, const ExpertWeights& w,
                                                          const LayerLoraView& lora, int max_tokens, int depth = 1,
                                                          bool weight_copy = false) {
  SftLayerOptions opt;
  opt.max_tokens = std::max(max_tokens, 1);
  opt.max_cache_depth = depth;
  opt.backward_weight_copy = weight_copy;
  opt.max_lora_rank = std::max(lora.max_rank(), 1);
  const ExpertWeightsView view = w.view();
  return std::make_unique<TensorParallelLayer>(
      w.shape, WeightType::bf16, 0, nodes, isa, opt,
      [view](quant::IntermediateSlice s, numa::ThreadPool& pool, int node) { return PackedExpertWeights::pack_slice(view, s, pool, node); },
      lora);
}

// forward_sft (saved) then backward; gradients overwritten into buffers full of junk, or added to
// a copy of `start` with accumulate.
// `view`: as in run_sft.
inline SftResult run_tp(kernels::Isa isa, numa::NodeGroup& nodes, const ExpertWeights& w, const LayerLora& lora, int tokens, int top_k,
                       const std::vector<float>& x, const std::vector<std::int64_t>& ids, const std::vector<float>& wts,
                       const std::vector<float>& grad_out, const LayerLora* start = nullptr, bool weight_copy = false,
                       const LayerLoraView* view = nullptr, bool bf16_grads = false) {
  auto layer = make_tp_layer(isa, nodes, w, view ? *view : lora_view(lora), tokens, 1, weight_copy);
  CHECK((layer->weight_copy_bytes() > 0) == weight_copy);
  SftResult r;
  r.out.assign(x.size(), 5.0f);
  r.grad_input.assign(x.size(), 7.0f);
  r.grads = start ? *start : lora.zeros_like();
  if (!start)
    for (auto& p : r.grads.proj) {
      std::fill(p.a.begin(), p.a.end(), 7.0f);  // overwrite mode must replace all of it
      std::fill(p.b.begin(), p.b.end(), 7.0f);
    }
  auto xb = to_bf16(x.data(), x.size());
  layer->forward_sft(tokens, top_k, xb.data(), ids.data(), wts.data(), r.out.data(), true);
  CHECK(layer->cached_forwards() == 1);
  if (bf16_grads) {
    r.grads16 = round_lora_to_bf16(r.grads);  // the start (bf16 values), or junk to overwrite
    layer->backward(grad_out.data(), r.grad_input.data(), lora_grad_view(r.grads16), start != nullptr);
  } else {
    layer->backward(grad_out.data(), r.grad_input.data(), lora_grad_view(r.grads), start != nullptr);
  }
  CHECK(layer->cached_forwards() == 0);
  return r;
}


// One node group per count, shared by the cases: threads in all = this machine's cores.
inline numa::NodeGroup& test_node_group(int nodes, int threads = 0) {
  static std::map<std::pair<int, int>, std::unique_ptr<numa::NodeGroup>> groups;
  auto& g = groups[{nodes, threads}];
  if (!g) g = std::make_unique<numa::NodeGroup>(numa::system_topology(), nodes, threads);
  return *g;
}

inline void check_tp_case(kernels::Isa isa, int nodes, const MoeShape& s, int tokens, int rank, int lora_every, std::uint64_t seed) {
  const BackwardCase c = make_backward_case(s, tokens, rank, lora_every, seed);
  const auto& [w, lora, routing, x, go, want_out, want_dx, want_grads] = c;
  numa::NodeGroup& group = test_node_group(nodes);
  SftResult got = run_tp(isa, group, w, lora, tokens, s.top_k, x, routing.expert_ids, routing.weights, go);
  CHECK(rel_error(got.out, want_out) <= 1e-2);
  CHECK(rel_error(got.grad_input, want_dx) <= 1e-2);
  check_lora_grads(got.grads, want_grads, 2e-2);
  if (rank > 0 && nodes % 2 == 1) {
    // bf16 windows: the slices' offsets count elements of the set's own type (3 nodes: uneven slices).
    const LayerLoraBf16 lora16 = bf16_copy_of_exact(lora);
    const LayerLoraView view16 = lora_view(lora16);
    check_same_bits(got, run_tp(isa, group, w, lora, tokens, s.top_k, x, routing.expert_ids, routing.weights, go, nullptr, false, &view16),
                    "the set stored as bf16");
    const SftResult g16 = run_tp(isa, group, w, lora, tokens, s.top_k, x, routing.expert_ids, routing.weights, go, nullptr, false, nullptr, true);
    INFO("gradients in bf16 (the split's windows and the nodes' reduced blocks)");
    CHECK(g16.out == got.out);
    check_bf16_grads(got.grads, g16.grads16);
  }
  {
    // A forward that saves nothing keeps down's LoRA partials in buffers of its own: same bits.
    auto layer = make_tp_layer(isa, group, w, lora_view(lora), tokens);
    std::vector<float> out(x.size(), 3.0f);
    auto xb = to_bf16(x.data(), x.size());
    layer->forward_sft(tokens, s.top_k, xb.data(), routing.expert_ids.data(), routing.weights.data(), out.data(), false);
    CHECK(out == got.out);
  }

  // Accumulating onto earlier gradients adds exactly what an overwrite computes (up to f32
  // rounding of the sum).
  if (rank > 0) {
    LayerLora start = lora.zeros_like();
    for (auto& p : start.proj) {
      for (std::size_t i = 0; i < p.a.size(); ++i) p.a[i] = 0.25f * static_cast<float>(i % 7);
      for (std::size_t i = 0; i < p.b.size(); ++i) p.b[i] = -0.5f * static_cast<float>(i % 5);
    }
    SftResult acc = run_tp(isa, group, w, lora, tokens, s.top_k, x, routing.expert_ids, routing.weights, go, &start);
    for (int p = 0; p < 3; ++p) {
      INFO("accumulate, " << projection_name(kProjections[static_cast<std::size_t>(p)]));
      std::vector<float> a = start.proj[p].a, b = start.proj[p].b;
      for (std::size_t i = 0; i < a.size(); ++i) a[i] += want_grads.proj[p].a[i];
      for (std::size_t i = 0; i < b.size(); ++i) b[i] += want_grads.proj[p].b[i];
      CHECK(rel_error(acc.grads.proj[p].a, a) <= 2e-2);
      CHECK(rel_error(acc.grads.proj[p].b, b) <= 2e-2);
    }
    if (nodes % 2 == 1) {
      // Added to bf16 gradients (the start's values are bf16): each element rounded once, after the add.
      const SftResult acc16 = run_tp(isa, group, w, lora, tokens, s.top_k, x, routing.expert_ids, routing.weights, go, &start, false,
                                     nullptr, true);
      INFO("accumulated into bf16 gradients");
      check_bf16_grads(acc.grads, acc16.grads16);
    }
  }
}

inline void run_tp_grid(kernels::Isa isa, std::vector<int> node_counts = {1, 2, 3, 4}) {
  for (int nodes : node_counts)
    for (const auto& c : awkward_shape_grid()) {
      if (c.tokens > 256) continue;  // the 1024-token case adds time, not coverage, four times over
      INFO(nodes << " nodes, hidden " << c.shape.hidden << " inter " << c.shape.intermediate << " experts " << c.shape.num_experts
                 << " top-" << c.shape.top_k << " swiglu_limit " << backward_shape(c.shape).swiglu_limit << " tokens " << c.tokens << " rank " << c.rank << " lora on every " << c.lora_every);
      check_tp_case(isa, nodes, backward_shape(c.shape), c.tokens, c.rank, c.lora_every, 131 + c.tokens);
    }
}

// Every fixture case: PyTorch autograd through PEFT is the oracle, split over 2 and 3 nodes.
inline void run_tp_fixtures(kernels::Isa isa) {
  for (int nodes : {2, 3})
    check_fixture_sft(
        [&](const ExpertWeights& experts, const LayerLora& lora, const FixtureLayerInputs& in) {
          return run_tp(isa, test_node_group(nodes), experts, lora, in.tokens, in.top_k, in.input, in.expert_ids, in.weights,
                        in.grad_output);
        },
        ", " + std::to_string(nodes) + " nodes");
}

// The partials are added in node order: for a given node count the output and every gradient
// are the same bits whatever the threads per node, and whichever node's workers ran an item
// (virtual nodes on one memory node lend each other idle workers: ThreadPool::link_siblings).
inline void run_tp_thread_identity(kernels::Isa isa, std::vector<int> thread_totals) {
  MoeShape s{96, 200, 8, 3};
  auto w = random_expert_weights(s, 15);
  LayerLora lora = random_lora(s, 8, 16.0f, 16, 2);
  for (int nodes : {1, 2, 3}) {
    for (int tokens : {1, 5, 100}) {
      auto routing = random_routing(tokens, s, 17);
      auto x = random_activations(static_cast<std::size_t>(tokens) * s.hidden, 18);
      auto go = random_activations(x.size(), 19);
      std::vector<SftResult> results;
      for (int threads : thread_totals)
        results.push_back(run_tp(isa, test_node_group(nodes, std::max(threads, nodes)), w, lora, tokens, s.top_k, x, routing.expert_ids,
                                 routing.weights, go));
      check_same_sft_bits(results, thread_totals, std::to_string(nodes) + " nodes, " + std::to_string(tokens) + " tokens, threads", true);
      // Each node's backward reading its own Wᵀ copy of its slice: the same bits again.
      std::vector<SftResult> copies;
      copies.push_back(std::move(results[0]));
      copies.push_back(run_tp(isa, test_node_group(nodes, std::max(thread_totals[0], nodes)), w, lora, tokens, s.top_k, x, routing.expert_ids,
                              routing.weights, go, nullptr, true));
      check_same_sft_bits(copies, {0, 1}, std::to_string(nodes) + " nodes, " + std::to_string(tokens) + " tokens, weight copy", true);
    }
  }
}

// Nodes on one memory node share the forward's gathered x (shared_gather.hpp): the output, and
// the gradients of a backward after a saved forward, are the same bits as with per-node gathers,
// for bf16, int8 and int4 weights, with and without LoRA, rows by rows or in tile order (forced
// on every ISA), one or several gather units an expert. int4 at groups of 32 does not share.
inline void run_tp_shared_gather_identity(kernels::Isa isa) {
  MoeShape s{80, 200, 8, 3};
  auto w = random_expert_weights(s, 41);
  for (auto [type, group] : {std::pair{WeightType::bf16, 0}, {WeightType::int8, 0}, {WeightType::int4, 64}, {WeightType::int4, 32}}) {
    const quant::QuantizedExperts q = type == WeightType::bf16 ? quant::QuantizedExperts{} : quant::quantize_experts(w.view(), type, group, nullptr);
    for (int rank : {0, 8}) {
      LayerLora lora = random_lora(s, rank, 16.0f, 42, 2);
      for (int nodes : {2, 3}) {
        SftLayerOptions opt{300, 1, std::max(rank, 1), s.top_k};
        const ExpertWeightsView view = w.view();
        TensorParallelLayer layer(s, type, group, test_node_group(nodes), isa, opt,
                                  [&](quant::IntermediateSlice sl, numa::ThreadPool& pool, int node) {
                                    return type == WeightType::bf16 ? PackedExpertWeights::pack_slice(view, sl, pool, node)
                                                                    : PackedExpertWeights::pack_quantized(quant::slice_experts(q, sl), pool, node);
                                  },
                                  lora_view(lora));
        const bool can_share = layer.node_count() > 1 && !(type == WeightType::int4 && group == 32);
        CHECK(layer.gather_shared() == can_share);
        for (int tile_order : {-1, 16})
          for (int tokens : {1, 37, 300}) {
            INFO(weight_type_name(type) << " group " << group << ", rank " << rank << ", " << nodes << " nodes, tile order " << tile_order
                                        << ", " << tokens << " tokens");
            for (int n = 0; n < layer.node_count(); ++n) layer.node_layer(n).forward_pass().set_tile_order_min_rows(tile_order);
            auto routing = random_routing(tokens, s, 43 + tokens);
            for (std::size_t i = 4; i < routing.expert_ids.size(); i += 9) routing.expert_ids[i] = -1;
            auto x = random_activations(static_cast<std::size_t>(tokens) * s.hidden, 44);
            auto xb = to_bf16(x.data(), x.size());
            auto go = random_activations(x.size(), 45);
            std::vector<SftResult> results;
            for (bool shared : {true, false}) {
              layer.set_gather_shared(shared);
              CHECK(layer.gather_shared() == (shared && can_share));
              SftResult r;
              r.out.assign(x.size(), 5.0f);
              r.grad_input.assign(x.size(), 7.0f);
              r.grads = lora.zeros_like();
              std::vector<float> plain(x.size(), 3.0f);
              layer.forward_sft(tokens, s.top_k, xb.data(), routing.expert_ids.data(), routing.weights.data(), plain.data(), false);
              layer.forward_sft(tokens, s.top_k, xb.data(), routing.expert_ids.data(), routing.weights.data(), r.out.data(), true);
              CHECK(std::memcmp(plain.data(), r.out.data(), plain.size() * sizeof(float)) == 0);
              layer.backward(go.data(), r.grad_input.data(), lora_grad_view(r.grads));
              results.push_back(std::move(r));
            }
            check_same_sft_bits(results, {1, 0}, "shared gather on / off", true);
          }
      }
    }
  }
}

}  // namespace tilemoe::test
