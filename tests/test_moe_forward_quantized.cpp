// The forward with int8/int4 base weights on the portable kernels; AVX512-VNNI and AMX-INT8 have
// their own files in tests/isa/ that report SKIPPED where the CPU lacks them.
#include "moe_forward_quantized_grid.hpp"

using namespace tilemoe;

TEST_CASE("portable int8/int4 forward equals the reference on dequantized weights", "[forward][quantized][portable]") {
  test::run_quantized_forward_grid(kernels::Isa::portable);
}
TEST_CASE("portable int8/int4 forward matches the fixtures", "[forward][quantized][portable][fixtures]") {
  test::run_quantized_fixture_forward(kernels::Isa::portable);
}
TEST_CASE("portable int8/int4 forward: same bits for any thread count, NaN stays in its token", "[forward][quantized][portable]") {
  test::run_quantized_identity_and_nan(kernels::Isa::portable, {1, 2, 3});
}
TEST_CASE("quantization error on Gaussian weights is within the bars", "[forward][quantized]") {
  test::run_quantization_error(kernels::Isa::portable);
}
TEST_CASE("forward_sft with integer weights and saving for backward is a clear error", "[forward][quantized]") {
  MoeShape s{40, 24, 4, 2};
  auto w = random_expert_weights(s, 1);
  numa::ThreadPool& pool = pool_for_threads(0);
  auto packed = PackedExpertWeights::pack_quantized(quant::quantize_experts(w.view(), WeightType::int8, 0, &pool), pool);
  MoeSftLayer layer(packed, kernels::Isa::portable, pool, SftLayerOptions{8, 1, 0, 0});
  std::vector<bf16> x(2 * 40, float_to_bf16(0.5f));
  std::vector<std::int64_t> ids = {0, 1, 2, 3};
  std::vector<float> wts(4, 0.5f), y(2 * 40);
  CHECK_THROWS_WITH(layer.forward_sft(2, 2, x.data(), ids.data(), wts.data(), y.data(), true),
                    Catch::Matchers::Contains("int8 base weights is not built yet"));
  CHECK(layer.cached_forwards() == 0);
  layer.forward_sft(2, 2, x.data(), ids.data(), wts.data(), y.data(), false);  // inference still runs
  CHECK(std::isfinite(y[0]));
}
