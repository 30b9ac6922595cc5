// MXFP4 as a weight type: the quantizer's rounding and scales, weights that came from MXFP4 coming
// back exactly, the error on Gaussian weights, and scales the kernels cannot multiply exactly
// refused before packing.
#include <cmath>
#include <random>
#include <vector>

#include "amx/pack_mxfp4.hpp"
#include "catch.hpp"
#include "numa/thread_pool.hpp"
#include "src/layer/packed_experts.hpp"
#include "src/layer/moe_compute.hpp"
#include "src/layer/synthetic_layer.hpp"
#include "src/reference/moe_reference.hpp"
#include "src/quant/quantize.hpp"
#include "test_util.hpp"
#include "tilemoe/error.hpp"

using namespace tilemoe;
using namespace tilemoe::quant;

namespace {

// One row of weights through quantize_mxfp4_matrix and back.
std::vector<float> round_trip(const std::vector<float>& row, std::vector<float>* scales_out = nullptr) {
  const int k = static_cast<int>(row.size());
  std::vector<bf16> w(row.size());
  for (std::size_t i = 0; i < row.size(); ++i) w[i] = float_to_bf16(row[i]);
  std::vector<std::int8_t> codes(static_cast<std::size_t>(k + 1) / 2);
  std::vector<float> scales(static_cast<std::size_t>(k + 31) / 32);
  quantize_mxfp4_matrix(w.data(), 1, k, row.size(), codes.data(), scales.data());
  std::vector<float> out(row.size());
  for (int kk = 0; kk < k; ++kk) out[kk] = quantized_code_value(WeightType::mxfp4, codes.data(), kk) * scales[kk / 32];
  if (scales_out) *scales_out = scales;
  return out;
}

}  // namespace

TEST_CASE("mxfp4 rounds to the nearest E2M1 value, ties to the even code, with a power-of-two scale", "[quant][mxfp4]") {
  // max 6: the scale is 1, the values are E2M1's grid; halfway points go to the even code.
  std::vector<float> row{6.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, -0.3f, -4.9f, 0.0f, -0.0f, 5.1f, 0.2f};
  std::vector<float> scales;
  const std::vector<float> got = round_trip(row, &scales);
  CHECK(scales == std::vector<float>{1.0f});
  CHECK(got == std::vector<float>{6.0f, 0.0f, 1.0f, 1.0f, 2.0f, 2.0f, 4.0f, 4.0f, -0.5f, -4.0f, 0.0f, 0.0f, 6.0f, 0.0f});
  // max 7.5: OCP's scale (2^(2 - 2) = 1) saturates it at 6; twice that (2) gives 8, nearer.
  CHECK(round_trip({7.5f, 1.0f}) == std::vector<float>{8.0f, 1.0f});
  // Tiny and zero groups: the least exact scale, or 1, and zeros.
  round_trip({1e-38f, 0.0f}, &scales);
  CHECK(scales == std::vector<float>{std::ldexp(1.0f, -125)});
  round_trip(std::vector<float>(40, 0.0f), &scales);
  CHECK(scales == std::vector<float>{1.0f, 1.0f});
}

TEST_CASE("mxfp4 scales the kernels multiply exactly: powers of two in [2^-125, 2^125]", "[quant][mxfp4]") {
  CHECK(valid_mxfp4_scale(1.0f));
  CHECK(valid_mxfp4_scale(std::ldexp(1.0f, -125)));
  CHECK(valid_mxfp4_scale(std::ldexp(1.0f, 125)));
  CHECK(mxfp4_scale_exponent(1.0f) == 127);
  CHECK(mxfp4_scale_exponent(std::ldexp(1.0f, -125)) == kernels::kMxfp4MinExponent);
  CHECK(mxfp4_scale_exponent(std::ldexp(1.0f, 125)) == kernels::kMxfp4MaxExponent);
  for (float bad : {0.0f, -1.0f, 0.75f, 3.0f, std::ldexp(1.0f, -126), std::ldexp(1.0f, 126), INFINITY, NAN}) {
    INFO(bad);
    CHECK_FALSE(valid_mxfp4_scale(bad));
  }
  // Against frexp's reading of the definition, over every power of two, its neighbours and their
  // negatives, subnormals included.
  for (int e = -149; e <= 127; ++e) {
    const float p = std::ldexp(1.0f, e);
    for (float v : {p, std::nextafter(p, 0.0f), std::nextafter(p, INFINITY), -p}) {
      int exponent = 0;
      const float mantissa = std::frexp(v, &exponent);
      const bool want = v > 0 && mantissa == 0.5f && exponent - 1 >= -125 && exponent - 1 <= 125;
      INFO(v);
      REQUIRE(valid_mxfp4_scale(v) == want);
      if (want) REQUIRE(mxfp4_scale_exponent(v) == exponent - 1 + 127);
    }
  }
}

