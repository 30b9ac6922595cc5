#pragma once
// The fast forward of one ISA against the reference path over a grid of awkward shapes:
// sizes off every tile multiple, 1 to 1024 tokens, top-k 1 to 8, LoRA rank 1 to 64, experts
// without LoRA, experts with no tokens, ids < 0. Included by one test file per ISA.
#include <cstring>
#include <limits>

#include "catch.hpp"
#include "fixture_layers.hpp"
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
// held_lora: the set as a loaded adapter is given (its packed form made once).
inline double forward_error(kernels::Isa isa, const MoeShape& s, int tokens, const LayerLora& lora, numa::ThreadPool& pool,
                            std::uint64_t seed, int tile_order_min_rows = -1, bool held_lora = false) {
  auto w = random_expert_weights(s, seed);
  auto routing = random_routing(tokens, s, seed + 2);
  for (std::size_t i = 5; i < routing.expert_ids.size(); i += 7) routing.expert_ids[i] = -1;  // run elsewhere
  auto x = random_activations(static_cast<std::size_t>(tokens) * s.hidden, seed + 3);
  MoeBatch<float> batch{tokens, s.top_k, x.data(), routing.expert_ids.data(), routing.weights.data()};
  std::vector<float> want(x.size()), got(x.size());
  reference_forward(w.view(), lora, batch, want.data());
  auto packed = PackedExpertWeights::pack(w.view(), pool);
  MoeForward fwd(packed, isa, pool);
  fwd.set_tile_order_min_rows(tile_order_min_rows);
  if (held_lora) fwd.set_lora_held(seed + 1);
  auto xb = to_bf16(x.data(), x.size());
  fwd.forward(lora, tokens, s.top_k, xb.data(), routing.expert_ids.data(), routing.weights.data(), got.data());
  return rel_error(got, want);
}

inline double forward_error(kernels::Isa isa, const MoeShape& s, int tokens, int rank, int lora_every, numa::ThreadPool& pool,
                            std::uint64_t seed, int tile_order_min_rows = -1, bool held_lora = false) {
  const LayerLora lora = random_lora(s, rank, 2.0f * std::max(rank, 1), seed + 1, lora_every);
  return forward_error(isa, s, tokens, lora, pool, seed, tile_order_min_rows, held_lora);
}

// Gate, up and down with ranks of their own (PEFT's rank_pattern), or no LoRA on one of gate and
// up (an adapter that targets some projections), in both LoRA forms and at ranks of one or several
// panels. (Integer weights project gate and up as one product: moe_forward_quantized_grid.hpp.)
inline void run_forward_projection_ranks(kernels::Isa isa) {
  numa::ThreadPool& pool = pool_for_threads(0);
  const MoeShape s{100, 72, 6, 2};
  for (const auto& r : kProjectionRanks) {
    const LayerLora lora = projection_ranks_lora(s, r);
    for (int tokens : {7, 150}) {  // few rows an expert (the f32 form), and the packed form
      INFO("ranks gate " << r[0] << " up " << r[1] << " down " << r[2] << ", " << tokens << " tokens");
      CHECK(forward_error(isa, s, tokens, lora, pool, 23 + tokens) <= 1e-2);
      CHECK(forward_error(isa, s, tokens, lora, pool, 23 + tokens, 1) <= 1e-2);         // x and h in tile order
      CHECK(forward_error(isa, s, tokens, lora, pool, 23 + tokens, -1, true) <= 1e-2);  // held: packed at every row count
    }
  }
}

inline void run_forward_grid(kernels::Isa isa) {
  numa::ThreadPool& pool = pool_for_threads(0);
  for (const auto& c : awkward_shape_grid()) {
    INFO("hidden " << c.shape.hidden << " inter " << c.shape.intermediate << " experts " << c.shape.num_experts << " top-"
                   << c.shape.top_k << " swiglu_limit " << c.shape.swiglu_limit << " tokens " << c.tokens << " rank " << c.rank << " lora on every " << c.lora_every);
    CHECK(forward_error(isa, c.shape, c.tokens, c.rank, c.lora_every, pool, 17 + c.tokens) <= 1e-2);
    // x and h in tile order for every expert, whatever the ISA's own choice (both LoRA forms
    // then read their rows from tiles).
    CHECK(forward_error(isa, c.shape, c.tokens, c.rank, c.lora_every, pool, 17 + c.tokens, 1) <= 1e-2);
    // A held set takes the packed LoRA form at every row count.
    if (c.rank > 0) CHECK(forward_error(isa, c.shape, c.tokens, c.rank, c.lora_every, pool, 17 + c.tokens, -1, true) <= 1e-2);
  }
}

