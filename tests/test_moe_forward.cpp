// The fast forward on the portable kernels (every x86-64 runs them); AVX512 and AMX have their
// own files in tests/isa/ that report SKIPPED where the CPU lacks them.
#include <atomic>
#include <thread>

#include "moe_forward_grid.hpp"

using namespace tilemoe;

TEST_CASE("portable forward equals the reference on the shape grid", "[forward][portable]") {
  test::run_forward_grid(kernels::Isa::portable);
}
TEST_CASE("portable forward matches the fixtures", "[forward][portable][fixtures]") { test::run_fixture_forward(kernels::Isa::portable); }
TEST_CASE("portable forward packs a held LoRA set once", "[forward][portable][lora]") { test::run_held_lora(kernels::Isa::portable); }
TEST_CASE("portable forward with ranks of their own for gate, up and down", "[forward][portable][lora]") {
  test::run_forward_projection_ranks(kernels::Isa::portable);
}
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
TEST_CASE("layers on one pool share their buffers and take turns from several threads", "[forward]") {
  // Two layers of different shapes on one pool: their buffers are the pool's (forward_workspace.hpp).
  numa::ThreadPool& pool = pool_for_threads(2);
  const MoeShape shapes[2] = {MoeShape{40, 24, 5, 2}, MoeShape{72, 56, 6, 3}};
  std::vector<ExpertWeights> weights;
  std::vector<PackedExpertWeights> packed;
  for (int l = 0; l < 2; ++l) {
    weights.push_back(random_expert_weights(shapes[l], 80 + l));
    packed.push_back(PackedExpertWeights::pack(weights.back().view(), pool));
  }
  MoeForward first(packed[0], kernels::Isa::portable, pool), second(packed[1], kernels::Isa::portable, pool);
  MoeForward* layers[2] = {&first, &second};
  struct Call {
    std::vector<bf16> x;
    RandomRouting routing;
    std::vector<float> want;
  };
  // Batches of several sizes per layer, each with its result from a call made alone.
  std::vector<Call> calls[2];
  for (int l = 0; l < 2; ++l) {
    const MoeShape& s = shapes[l];
    for (int tokens : {1, 37, 5, 90}) {
      Call c;
      auto x = random_activations(static_cast<std::size_t>(tokens) * s.hidden, 90 + tokens + l);
      c.x = to_bf16(x.data(), x.size());
      c.routing = random_routing(tokens, s, 95 + tokens + l);
      c.want.resize(x.size());
      layers[l]->forward(LayerLora{}, tokens, s.top_k, c.x.data(), c.routing.expert_ids.data(), c.routing.weights.data(), c.want.data());
      calls[l].push_back(std::move(c));
    }
  }
  std::atomic<int> mismatches{0};
  auto hammer = [&](int l) {
    const MoeShape& s = shapes[l];
    for (int round = 0; round < 20; ++round)
      for (const Call& c : calls[l]) {
        const int tokens = static_cast<int>(c.want.size() / s.hidden);
        std::vector<float> y(c.want.size());
        layers[l]->forward(LayerLora{}, tokens, s.top_k, c.x.data(), c.routing.expert_ids.data(), c.routing.weights.data(), y.data());
        if (std::memcmp(y.data(), c.want.data(), y.size() * sizeof(float)) != 0) ++mismatches;
      }
  };
  std::thread other(hammer, 1);
  hammer(0);
  other.join();
  CHECK(mismatches.load() == 0);
}
