// The fast forward on the portable kernels (every x86-64 runs them); AVX512 and AMX have their
// own files in tests/isa/ that report SKIPPED where the CPU lacks them.
#include "moe_forward_grid.hpp"

using namespace tilemoe;

TEST_CASE("portable forward equals the reference on the shape grid", "[forward][portable]") {
  test::run_forward_grid(kernels::Isa::portable);
}
TEST_CASE("portable forward matches the fixtures", "[forward][portable][fixtures]") { test::run_fixture_forward(kernels::Isa::portable); }
TEST_CASE("portable forward packs a held LoRA set once", "[forward][portable][lora]") { test::run_held_lora(kernels::Isa::portable); }
TEST_CASE("portable forward is bit-identical for 1, 2 and 3 threads", "[forward][portable]") {
  test::run_thread_count_identity(kernels::Isa::portable, {1, 2, 3});
}
TEST_CASE("forward rejects ids >= the expert count", "[forward]") {
  MoeShape s{32, 16, 3, 2};
  auto w = random_expert_weights(s, 1);
  numa::ThreadPool& pool = pool_for_threads(0);
  auto packed = PackedExpertWeights::pack(w.view(), pool);
  MoeForward fwd(packed, kernels::Isa::portable, pool);
  std::vector<bf16> x(64, float_to_bf16(0.5f));
  std::vector<std::int64_t> ids = {0, 3, 1, 2};
  std::vector<float> wts(4, 0.5f), y(64, 7.0f);
  CHECK_THROWS_WITH(fwd.forward(LayerLora{}, 2, 2, x.data(), ids.data(), wts.data(), y.data()),
                    Catch::Matchers::Contains("expert_ids[0][1] = 3 is out of range"));
  CHECK(y[0] == 7.0f);  // output untouched
}
