// The async API: tasks queue in order on the runtime's threads, submits come from several
// threads, syncs in any order, and a failed task stops the tasks of its layer behind it until
// the failure is reported. CI runs this file under ThreadSanitizer too (scripts/setup.sh).
#include <atomic>
#include <thread>

#include "catch.hpp"
#include "src/layer/moe_compute.hpp"
#include "src/layer/synthetic_layer.hpp"
#include "test_util.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/moe_layer.hpp"

using namespace tilemoe;

namespace {

const MoeShape kShape{72, 40, 6, 2};

MoeLayerConfig config() {
  MoeLayerConfig c;
  c.num_experts = kShape.num_experts;
  c.top_k = kShape.top_k;
  c.hidden = kShape.hidden;
  c.intermediate = kShape.intermediate;
  c.max_tokens = 16;
  c.lora_rank = 4;
  c.lora_alpha = 8;
  c.max_cache_depth = 2;
  return c;
}

struct Batch {
  int tokens;
  RandomRouting routing;
  std::vector<bf16> x, grad_out;
};

Batch make_batch(int tokens, std::uint64_t seed) {
  auto x = random_activations(static_cast<std::size_t>(tokens) * kShape.hidden, seed + 1);
  auto g = random_activations(x.size(), seed + 2);
  return {tokens, random_routing(tokens, kShape, seed), to_bf16(x.data(), x.size()), to_bf16(g.data(), g.size())};
}

struct Lora {
  LayerLora l;
  explicit Lora(std::uint64_t seed) : l(random_lora(kShape, 4, 8.0f, seed)) {}
  LoraWeights weights() const {
    return {l[Projection::gate].a.data(), l[Projection::gate].b.data(), l[Projection::up].a.data(),
            l[Projection::up].b.data(),   l[Projection::down].a.data(), l[Projection::down].b.data()};
  }
};

struct Grads {
  LayerLora g;
  explicit Grads(const Lora& l) : g(l.l.zeros_like()) {}
  LoraGrads grads() {
    return {g[Projection::gate].a.data(), g[Projection::gate].b.data(), g[Projection::up].a.data(),
            g[Projection::up].b.data(),   g[Projection::down].a.data(), g[Projection::down].b.data()};
  }
};

// One training step's results, synchronous or async.
struct Step {
  std::vector<bf16> out, dx;
  Grads grads;
  Step(const Batch& b, const Lora& l)
      : out(static_cast<std::size_t>(b.tokens) * kShape.hidden), dx(out.size()), grads(l) {}
};

}  // namespace

TEST_CASE("tasks run in submission order, submitted from two threads, synced from either", "[async]") {
  Runtime rt;
  std::vector<int> order;  // touched only by tasks, which never overlap
  std::atomic<int> ready{0};
  // Catch's assertions are not thread-safe: each producer keeps its tickets, checked after the join.
  std::vector<Runtime::Ticket> tickets[3];
  auto producer = [&](int who) {
    ++ready;
    while (ready.load() < 2) std::this_thread::yield();
    for (int i = 0; i < 200; ++i) tickets[who].push_back(rt.submit([&order, who, i] { order.push_back(who * 1000 + i); }));
    rt.sync();
  };
  std::thread a(producer, 1), b(producer, 2);
  a.join();
  b.join();
  rt.sync();
  for (int who = 1; who <= 2; ++who) {
    REQUIRE(tickets[who].size() == 200);
    for (std::size_t i = 1; i < tickets[who].size(); ++i) CHECK(tickets[who][i] > tickets[who][i - 1]);
  }
  REQUIRE(order.size() == 400);
  int last[3] = {-1, -1, -1};
  for (int v : order) {
    int who = v / 1000, i = v % 1000;
    CHECK(i == last[who] + 1);  // each thread's tasks in its own order
    last[who] = i;
  }
  CHECK_THROWS_AS(rt.wait(12345), Error);
}

