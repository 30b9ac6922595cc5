#pragma once
// The forward with int8/int4 base weights against the reference path run on the dequantized
// weights with the same per-row int8 activations (mxfp4: the bf16 activations themselves), over the awkward-shape grid and the fixtures,
// on one ISA; and the quantization error itself against bf16, on Gaussian weights, so that a
// change that makes it worse is seen. Included by one test file per ISA.
#include <cstring>
#include <map>
#include <random>

#include "catch.hpp"
#include "fixture_layers.hpp"
#include "shape_grid.hpp"
#include "src/io/safetensors.hpp"
#include "src/layer/moe_compute.hpp"
#include "src/layer/moe_forward.hpp"
#include "src/layer/moe_sft_layer.hpp"
#include "src/layer/synthetic_layer.hpp"
#include "src/lora/peft_adapter.hpp"
#include "src/model/checkpoint.hpp"
#include "src/quant/quantize.hpp"
#include "test_util.hpp"

namespace tilemoe::test {

struct QuantCase {
  WeightType type;
  int group;
};
inline const QuantCase kQuantCases[] = {{WeightType::int8, 0},   {WeightType::int4, 32}, {WeightType::int4, 64},
                                        {WeightType::int4, 128}, {WeightType::mxfp4, 32}};

// tile_order_min_rows: -1 the ISA's choice; otherwise forced (MoeForward::set_tile_order_min_rows).
inline std::vector<float> quantized_forward(kernels::Isa isa, const quant::QuantizedExperts& q, const LayerLora& lora, int tokens,
                                            const RandomRouting& routing, const std::vector<bf16>& xb, numa::ThreadPool& pool,
                                            int tile_order_min_rows = -1, bool held_lora = false) {
  auto packed = PackedExpertWeights::pack_quantized(q, pool);
  MoeForward fwd(packed, isa, pool);
  fwd.set_tile_order_min_rows(tile_order_min_rows);
  if (held_lora) fwd.set_lora_held(77);
  std::vector<float> got(xb.size());
  fwd.forward(lora, tokens, q.shape.top_k, xb.data(), routing.expert_ids.data(), routing.weights.data(), got.data());
  return got;
}

inline double quantized_forward_error(kernels::Isa isa, const QuantCase& qc, const MoeShape& s, int tokens, const LayerLora& lora,
                                      numa::ThreadPool& pool, std::uint64_t seed, int tile_order_min_rows = -1, bool held_lora = false) {
  auto w = random_expert_weights(s, seed);
  auto q = quant::quantize_experts(w.view(), qc.type, qc.group, &pool);
  auto routing = random_routing(tokens, s, seed + 2);
  for (std::size_t i = 5; i < routing.expert_ids.size(); i += 7) routing.expert_ids[i] = -1;
  auto x = random_activations(static_cast<std::size_t>(tokens) * s.hidden, seed + 3);
  auto xb = to_bf16(x.data(), x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = bf16_to_float(xb[i]);  // the kernels see bf16 x
  MoeBatch<float> batch{tokens, s.top_k, x.data(), routing.expert_ids.data(), routing.weights.data()};
  std::vector<float> want(x.size());
  reference_forward(w.view(), lora, batch, want.data(), ReferenceOptions{is_integer_weight_type(qc.type), &q});
  return rel_error(quantized_forward(isa, q, lora, tokens, routing, xb, pool, tile_order_min_rows, held_lora), want);
}

inline double quantized_forward_error(kernels::Isa isa, const QuantCase& qc, const MoeShape& s, int tokens, int rank, int lora_every,
                                      numa::ThreadPool& pool, std::uint64_t seed, int tile_order_min_rows = -1) {
  const LayerLora lora = random_lora(s, rank, 2.0f * std::max(rank, 1), seed + 1, lora_every);
  return quantized_forward_error(isa, qc, s, tokens, lora, pool, seed, tile_order_min_rows);
}

// Ranks of their own for gate, up and down, or none on one of gate and up (shape_grid.hpp's
// kProjectionRanks): integer weights project gate's and up's x Aᵀ a row block at a time, as one
// product where both are packed held sets (LoraTerm::project_rows_pair), else each on its own.
inline void run_quantized_projection_ranks(kernels::Isa isa) {
  numa::ThreadPool& pool = pool_for_threads(0);
  const MoeShape s{100, 72, 6, 2};
  for (const QuantCase& qc : {kQuantCases[0], kQuantCases[2], kQuantCases[4]}) {
    for (const auto& r : kProjectionRanks) {
      const LayerLora lora = projection_ranks_lora(s, r);
      for (int tokens : {7, 150}) {
        INFO(weight_type_name(qc.type) << " group " << qc.group << ", ranks gate " << r[0] << " up " << r[1] << " down " << r[2] << ", "
                                       << tokens << " tokens");
        CHECK(quantized_forward_error(isa, qc, s, tokens, lora, pool, 29 + tokens) <= 1e-2);
        CHECK(quantized_forward_error(isa, qc, s, tokens, lora, pool, 29 + tokens, 1) <= 1e-2);
        // Held: one product for gate and up where both are packed.
        CHECK(quantized_forward_error(isa, qc, s, tokens, lora, pool, 29 + tokens, -1, true) <= 1e-2);
      }
    }
  }
}

// A held set is packed once, gate's and up's A' side by side too (LoraTerm::project_rows_pair):
// held and per-call forwards (one product each) agree exactly, also when the layer is given
// another set under a new number, of another rank, and then the first again.
inline void run_quantized_held_lora(kernels::Isa isa) {
  numa::ThreadPool& pool = pool_for_threads(0);
  const MoeShape s{96, 72, 8, 3};
  auto w = random_expert_weights(s, 31);
  for (const QuantCase& qc : {kQuantCases[0], kQuantCases[3], kQuantCases[4]}) {
    auto q = quant::quantize_experts(w.view(), qc.type, qc.group, &pool);
    auto packed = PackedExpertWeights::pack_quantized(q, pool);
    const LayerLora first = random_lora(s, 8, 16.0f, 32), second = random_lora(s, 20, 8.0f, 33);
    MoeForward held(packed, isa, pool), per_call(packed, isa, pool);
    auto run = [&](MoeForward& fwd, const LayerLora& set, int tokens, std::uint64_t seed) {
      auto routing = random_routing(tokens, s, seed);
      const auto x = random_activations(static_cast<std::size_t>(tokens) * s.hidden, seed + 1);
      const auto xb = to_bf16(x.data(), x.size());
      std::vector<float> y(xb.size());
      fwd.forward(set, tokens, s.top_k, xb.data(), routing.expert_ids.data(), routing.weights.data(), y.data());
      return y;
    };
    auto check = [&](const LayerLora& set, int tokens, std::uint64_t seed) {
      INFO(weight_type_name(qc.type) << " group " << qc.group << ", " << tokens << " tokens, seed " << seed);
      const auto a = run(held, set, tokens, seed), b = run(per_call, set, tokens, seed);
      CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    };
    held.set_lora_held(1);
    check(first, 200, 1);
    check(first, 201, 2);
    held.set_lora_held(2);
    check(second, 200, 3);
    held.set_lora_held(3);
    check(first, 200, 4);
  }
}

inline void run_quantized_forward_grid(kernels::Isa isa) {
  numa::ThreadPool& pool = pool_for_threads(0);
  for (const QuantCase& qc : kQuantCases) {
    int index = 0;
    for (const auto& c : awkward_shape_grid()) {
      // Every other case holds every expert's codes in tile order, whatever the ISA.
      const int tile_order = index++ % 2 ? 1 : -1;
      INFO(weight_type_name(qc.type) << " group " << qc.group << " hidden " << c.shape.hidden << " inter " << c.shape.intermediate
                                     << " experts " << c.shape.num_experts << " top-" << c.shape.top_k << " swiglu_limit " << c.shape.swiglu_limit << " tokens " << c.tokens
                                     << " rank " << c.rank << " lora on every " << c.lora_every << " tile order from " << tile_order);
      CHECK(quantized_forward_error(isa, qc, c.shape, c.tokens, c.rank, c.lora_every, pool, 31 + c.tokens, tile_order) <= 1e-2);
    }
  }
}

inline void run_quantized_fixture_forward(kernels::Isa isa) {
  numa::ThreadPool& pool = pool_for_threads(0);
  for_each_fixture_layer([&](const FixtureLayer& f) {
    const FixtureLayerInputs& in = f.in;
    std::vector<float> x(in.input_bf16.size());
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = bf16_to_float(in.input_bf16[i]);
    MoeBatch<float> batch{in.tokens, in.top_k, x.data(), in.expert_ids.data(), in.weights.data()};
    for (const QuantCase& qc : kQuantCases) {
      auto q = quant::quantize_experts(f.experts.view(), qc.type, qc.group, &pool);
      std::vector<float> want(x.size());
      reference_forward(f.experts.view(), f.lora.lora, batch, want.data(), ReferenceOptions{is_integer_weight_type(qc.type), &q});
      auto packed = PackedExpertWeights::pack_quantized(q, pool);
      MoeForward fwd(packed, isa, pool);
      std::vector<float> y(x.size());
      fwd.forward(f.lora.lora, in.tokens, in.top_k, in.input_bf16.data(), in.expert_ids.data(), in.weights.data(), y.data());
      INFO(weight_type_name(qc.type) << " group " << qc.group);
      CHECK(rel_error(y, want) <= 1e-2);
      // Against PyTorch's bf16 output: the quantization error itself, within the bars below.
      const double vs_torch = rel_error(y, in.expected(f.ref, "output"));
      UNSCOPED_INFO("quantization error vs PyTorch: " << vs_torch);
      CHECK(vs_torch <= (qc.type == WeightType::int8 ? 2.5e-2 : 1.5e-1));
    }
  });
}

// Gaussian weights (std 1/sqrt(fan_in)) and activations, no LoRA: the quantization error of the
// whole layer's output (three projections, activations quantized twice) against the bf16
// forward. The errors compound through the layer (one int4 projection alone is ~0.10 at group
// 128, the layer ~0.18), so these bars only guard against regressions; the per-weight errors
// against the bars are checked where quantization is (tests/test_quantized_file.cpp).
inline void run_quantization_error(kernels::Isa isa) {
  numa::ThreadPool& pool = pool_for_threads(0);
  const MoeShape s{512, 384, 4, 2};
  ExpertWeights w;
  w.shape = s;
  std::mt19937 rng(99);
  const std::size_t per = static_cast<std::size_t>(s.hidden) * s.intermediate * s.num_experts;
  for (auto* v : {&w.gate, &w.up, &w.down}) {
    const float sd = 1.0f / std::sqrt(static_cast<float>(v == &w.down ? s.intermediate : s.hidden));
    std::normal_distribution<float> nd(0.0f, sd);
    v->resize(per);
    for (bf16& b : *v) b = float_to_bf16(nd(rng));
  }
  const int tokens = 64;
  auto routing = random_routing(tokens, s, 3);
  std::vector<float> x(static_cast<std::size_t>(tokens) * s.hidden);
  std::normal_distribution<float> nx(0.0f, 1.0f);
  for (float& v : x) v = nx(rng);
  auto xb = to_bf16(x.data(), x.size());
  auto packed = PackedExpertWeights::pack(w.view(), pool);
  MoeForward fwd(packed, isa, pool);
  std::vector<float> want(x.size());
  fwd.forward(LayerLora{}, tokens, s.top_k, xb.data(), routing.expert_ids.data(), routing.weights.data(), want.data());
  for (const QuantCase& qc : kQuantCases) {
    auto q = quant::quantize_experts(w.view(), qc.type, qc.group, &pool);
    const double err = rel_error(quantized_forward(isa, q, LayerLora{}, tokens, routing, xb, pool), want);
    // MXFP4's grid (8 magnitudes, 2 of mantissa) is coarser than int4's at the same group: 0.197 here.
    const double bar = qc.type == WeightType::int8 ? 3e-2 : qc.type == WeightType::mxfp4 ? 0.21 : qc.group == 32 ? 0.16 : 0.19;
    INFO(weight_type_name(qc.type) << " group " << qc.group << ": output error vs bf16 " << err << " (bar " << bar << ")");
    std::printf("quantization error of a Gaussian layer's output, %s group %d: %.4f (bar %.3f)\n", weight_type_name(qc.type), qc.group, err, bar);
    CHECK(err <= bar);
  }
}

// Same bits for any thread count, and NaN in one token's activations stays in that token.
inline void run_quantized_identity_and_nan(kernels::Isa isa, std::vector<int> thread_counts) {
  MoeShape s{96, 72, 8, 3};
  auto w = random_expert_weights(s, 5);
  const LayerLora with_lora = random_lora(s, 8, 16.0f, 6, 2), none{};
  // Without LoRA the codes are made from the caller's rows directly (no bf16 copy of x).
  for (const LayerLora* l : {&with_lora, &none})
  for (const QuantCase& qc : kQuantCases) {
    const LayerLora& lora = *l;
    for (int tokens : {1, 5, 100}) {
      auto routing = random_routing(tokens, s, 7);
      auto xb = to_bf16(random_activations(static_cast<std::size_t>(tokens) * s.hidden, 8).data(), static_cast<std::size_t>(tokens) * s.hidden);
      xb[s.hidden / 2] = float_to_bf16(NAN);  // token 0
      std::map<int, std::vector<float>> first;  // by tile order
      for (int threads : thread_counts) {
        numa::ThreadPool& pool = pool_for_threads(threads);
        auto q = quant::quantize_experts(w.view(), qc.type, qc.group, &pool);
        // Codes by rows and in tile order (from 1 and from 16 rows) give the same bits. MXFP4's
        // rows in tile order skip the decode rows kernel, which may round activations
        // (gemm_mxfp4.hpp): there the orders agree within that rounding, each with itself in bits.
        for (int tile_order : {0, 1, 16}) {
          INFO(weight_type_name(qc.type) << " group " << qc.group << ", " << tokens << " tokens, " << threads << " threads, tile order from "
                                         << tile_order << " rows (0: never), " << (lora.empty() ? "no LoRA" : "LoRA"));
          auto y = quantized_forward(isa, q, lora, tokens, routing, xb, pool, tile_order);
          if (first.empty()) {
            bool token0_nan = false;
            for (int j = 0; j < s.hidden; ++j) token0_nan = token0_nan || std::isnan(y[j]);
            CHECK(token0_nan);
            for (std::size_t i = s.hidden; i < y.size(); ++i) REQUIRE(std::isfinite(y[i]));
          }
          if (first.count(tile_order) != 0) {
            REQUIRE(std::memcmp(first[tile_order].data(), y.data(), y.size() * sizeof(float)) == 0);
            continue;
          }
          if (!first.empty()) {
            const std::vector<float>& other = first.begin()->second;
            if (qc.type == WeightType::mxfp4) {
              // Norm-wise: a rounding step apart in gate or up can move h's bf16 rounding a step.
              const std::vector<float> a(y.begin() + s.hidden, y.end()), b(other.begin() + s.hidden, other.end());
              for (int j = 0; j < s.hidden; ++j) REQUIRE(std::isnan(y[j]) == std::isnan(other[j]));
              CHECK(rel_error(a, b) <= 1e-3);
            } else {
              REQUIRE(std::memcmp(other.data(), y.data(), y.size() * sizeof(float)) == 0);
            }
          }
          first[tile_order] = y;
        }
      }
    }
  }
}

}  // namespace tilemoe::test