// A held LoRA set (a loaded adapter) is packed by the first call that needs the packed form (16
// rows or more per expert) and reused by later calls; a new number packs again. Caching changes
// no bits: held and per-call forwards agree exactly at every row count.
inline void run_held_lora(kernels::Isa isa) {
  numa::ThreadPool& pool = pool_for_threads(0);
  MoeShape s{96, 72, 8, 3};
  auto w = random_expert_weights(s, 31);
  auto packed = PackedExpertWeights::pack(w.view(), pool);
  LayerLora lora = random_lora(s, 8, 16.0f, 32, 2);
  LayerLora other = random_lora(s, 4, 8.0f, 33);
  MoeForward held(packed, isa, pool), per_call(packed, isa, pool);
  auto run = [&](MoeForward& fwd, const LayerLora& set, int tokens, std::uint64_t seed) {
    auto routing = random_routing(tokens, s, seed);
    auto x = random_activations(static_cast<std::size_t>(tokens) * s.hidden, seed + 1);
    auto xb = to_bf16(x.data(), x.size());
    std::vector<float> y(x.size());
    fwd.forward(set, tokens, s.top_k, xb.data(), routing.expert_ids.data(), routing.weights.data(), y.data());
    return y;
  };
  auto check = [&](const LayerLora& set, int tokens, std::uint64_t seed) {
    INFO(tokens << " tokens");
    const auto a = run(held, set, tokens, seed), b = run(per_call, set, tokens, seed);
    CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    auto routing = random_routing(tokens, s, seed);
    auto x = random_activations(static_cast<std::size_t>(tokens) * s.hidden, seed + 1);
    std::vector<float> want(x.size());
    MoeBatch<float> batch{tokens, s.top_k, x.data(), routing.expert_ids.data(), routing.weights.data()};
    reference_forward(w.view(), set, batch, want.data());
    CHECK(rel_error(a, want) <= 1e-2);
  };
  held.set_lora_held(1001);
  const int many = 200;  // 75 rows per expert on average
  for (int tokens : {1, 3, many, 2, many + 1}) check(lora, tokens, 40 + tokens);
  // Packed once: an in-place edit, which a held set must not have, is not seen by the packed form.
  const auto before = run(held, lora, many, 60);
  for (auto& p : lora.proj)
    for (auto& v : p.b) v += 0.5f;
  const auto after = run(held, lora, many, 60);
  CHECK(std::memcmp(before.data(), after.data(), after.size() * sizeof(float)) == 0);
  // A new number (a new adapter, or the edited one loaded again) is packed again.
  held.set_lora_held(1002);
  check(lora, many, 60);
  held.set_lora_held(1003);
  check(other, 7, 70);
  check(other, many, 71);
  // A non-finite value in a held B reaches its own output column only, as in PyTorch. (At rank 8
  // a panel of B' is half a k-block: the short panel form would read output 17's first k-pairs
  // against the zero columns of panel 0's xa, and 0 * inf is NaN in outputs 0-15.)
  LayerLora bad = random_lora(s, 8, 16.0f, 34);
  LoraProjectionT<float>& down = bad[Projection::down];
  const int col = 17;
  for (int e = 0; e < s.num_experts; ++e) down.b_of(e)[static_cast<std::size_t>(col) * down.rank] = std::numeric_limits<float>::infinity();
  held.set_lora_held(1004);
  const auto y = run(held, bad, many, 80);
  int nonfinite_elsewhere = 0, nonfinite_at_col = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    const bool own = static_cast<int>(i % static_cast<std::size_t>(s.hidden)) == col;
    if (!std::isfinite(y[i])) ++(own ? nonfinite_at_col : nonfinite_elsewhere);
  }
  CHECK(nonfinite_elsewhere == 0);
  CHECK(nonfinite_at_col > 0);
}

inline void run_fixture_forward(kernels::Isa isa) {
  numa::ThreadPool& pool = pool_for_threads(0);
  for_each_fixture_layer([&](const FixtureLayer& f) {
    auto packed = PackedExpertWeights::pack(f.experts.view(), pool);
    MoeForward fwd(packed, isa, pool);
    const FixtureLayerInputs& in = f.in;
    std::vector<float> y(in.input.size());
    fwd.forward(f.lora.lora, in.tokens, in.top_k, in.input_bf16.data(), in.expert_ids.data(), in.weights.data(), y.data());
    CHECK(rel_error(y, in.expected(f.ref, "output")) <= 1e-2);
  });
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