TEST_CASE("two layers driven from two threads give the synchronous results", "[async]") {
  ExpertWeights w1 = random_expert_weights(kShape, 1), w2 = random_expert_weights(kShape, 2);
  Lora l1(3), l2(4);
  Batch b1 = make_batch(11, 5), b2 = make_batch(16, 6), b3 = make_batch(1, 7);

  Runtime rt;
  MoeLayer layer1(rt, config(), {w1.gate.data(), w1.up.data(), w1.down.data()});
  MoeLayer layer2(rt, config(), {w2.gate.data(), w2.up.data(), w2.down.data()});
  layer1.update_lora_weights(l1.weights());
  layer2.update_lora_weights(l2.weights());

  auto train_step = [](MoeLayer& layer, const Batch& b, Step& s, bool async) {
    const auto* ids = b.routing.expert_ids.data();
    const auto* wts = b.routing.weights.data();
    if (async) {
      layer.submit_forward_sft(b.tokens, kShape.top_k, b.x.data(), ids, wts, s.out.data(), true);
      layer.submit_backward(b.grad_out.data(), s.dx.data(), s.grads.grads());
    } else {
      layer.forward_sft(b.tokens, kShape.top_k, b.x.data(), ids, wts, s.out.data(), true);
      layer.backward(b.grad_out.data(), s.dx.data(), s.grads.grads());
    }
  };
  Step want1(b1, l1), want2(b2, l2), want3(b3, l2);
  train_step(layer1, b1, want1, false);
  train_step(layer2, b2, want2, false);
  train_step(layer2, b3, want3, false);

  for (int round = 0; round < 3; ++round) {
    INFO("round " << round);
    Step got1(b1, l1), got2(b2, l2), got3(b3, l2);
    std::thread a([&] {
      train_step(layer1, b1, got1, true);
      if (round != 1) rt.sync();
    });
    std::thread b([&] {
      train_step(layer2, b2, got2, true);
      train_step(layer2, b3, got3, true);
      if (round != 2) rt.sync();
    });
    a.join();
    b.join();
    rt.sync();
    CHECK(got1.out == want1.out);
    CHECK(got1.dx == want1.dx);
    CHECK(got2.dx == want2.dx);
    CHECK(got3.out == want3.out);
    for (int p = 0; p < 3; ++p) {
      CHECK(got1.grads.g.proj[p].a == want1.grads.g.proj[p].a);
      CHECK(got2.grads.g.proj[p].b == want2.grads.g.proj[p].b);
      CHECK(got3.grads.g.proj[p].a == want3.grads.g.proj[p].a);
    }
    CHECK(layer1.cached_forwards() == 0);
    CHECK(layer2.cached_forwards() == 0);
  }
}

TEST_CASE("a failed task stops its layer's later tasks until sync reports it", "[async][errors]") {
  ExpertWeights w = random_expert_weights(kShape, 8);
  Lora l(9);
  Batch b = make_batch(8, 10);
  Runtime rt;
  MoeLayer layer(rt, config(), {w.gate.data(), w.up.data(), w.down.data()});
  MoeLayer other(rt, config(), {w.gate.data(), w.up.data(), w.down.data()});
  layer.update_lora_weights(l.weights());

  std::vector<std::int64_t> bad_ids = b.routing.expert_ids;
  bad_ids[3] = 99;
  Step s(b, l), t(b, l);
  const float* wts = b.routing.weights.data();
  std::fill(s.dx.begin(), s.dx.end(), bf16{0x3f80});
  layer.submit_forward_sft(b.tokens, 2, b.x.data(), bad_ids.data(), wts, s.out.data(), true);
  layer.submit_backward(b.grad_out.data(), s.dx.data(), s.grads.grads());  // must not run
  other.submit_forward(b.tokens, 2, b.x.data(), b.routing.expert_ids.data(), wts, t.out.data());  // another layer runs
  try {
    rt.sync();
    FAIL("sync must report the failed forward_sft");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("expert_ids[1][1] = 99") != std::string::npos);
  }
  for (bf16 v : s.dx) REQUIRE(v == 0x3f80);  // the backward never ran
  CHECK(layer.cached_forwards() == 0);
  CHECK(std::any_of(t.out.begin(), t.out.end(), [](bf16 v) { return v != 0; }));

  // Reported: the layer works again. wait() reports one task's failure, and then sync has none.
  auto ok = layer.submit_forward_sft(b.tokens, 2, b.x.data(), b.routing.expert_ids.data(), wts, s.out.data(), true);
  auto bad = layer.submit_forward(b.tokens, 2, b.x.data(), bad_ids.data(), wts, s.out.data());
  rt.wait(ok);
  CHECK_THROWS_AS(rt.wait(bad), Error);
  CHECK_NOTHROW(rt.sync());

  // A synchronous call queues behind submitted work: this backward pops the forward above.
  CHECK(layer.cached_forwards() == 1);
  layer.backward(b.grad_out.data(), s.dx.data(), s.grads.grads());
  CHECK(layer.cached_forwards() == 0);

  // Submitting checks the arguments it can see at once.
  CHECK_THROWS_AS(layer.submit_forward(17, 2, b.x.data(), b.routing.expert_ids.data(), wts, s.out.data()), Error);
}

TEST_CASE("destroying a layer waits for its queued tasks", "[async]") {
  ExpertWeights w = random_expert_weights(kShape, 11);
  Batch b = make_batch(16, 12);
  Runtime rt;
  std::vector<float> out(static_cast<std::size_t>(b.tokens) * kShape.hidden, 0.0f);
  {
    MoeLayer layer(rt, config(), {w.gate.data(), w.up.data(), w.down.data()});
    for (int i = 0; i < 4; ++i)
      layer.submit_forward(b.tokens, 2, b.x.data(), b.routing.expert_ids.data(), b.routing.weights.data(), out.data());
  }
  CHECK(std::any_of(out.begin(), out.end(), [](float v) { return v != 0.0f; }));
  rt.sync();
}