TEST_CASE("weights that came from MXFP4 quantize back to the same values, at any row length", "[quant][mxfp4]") {
  std::mt19937 rng(3);
  for (int k : {1, 31, 32, 33, 100, 2880}) {
    const int n = 7;
    std::vector<bf16> w(static_cast<std::size_t>(n) * k);
    for (int r = 0; r < n; ++r)
      for (int g = 0; g * 32 < k; ++g) {
        // Groups of every magnitude profile: all codes, or only small ones (the group's max below 4).
        const int e = std::uniform_int_distribution<int>(kernels::kMxfp4MinExponent, kernels::kMxfp4MaxExponent)(rng);
        const int top = std::uniform_int_distribution<int>(1, 7)(rng);
        for (int kk = g * 32; kk < std::min(k, g * 32 + 32); ++kk) {
          const int code = std::uniform_int_distribution<int>(0, top)(rng) | (rng() % 2 ? 8 : 0);
          w[static_cast<std::size_t>(r) * k + kk] = kernels::mxfp4_value_bf16(code, e);
        }
      }
    std::vector<std::int8_t> codes(static_cast<std::size_t>(n) * ((k + 1) / 2));
    std::vector<float> scales(static_cast<std::size_t>(n) * ((k + 31) / 32));
    quantize_mxfp4_matrix(w.data(), n, k, static_cast<std::size_t>(k), codes.data(), scales.data());
    for (float s : scales) REQUIRE(valid_mxfp4_scale(s));
    for (int r = 0; r < n; ++r)
      for (int kk = 0; kk < k; ++kk) {
        const float got = quantized_code_value(WeightType::mxfp4, codes.data() + static_cast<std::size_t>(r) * ((k + 1) / 2), kk) *
                          scales[static_cast<std::size_t>(r) * ((k + 31) / 32) + kk / 32];
        INFO("k " << k << " row " << r << " input " << kk);
        REQUIRE(float_to_bf16(got) == w[static_cast<std::size_t>(r) * k + kk]);  // bits: -0 stays -0
      }
  }
}

TEST_CASE("mxfp4 quantization error of Gaussian weights against bf16", "[quant][mxfp4][error]") {
  const MoeShape s{512, 384, 2, 1};
  ExpertWeights w = random_expert_weights(s, 4);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (auto* v : {&w.gate, &w.up, &w.down})
    for (bf16& x : *v) x = float_to_bf16(normal(rng));
  const QuantizedExperts q = quantize_experts(w.view(), WeightType::mxfp4, 0, nullptr);
  CHECK(q.group == 32);
  const ExpertWeights back = dequantize_experts(q);
  std::vector<float> a, b;
  for (auto [src, dst] : {std::pair{&w.gate, &back.gate}, {&w.up, &back.up}, {&w.down, &back.down}})
    for (std::size_t i = 0; i < src->size(); ++i) {
      a.push_back(bf16_to_float((*src)[i]));
      b.push_back(bf16_to_float((*dst)[i]));
    }
  const double e = test::rel_error(b, a);
  std::printf("quantization error, Gaussian weights vs bf16: mxfp4: %.4f\n", e);
  CHECK(e <= 0.12);  // E2M1's grid at group 32; int4 at group 32 is ~0.087
  CHECK(e > 0.01);
}

TEST_CASE("an mxfp4 layer with a scale the kernels cannot multiply exactly is refused naming the expert", "[quant][mxfp4][errors]") {
  const MoeShape s{64, 40, 3, 1};
  const ExpertWeights w = random_expert_weights(s, 7);
  QuantizedExperts q = quantize_experts(w.view(), WeightType::mxfp4, 0, nullptr);
  numa::ThreadPool pool(1, {});
  CHECK_NOTHROW(PackedExpertWeights::pack_quantized(q, pool));
  q[Projection::down].scales_of(2)[5] = 0.75f;  // expert 2, down row 2 (2 groups a row)
  std::string message;
  try {
    PackedExpertWeights::pack_quantized(q, pool);
  } catch (const Error& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(message.find("expert 2 down row 2") != std::string::npos);
  CHECK(message.find("not a power of two") != std::string::npos);
}

TEST_CASE("the reference backend runs an mxfp4 layer on its values with bf16 activations, as the kernels do", "[quant][mxfp4][reference]") {
  const MoeShape s{96, 72, 6, 2};
  const ExpertWeights w = random_expert_weights(s, 21);
  const LayerLora lora = random_lora(s, 4, 8.0f, 22);
  const int tokens = 11;
  const RandomRouting routing = random_routing(tokens, s, 23);
  std::vector<float> x = random_activations(static_cast<std::size_t>(tokens) * s.hidden, 24);
  for (float& v : x) v = bf16_to_float(float_to_bf16(v));
  const MoeBatch<float> batch{tokens, s.top_k, x.data(), routing.expert_ids.data(), routing.weights.data()};
  ComputeOptions opt;
  opt.isa = "reference";
  opt.weight_type = WeightType::mxfp4;
  std::vector<float> got(x.size()), want(x.size()), kernels(x.size());
  moe_forward(w.view(), lora, batch, opt, got.data());
  // The plain reference on the dequantized weights: the same numbers (no int8 rounding of x or h).
  const ExpertWeights values = dequantize_experts(quantize_experts(w.view(), WeightType::mxfp4, 0, nullptr));
  reference_forward(values.view(), lora, batch, want.data());
  CHECK(got == want);
  opt.isa = "auto";
  moe_forward(w.view(), lora, batch, opt, kernels.data());
  CHECK(test::rel_error(kernels, want) <= 1e-2);
}
