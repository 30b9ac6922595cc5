#pragma once
// The fast fine-tuning path (forward_sft + backward) of one ISA against the reference path: the
// awkward-shape grid of the forward tests, the PyTorch + PEFT fixtures, and bit-identical
// results for any thread count. Included by one test file per ISA.
#include <cstring>

#include "catch.hpp"
#include "fixture_layers.hpp"
#include "shape_grid.hpp"
#include "src/io/safetensors.hpp"
#include "src/layer/moe_compute.hpp"
#include "src/layer/moe_sft_layer.hpp"
#include "src/layer/synthetic_layer.hpp"
#include "src/lora/peft_adapter.hpp"
#include "src/model/checkpoint.hpp"
#include "test_util.hpp"

namespace tilemoe::test {

struct SftResult {
  std::vector<float> out, grad_input;
  LayerLora grads;
  LayerLoraBf16 grads16;  // with bf16 gradients asked for: those, and grads is left as it was
};

// forward_sft (saved) then backward on `isa`, gradients overwritten into buffers full of junk.
// With weight_copy the backward reads a Wᵀ copy of the weights (SftLayerOptions::backward_weight_copy).
// `view`, when given, is what the layer reads instead of lora_view(lora) (the same set stored
// otherwise); the gradients still take lora's shapes.
inline SftResult run_sft(kernels::Isa isa, numa::ThreadPool& pool, const ExpertWeights& w, const LayerLora& lora, int tokens, int top_k,
                         const std::vector<float>& x, const std::vector<std::int64_t>& ids, const std::vector<float>& wts,
                         const std::vector<float>& grad_out, bool weight_copy = false, const LayerLoraView* view = nullptr,
                         bool bf16_grads = false) {
  auto packed = PackedExpertWeights::pack(w.view(), pool);
  SftLayerOptions options{std::max(tokens, 1), 1, lora_view(lora).max_rank()};
  options.backward_weight_copy = weight_copy;
  MoeSftLayer layer(packed, isa, pool, options, view ? *view : lora_view(lora));
  CHECK((layer.weight_copy_bytes() > 0) == weight_copy);
  SftResult r;
  r.out.resize(x.size());
  r.grad_input.assign(x.size(), 7.0f);
  r.grads = lora.zeros_like();
  for (auto& p : r.grads.proj) {
    std::fill(p.a.begin(), p.a.end(), 7.0f);  // overwrite mode must replace all of it
    std::fill(p.b.begin(), p.b.end(), 7.0f);
  }
  auto xb = to_bf16(x.data(), x.size());
  layer.forward_sft(tokens, top_k, xb.data(), ids.data(), wts.data(), r.out.data(), true);
  if (bf16_grads) {
    r.grads16 = round_lora_to_bf16(r.grads);  // junk (7.0) to overwrite
    layer.backward(grad_out.data(), r.grad_input.data(), lora_grad_view(r.grads16));
  } else {
    layer.backward(grad_out.data(), r.grad_input.data(), lora_grad_view(r.grads));
  }
  CHECK(layer.cached_forwards() == 0);
  return r;
}

// Norm-wise errors of every LoRA gradient tensor (all experts of one projection together).
inline void check_lora_grads(const LayerLora& got, const LayerLora& want, double tol) {
  for (Projection p : kProjections) {
    INFO(projection_name(p));
    CHECK(rel_error(got[p].a, want[p].a) <= tol);
    CHECK(rel_error(got[p].b, want[p].b) <= tol);
  }
}

// A LoRA set's factors stored as bf16 instead of f32 (the same values: random_lora draws them
// bf16-exact) give every output and gradient bit for bit: the packed form is the same bf16, the
// f32 form the same floats. `what` says which run the two are.
inline void check_same_bits(const SftResult& f32, const SftResult& bf16, const char* what) {
  INFO(what);
  CHECK(bf16.out == f32.out);
  CHECK(bf16.grad_input == f32.grad_input);
  for (Projection p : kProjections) {
    INFO(projection_name(p));
    CHECK(bf16.grads[p].a == f32.grads[p].a);
    CHECK(bf16.grads[p].b == f32.grads[p].b);
  }
}

// bf16 gradients are the f32 ones rounded once (each element is written by one product).
inline void check_bf16_grads(const LayerLora& f32, const LayerLoraBf16& bf16) {
  for (Projection p : kProjections) {
    INFO("bf16 gradients of " << projection_name(p));
    CHECK(bf16[p].a == round_lora_to_bf16(f32).proj[static_cast<int>(p)].a);
    CHECK(bf16[p].b == round_lora_to_bf16(f32).proj[static_cast<int>(p)].b);
  }
}

// random_lora's factors are bf16 values held in f32, which the bit-for-bit comparisons rely on.
inline LayerLoraBf16 bf16_copy_of_exact(const LayerLora& lora) {
  LayerLoraBf16 l16 = round_lora_to_bf16(lora);
  for (int p = 0; p < 3; ++p)
    for (std::size_t i = 0; i < lora.proj[p].a.size(); ++i) REQUIRE(bf16_to_float(l16.proj[p].a[i]) == lora.proj[p].a[i]);
  return l16;
}

// One random case of the backward grids (every 7th slot from the 6th runs elsewhere) and what the
// reference path gives for it.
struct BackwardCase {
  ExpertWeights w;
  LayerLora lora;
  RandomRouting routing;
  std::vector<float> x, go;  // the input and the output's gradient
  std::vector<float> want_out, want_dx;
  LayerLora want_grads;
};

inline BackwardCase make_backward_case(const MoeShape& s, int tokens, LayerLora lora, std::uint64_t seed) {
  BackwardCase c;
  c.w = random_expert_weights(s, seed);
  c.lora = std::move(lora);
  c.routing = random_routing(tokens, s, seed + 2);
  for (std::size_t i = 5; i < c.routing.expert_ids.size(); i += 7) c.routing.expert_ids[i] = -1;  // run elsewhere
  c.x = random_activations(static_cast<std::size_t>(tokens) * s.hidden, seed + 3);
  c.go = random_activations(c.x.size(), seed + 4);
  MoeBatch<float> batch{tokens, s.top_k, c.x.data(), c.routing.expert_ids.data(), c.routing.weights.data()};
  c.want_out.resize(c.x.size());
  c.want_dx.resize(c.x.size());
  c.want_grads = c.lora.zeros_like();
  reference_forward(c.w.view(), c.lora, batch, c.want_out.data());
  reference_backward(c.w.view(), c.lora, batch, c.go.data(), c.want_dx.data(), &c.want_grads);
  return c;
}

inline BackwardCase make_backward_case(const MoeShape& s, int tokens, int rank, int lora_every, std::uint64_t seed) {
  return make_backward_case(s, tokens, random_lora(s, rank, 2.0f * std::max(rank, 1), seed + 1, lora_every), seed);
}

inline void check_backward_case(kernels::Isa isa, const MoeShape& s, int tokens, int rank, int lora_every, numa::ThreadPool& pool,
                                std::uint64_t seed) {
  const BackwardCase c = make_backward_case(s, tokens, rank, lora_every, seed);
  const auto& [w, lora, routing, x, go, want_out, want_dx, want_grads] = c;
  SftResult got = run_sft(isa, pool, w, lora, tokens, s.top_k, x, routing.expert_ids, routing.weights, go);
  CHECK(rel_error(got.out, want_out) <= 1e-2);
  CHECK(rel_error(got.grad_input, want_dx) <= 1e-2);
  check_lora_grads(got.grads, want_grads, 2e-2);
  if (rank > 0) {
    const LayerLoraBf16 lora16 = bf16_copy_of_exact(lora);
    const LayerLoraView view16 = lora_view(lora16);
    const SftResult b16 = run_sft(isa, pool, w, lora, tokens, s.top_k, x, routing.expert_ids, routing.weights, go, false, &view16, true);
    INFO("the set and its gradients stored as bf16");
    CHECK(b16.out == got.out);
    CHECK(b16.grad_input == got.grad_input);
    check_bf16_grads(got.grads, b16.grads16);
  }
}

inline void run_backward_grid(kernels::Isa isa) {
  numa::ThreadPool& pool = pool_for_threads(0);
  for (const auto& c : awkward_shape_grid()) {
    INFO("hidden " << c.shape.hidden << " inter " << c.shape.intermediate << " experts " << c.shape.num_experts << " top-"
                   << c.shape.top_k << " swiglu_limit " << backward_shape(c.shape).swiglu_limit << " tokens " << c.tokens << " rank " << c.rank << " lora on every " << c.lora_every);
    check_backward_case(isa, backward_shape(c.shape), c.tokens, c.rank, c.lora_every, pool, 31 + c.tokens);
  }
}

// Every fixture case through a fine-tuning step that `run(experts, lora, inputs)` performs and
// returns as an SftResult: PyTorch autograd through PEFT is the oracle. `label` tells runs apart.
template <typename Run>
void check_fixture_sft(Run&& run, const std::string& label = "") {
  for_each_fixture_layer([&](const FixtureLayer& f) {
    SftResult got = run(f.experts, f.lora.lora, f.in);
    INFO(label);
    CHECK(rel_error(got.out, f.in.expected(f.ref, "output")) <= 1e-2);
    CHECK(rel_error(got.grad_input, f.in.expected(f.ref, "grad_input")) <= 1e-2);
    check_fixture_lora_grads(got.grads, f.lora, f.ref, f.config.shape.num_experts);
  });
}

inline void run_fixture_backward(kernels::Isa isa) {
  numa::ThreadPool& pool = pool_for_threads(0);
  check_fixture_sft([&](const ExpertWeights& experts, const LayerLora& lora, const FixtureLayerInputs& in) {
    return run_sft(isa, pool, experts, lora, in.tokens, in.top_k, in.input, in.expert_ids, in.weights, in.grad_output);
  });
}

// results[i] against results[0], bit for bit: grad_input and every LoRA gradient (and the output
// when `with_output`). labels[i] names run i.
inline void check_same_sft_bits(const std::vector<SftResult>& results, const std::vector<int>& labels, const std::string& what,
                                bool with_output) {
  for (std::size_t i = 1; i < results.size(); ++i) {
    INFO(what << " " << labels[i] << " against " << labels[0]);
    if (with_output) CHECK(results[i].out == results[0].out);
    CHECK(results[i].grad_input == results[0].grad_input);
    for (int p = 0; p < 3; ++p) {
      CHECK(results[i].grads.proj[p].a == results[0].grads.proj[p].a);
      CHECK(results[i].grads.proj[p].b == results[0].grads.proj[p].b);
    }
  }
}

// Gate, up and down with ranks of their own (PEFT's rank_pattern): dX adds gate's term fused into
// its product and up's after it, each at its own rank, and dh's epilogue reads both x Aᵀ.
inline void run_backward_projection_ranks(kernels::Isa isa) {
  numa::ThreadPool& pool = pool_for_threads(0);
  const MoeShape s{100, 72, 6, 2};
  const int ranks[][3] = {{6, 11, 16}, {16, 16, 5}, {5, 16, 8}, {32, 17, 3}, {2, 64, 1}};
  for (const auto& r : ranks) {
    for (int tokens : {7, 150}) {  // few rows an expert (the f32 form), and the packed form
      INFO("ranks gate " << r[0] << " up " << r[1] << " down " << r[2] << ", " << tokens << " tokens");
      const BackwardCase c = make_backward_case(s, tokens, projection_ranks_lora(s, r), 19 + tokens);
      const SftResult got = run_sft(isa, pool, c.w, c.lora, tokens, s.top_k, c.x, c.routing.expert_ids, c.routing.weights, c.go);
      CHECK(rel_error(got.out, c.want_out) <= 1e-2);
      CHECK(rel_error(got.grad_input, c.want_dx) <= 1e-2);
      check_lora_grads(got.grads, c.want_grads, 2e-2);
    }
  }
}

// Items depend on the routing only: grad_input and every LoRA gradient are the same bits for any
// thread count.
inline void run_backward_thread_identity(kernels::Isa isa, std::vector<int> thread_counts) {
  MoeShape s{96, 72, 8, 3};
  auto w = random_expert_weights(s, 5);
  LayerLora lora = random_lora(s, 8, 16.0f, 6, 2);
  for (int tokens : {1, 5, 100}) {
    auto routing = random_routing(tokens, s, 7);
    auto x = random_activations(static_cast<std::size_t>(tokens) * s.hidden, 8);
    auto go = random_activations(x.size(), 9);
    std::vector<SftResult> results;
    for (int threads : thread_counts)
      results.push_back(run_sft(isa, pool_for_threads(threads), w, lora, tokens, s.top_k, x, routing.expert_ids, routing.weights, go));
    check_same_sft_bits(results, thread_counts, std::to_string(tokens) + " tokens, threads", false);
  }
}

// The backward reading a Wᵀ copy of the weights gives the bits of the one that repacks Wᵀ per
// item, on the whole shape grid (column-split and split-K experts, odd panel counts, k-block
// tails); the copy holds exactly the repacked buffers.
inline void run_backward_weight_copy_identity(kernels::Isa isa) {
  numa::ThreadPool& pool = pool_for_threads(0);
  for (const auto& c : awkward_shape_grid()) {
    INFO("hidden " << c.shape.hidden << " inter " << c.shape.intermediate << " experts " << c.shape.num_experts << " top-"
                   << c.shape.top_k << " swiglu_limit " << c.shape.swiglu_limit << " tokens " << c.tokens << " rank " << c.rank);
    const std::uint64_t seed = 57 + c.tokens;
    auto w = random_expert_weights(c.shape, seed);
    LayerLora lora = random_lora(c.shape, c.rank, 2.0f * std::max(c.rank, 1), seed + 1, c.lora_every);
    auto routing = random_routing(c.tokens, c.shape, seed + 2);
    auto x = random_activations(static_cast<std::size_t>(c.tokens) * c.shape.hidden, seed + 3);
    auto go = random_activations(x.size(), seed + 4);
    std::vector<SftResult> results;
    for (bool copy : {false, true})
      results.push_back(run_sft(isa, pool, w, lora, c.tokens, c.shape.top_k, x, routing.expert_ids, routing.weights, go, copy));
    check_same_sft_bits(results, {0, 1}, "weight copy (1) against repacking (0)", true);
  }
}

}  // namespace tilemoe::test
