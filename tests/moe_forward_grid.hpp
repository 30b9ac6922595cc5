#pragma once
// The fast forward of one ISA against the reference path over a grid of awkward shapes:
// sizes off every tile multiple, 1 to 1024 tokens, top-k 1 to 8, LoRA rank 1 to 64, experts
// without LoRA, experts with no tokens, ids < 0. Included by one test file per ISA.
#include <cstring>

#include "catch.hpp"
#include "fixture_cases.hpp"
#include "shape_grid.hpp"
#include "src/io/safetensors.hpp"
#include "src/layer/moe_compute.hpp"
#include "src/layer/moe_forward.hpp"
#include "src/layer/synthetic_layer.hpp"
#include "src/lora/peft_adapter.hpp"
#include "src/model/checkpoint.hpp"
#include "test_util.hpp"

namespace tilemoe::test {

// tile_order_min_rows: -1 the ISA's choice; otherwise forced (MoeForward::set_tile_order_min_rows).
inline double forward_error(kernels::Isa isa, const MoeShape& s, int tokens, int rank, int lora_every, numa::ThreadPool& pool,
                            std::uint64_t seed, int tile_order_min_rows = -1) {
  auto w = random_expert_weights(s, seed);
  LayerLora lora = random_lora(s, rank, 2.0f * std::max(rank, 1), seed + 1, lora_every);
  auto routing = random_routing(tokens, s, seed + 2);
  for (std::size_t i = 5; i < routing.expert_ids.size(); i += 7) routing.expert_ids[i] = -1;  // run elsewhere
  auto x = random_activations(static_cast<std::size_t>(tokens) * s.hidden, seed + 3);
  MoeBatch<float> batch{tokens, s.top_k, x.data(), routing.expert_ids.data(), routing.weights.data()};
  std::vector<float> want(x.size()), got(x.size());
  reference_forward(w.view(), lora, batch, want.data());
  auto packed = PackedExpertWeights::pack(w.view(), pool);
  MoeForward fwd(packed, isa, pool);
  fwd.set_tile_order_min_rows(tile_order_min_rows);
  auto xb = to_bf16(x.data(), x.size());
  fwd.forward(lora, tokens, s.top_k, xb.data(), routing.expert_ids.data(), routing.weights.data(), got.data());
  return rel_error(got, want);
}

inline void run_forward_grid(kernels::Isa isa) {
  numa::ThreadPool& pool = pool_for_threads(0);
  for (const auto& c : awkward_shape_grid()) {
    INFO("hidden " << c.shape.hidden << " inter " << c.shape.intermediate << " experts " << c.shape.num_experts << " top-"
                   << c.shape.top_k << " tokens " << c.tokens << " rank " << c.rank << " lora on every " << c.lora_every);
    CHECK(forward_error(isa, c.shape, c.tokens, c.rank, c.lora_every, pool, 17 + c.tokens) <= 1e-2);
    // x and h in tile order for every expert, whatever the ISA's own choice (both LoRA forms
    // then read their rows from tiles).
    CHECK(forward_error(isa, c.shape, c.tokens, c.rank, c.lora_every, pool, 17 + c.tokens, 1) <= 1e-2);
  }
}

inline void run_fixture_forward(kernels::Isa isa) {
  numa::ThreadPool& pool = pool_for_threads(0);
  for (const auto& c : fixture_cases()) {
    auto ck = Checkpoint::open(c.dir + "/model");
    auto ref = io::SafetensorsFile::open(c.dir + "/reference.safetensors");
    for (int layer : c.layers) {
      auto experts = ck.load_layer_experts(layer);
      auto lora = load_layer_lora(c.dir + "/adapter", ck.config(), layer);
      auto packed = PackedExpertWeights::pack(experts.view(), pool);
      MoeForward fwd(packed, isa, pool);
      FixtureLayerInputs in = read_fixture_layer(ref, layer);
      std::vector<float> y(in.input.size());
      fwd.forward(lora.lora, in.tokens, in.top_k, in.input_bf16.data(), in.expert_ids.data(), in.weights.data(), y.data());
      INFO(c.name << " layer " << layer);
      CHECK(rel_error(y, in.expected(ref, "output")) <= 1e-2);
    }
  }
}

// The work split depends on the routing only, so any thread count gives the same bits; and the
// layout of x and h (by rows or in tile order) changes where A is read from, not the order of
// any sum, so it gives the same bits too.
inline void run_thread_count_identity(kernels::Isa isa, std::vector<int> thread_counts) {
  MoeShape s{96, 72, 8, 3};
  auto w = random_expert_weights(s, 5);
  LayerLora lora = random_lora(s, 8, 16.0f, 6, 2);
  for (int tokens : {1, 5, 100}) {
    auto routing = random_routing(tokens, s, 7);
    auto xb = to_bf16(random_activations(static_cast<std::size_t>(tokens) * s.hidden, 8).data(), static_cast<std::size_t>(tokens) * s.hidden);
    std::vector<float> first;
    for (int threads : thread_counts) {
      numa::ThreadPool& pool = pool_for_threads(threads);
      auto packed = PackedExpertWeights::pack(w.view(), pool);
      for (int tile_order : {0, 1, 16}) {
        MoeForward fwd(packed, isa, pool);
        fwd.set_tile_order_min_rows(tile_order);
        std::vector<float> y(xb.size());
        fwd.forward(lora, tokens, s.top_k, xb.data(), routing.expert_ids.data(), routing.weights.data(), y.data());
        if (first.empty()) first = y;
        INFO(tokens << " tokens, " << threads << " threads, tile order from " << tile_order << " rows (0: never)");
        CHECK(std::memcmp(first.data(), y.data(), y.size() * sizeof(float)) == 0);
      }
    }
  }
}

}  // namespace tilemoe::test
