// The NUMA split: slicing, the node group's dispatch, and the tensor-parallel layer on the
// portable kernels (tests/isa/ runs the same grid on AVX-512 and AMX).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <thread>

#include "tensor_parallel_grid.hpp"
#include "src/layer/cross_node_sums.hpp"
#include "src/layer/expert_partial_sums.hpp"
#include "src/layer/shared_gather.hpp"
#include "src/quant/numa_slices.hpp"
#include "src/quant/quantize.hpp"
#include "tilemoe/error.hpp"

using namespace tilemoe;

TEST_CASE("node_slices cover the intermediate size in aligned, balanced slices", "[tp]") {
  for (int inter : {1, 15, 24, 31, 47, 100, 176, 200, 1408, 2048, 18432})
    for (int align : {32, 64, 128})
      for (int nodes = 1; nodes <= 9; ++nodes) {
        INFO("intermediate " << inter << " align " << align << " nodes " << nodes);
        auto s = node_slices(inter, nodes, align);
        const int blocks = (inter + align - 1) / align;
        REQUIRE(static_cast<int>(s.size()) == std::min(nodes, blocks));
        int at = 0, min_w = inter, max_w = 0;
        for (auto sl : s) {
          CHECK(sl.begin == at);
          CHECK(sl.begin % align == 0);
          CHECK(sl.width() > 0);
          at = sl.end;
          min_w = std::min(min_w, sl.width());
          max_w = std::max(max_w, sl.width());
        }
        CHECK(at == inter);
        CHECK(max_w - min_w <= align);  // one block apart at most (the last may be short)
      }
  CHECK(node_slices(1408, 2, 32) == std::vector<quant::IntermediateSlice>{{0, 704}, {704, 1408}});
  CHECK_THROWS_AS(node_slices(100, 0, 32), Error);
  CHECK_THROWS_AS(node_slices(100, 2, 0), Error);
}

namespace {
const float* f32s(const void* p) { return static_cast<const float*>(p); }
const bf16* bf16s(const void* p) { return static_cast<const bf16*>(p); }
}  // namespace

TEST_CASE("slice_lora_view gives windows of the caller's arrays", "[tp]") {
  MoeShape s{40, 200, 3, 2};
  LayerLora lora = random_lora(s, 4, 8.0f, 3, 1);
  const LayerLoraView full = lora_view(lora);
  const quant::IntermediateSlice sl{64, 128};
  const LayerLoraView v = slice_lora_view(full, sl);
  for (int e = 0; e < 3; ++e) {
    for (Projection p : {Projection::gate, Projection::up}) {
      CHECK(v[p].out == 64);
      CHECK(v[p].in == 40);
      CHECK(v[p].a_of(e) == full[p].a_of(e));
      CHECK(f32s(v[p].b_of(e)) == f32s(full[p].b_of(e)) + 64 * 4);  // rows [64, 128) of B
      CHECK(f32s(v[p].b_of(e))[3 * 4 + 1] == lora[p].b_of(e)[(64 + 3) * 4 + 1]);
    }
    const auto& d = v[Projection::down];
    CHECK(d.in == 64);
    CHECK(d.out == 40);
    CHECK(d.lda() == 200);
    CHECK(f32s(d.a_of(e))[2 * d.lda() + 5] == lora[Projection::down].a_of(e)[2 * 200 + 64 + 5]);  // A column 64 + 5
    CHECK(d.b_of(e) == full[Projection::down].b_of(e));
  }
  // A window of a window keeps the outer strides.
  const LayerLoraView vv = slice_lora_view(v, {32, 64});
  CHECK(f32s(vv[Projection::down].a_of(1))[3 * 200 + 7] == lora[Projection::down].a_of(1)[3 * 200 + 64 + 32 + 7]);
  CHECK(f32s(vv[Projection::gate].b_of(2))[5 * 4] == lora[Projection::gate].b_of(2)[(96 + 5) * 4]);
}

TEST_CASE("slice_lora_view counts bf16 sets' offsets in elements, not bytes of f32", "[tp]") {
  MoeShape s{40, 200, 3, 2};
  LayerLora lora = random_lora(s, 4, 8.0f, 3, 1);
  const LayerLoraBf16 held = round_lora_to_bf16(lora);
  const LayerLoraView full = lora_view(held);
  const LayerLoraView v = slice_lora_view(full, {64, 128});
  for (int e = 0; e < 3; ++e) {
    for (Projection p : {Projection::gate, Projection::up}) {
      CHECK(v[p].dtype == LoraDType::bf16);
      CHECK(bf16_to_float(bf16s(v[p].b_of(e))[3 * 4 + 1]) == bf16_to_float(float_to_bf16(lora[p].b_of(e)[(64 + 3) * 4 + 1])));
    }
    const auto& d = v[Projection::down];
    CHECK(bf16_to_float(bf16s(d.a_of(e))[2 * 200 + 5]) == bf16_to_float(float_to_bf16(lora[Projection::down].a_of(e)[2 * 200 + 64 + 5])));
  }
  const LayerLoraView vv = slice_lora_view(v, {32, 64});
  CHECK(bf16s(vv[Projection::down].a_of(1))[3 * 200 + 7] == float_to_bf16(lora[Projection::down].a_of(1)[3 * 200 + 64 + 32 + 7]));
}

TEST_CASE("NodeGroup runs every node once, concurrently, and reports the lowest node's failure", "[tp]") {
  for (int nodes : {1, 2, 3, 4, 7}) {
    numa::NodeGroup& g = test::test_node_group(nodes);
    REQUIRE(g.size() == nodes);
    std::vector<std::atomic<int>> runs(static_cast<std::size_t>(nodes)), items(runs.size());
    g.run_on_nodes([&](int n) {
      runs[static_cast<std::size_t>(n)]++;
      g.pool(n).parallel_for(50, [&](std::size_t, int) { items[static_cast<std::size_t>(n)]++; });
    });
    // Checked here, not in the nodes' threads: Catch's assertions are not thread-safe.
    for (auto& r : runs) CHECK(r == 1);
    for (auto& i : items) CHECK(i == 50);
    try {
      g.run_on_nodes([&](int n) {
        if (n >= nodes / 2) throw std::runtime_error("node " + std::to_string(n));
      });
      FAIL("no exception");
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()) == "node " + std::to_string(nodes / 2));
    }
    g.run_on_nodes([&](int n) { runs[static_cast<std::size_t>(n)]++; });  // still usable
    for (auto& r : runs) CHECK(r == 2);
  }
  CHECK_THROWS_AS(numa::NodeGroup(numa::system_topology(), 0, 0), Error);
}

TEST_CASE("NodeGroup: virtual nodes of one memory node lend each other idle workers, only during run_on_nodes", "[tp]") {
  // One memory node here (virtual nodes of it) or the machine's real nodes: pools are linked
  // where their memory node is the same, and a linked pool's worker numbers count the others' workers
  // (helpers and dispatcher).
  numa::NodeGroup g(numa::system_topology(), 2, 6);
  REQUIRE(g.size() == 2);
  const bool one_memory_node = g.os_node(0) == g.os_node(1);
  const int guests0 = one_memory_node ? g.pool(1).size() : 0, guests1 = one_memory_node ? g.pool(0).size() : 0;
  CHECK(g.pool(0).worker_slots() == g.pool(0).size() + guests0);
  CHECK(g.pool(1).worker_slots() == g.pool(1).size() + guests1);
  // Node 1 returns at once and lends: its dispatcher (and its helpers, if still awake) join node
  // 0's welcoming job of slow items where the pools are linked. Every item once, worker numbers
  // in range.
  std::vector<std::atomic<int>> hits(400);
  std::atomic<bool> in_range{true}, guest_ran{false};
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  g.run_on_nodes([&](int n) {
    if (n != 0) return g.pool(n).parallel_for(8, [](std::size_t, int) {});  // its helpers awake
    g.pool(0).parallel_for(
        hits.size(),
        [&](std::size_t item, int worker) {
          if (worker < 0 || worker >= g.pool(0).worker_slots()) in_range = false;
          if (worker >= g.pool(0).size()) guest_ran = true;
          hits[item]++;
          std::this_thread::sleep_for(std::chrono::microseconds(200));
          // Where guests can come, node 0's own workers hold their item until one has (or 20 s
          // have passed): on a loaded machine node 1's threads may otherwise not run before node 0
          // has taken every item.
          if (one_memory_node && worker < g.pool(0).size())
            while (!guest_ran.load() && std::chrono::steady_clock::now() < give_up)
              std::this_thread::sleep_for(std::chrono::microseconds(100));
        },
        1, numa::ThreadPool::Guests::welcome);
  });
  for (auto& h : hits) CHECK(h == 1);
  CHECK(in_range);
  CHECK(guest_ran == one_memory_node);
  // After run_on_nodes nobody lends: a welcoming job run outside it gets no guests.
  std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::atomic<int> outside_max{-1};
  g.pool(0).parallel_for(
      200,
      [&](std::size_t, int worker) {
        int seen = outside_max.load();
        while (worker > seen && !outside_max.compare_exchange_weak(seen, worker)) {
        }
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      },
      1, numa::ThreadPool::Guests::welcome);
  CHECK(outside_max < g.pool(0).size());
}

TEST_CASE("portable tensor-parallel layer equals the reference for 2 and 4 nodes", "[tp][portable]") {
  test::run_tp_grid(kernels::Isa::portable, {2, 4});
}

TEST_CASE("portable tensor-parallel layer matches the fixtures", "[tp][portable][fixtures]") { test::run_tp_fixtures(kernels::Isa::portable); }

TEST_CASE("portable tensor-parallel layer is bit-identical for any thread count", "[tp][portable]") {
  test::run_tp_thread_identity(kernels::Isa::portable, {1, 3, 5});
}

TEST_CASE("tensor-parallel layer: failures leave every node's stack as it was", "[tp]") {
  MoeShape s{48, 200, 6, 2};
  auto w = random_expert_weights(s, 3);
  LayerLora lora = random_lora(s, 4, 8.0f, 4, 1);
  auto layer = test::make_tp_layer(kernels::Isa::portable, test::test_node_group(3), w, lora_view(lora), 8, 2);
  REQUIRE(layer->node_count() == 3);
  const int tokens = 4;
  auto routing = random_routing(tokens, s, 5);
  auto x = to_bf16(random_activations(static_cast<std::size_t>(tokens) * s.hidden, 6).data(), static_cast<std::size_t>(tokens) * s.hidden);
  std::vector<float> out(static_cast<std::size_t>(tokens) * s.hidden), gi(out.size()), go(out.size(), 1.0f);
  auto stacks = [&] {
    std::vector<int> d;
    for (int n = 0; n < layer->node_count(); ++n) d.push_back(layer->node_layer(n).cached_forwards());
    return d;
  };
  // Backward on an empty stack.
  CHECK_THROWS_AS(layer->backward(go.data(), gi.data(), {}), Error);
  CHECK(stacks() == std::vector<int>{0, 0, 0});
  // An id out of range: named, nothing saved anywhere.
  auto bad = routing.expert_ids;
  bad[5] = 6;
  try {
    layer->forward_sft(tokens, s.top_k, x.data(), bad.data(), routing.weights.data(), out.data(), true);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::invalid_argument);
    CHECK(std::string(e.what()).find("6") != std::string::npos);
  }
  CHECK(stacks() == std::vector<int>{0, 0, 0});
  // A full stack.
  layer->forward_sft(tokens, s.top_k, x.data(), routing.expert_ids.data(), routing.weights.data(), out.data(), true);
  layer->forward_sft(tokens, s.top_k, x.data(), routing.expert_ids.data(), routing.weights.data(), out.data(), true);
  CHECK_THROWS_AS(layer->forward_sft(tokens, s.top_k, x.data(), routing.expert_ids.data(), routing.weights.data(), out.data(), true), Error);
  CHECK(stacks() == std::vector<int>{2, 2, 2});
  // A LoRA set that does not fit keeps the old one on every node.
  LayerLora wrong = random_lora({48, 100, 6, 2}, 4, 8.0f, 4, 1);
  CHECK_THROWS_AS(layer->update_lora_weights(lora_view(wrong)), Error);
  CHECK(layer->lora()[Projection::gate].b == lora[Projection::gate].b.data());
  CHECK(layer->node_layer(2).lora()[Projection::gate].b == lora[Projection::gate].b.data() + layer->slice(2).begin * 4);
  layer->backward(go.data(), gi.data(), {});
  layer->backward(go.data(), gi.data(), {});
  CHECK(stacks() == std::vector<int>{0, 0, 0});
}

namespace {

// A thread blocked in `wait` stops with `Stopped` once `object` fails with `message`, and the object
// keeps that error for the layer to rethrow.
template <typename Stopped, typename Object, typename Wait>
void check_failure_stops_waiter(Object& object, Wait wait, const char* message) {
  std::atomic<bool> stopped{false};
  std::thread blocked([&] {
    try {
      wait();
    } catch (const Stopped&) {
      stopped = true;
    }
  });
  object.fail(std::make_exception_ptr(std::runtime_error(message)));
  blocked.join();
  CHECK(stopped.load());
  REQUIRE(object.error());
  CHECK_THROWS_WITH(std::rethrow_exception(object.error()), message);
}

}  // namespace

TEST_CASE("SharedGather: each unit claimed once, waits end when its expert's units are written, a failure stops them", "[tp]") {
  MoeShape s{16, 32, 4, 2};
  std::vector<std::int64_t> ids;
  for (int t = 0; t < 40; ++t) ids.insert(ids.end(), {t % 3, 3});  // experts 0-2: 14, 13, 13 rows; 3: 40 rows
  const TokenGroups groups = group_tokens_by_expert(ids.data(), 40, 2, s.num_experts);
  SharedGather g;
  g.prepare(groups, 96, 0);
  CHECK(g.x.size() >= static_cast<std::size_t>(16 + 16 + 16 + 48) * 96);
  CHECK(g.codes.empty());
  // Four threads race for every unit: each is won once.
  std::atomic<int> won{0};
  {
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i)
      threads.emplace_back([&] {
        for (int e = 0; e < 4; ++e)
          for (int row = 0; row < groups.count(e); row += SharedGather::kUnitRows)
            if (g.claim(e, row)) {
              won.fetch_add(1);
              g.done(e);
            }
      });
    for (auto& t : threads) t.join();
  }
  CHECK(won.load() == 1 + 1 + 1 + 3);
  for (int e = 0; e < 4; ++e) g.wait(e);  // all written: returns at once
  // Each unit has one owner, and 3 nodes own 2 of these 6 units each.
  g.prepare(groups, 96, 0, 3);
  std::vector<int> owned(3, 0);
  for (int e = 0; e < 4; ++e)
    for (int row = 0; row < groups.count(e); row += SharedGather::kUnitRows) {
      int owners = 0;
      for (int n = 0; n < 3; ++n)
        if (g.owns(n, e, row)) ++owners, ++owned[static_cast<std::size_t>(n)];
      CHECK(owners == 1);
    }
  CHECK(owned == std::vector<int>{2, 2, 2});

  g.agree_on_layout(7);
  g.agree_on_layout(7);
  CHECK_THROWS_AS(g.agree_on_layout(9), std::logic_error);

  // A unit whose copy failed: a waiter on its expert stops, and the error is kept.
  g.prepare(groups, 96, 0);
  CHECK_FALSE(g.error());
  REQUIRE(g.claim(3, 0));
  g.done(3);
  REQUIRE(g.claim(3, 16));
  check_failure_stops_waiter<SharedGather::Stopped>(g, [&] { g.wait(3); }, "copy failed");
  g.agree_on_layout(9);  // a new call: no layout yet
}

TEST_CASE("CrossNodeSums: sums wait for every node, add in node order, hand out each block once, and stop on a failure", "[tp]") {
  const int rows = 5, rank = 3;
  // Node n's partial of projection p at (i, j): values whose f32 sum depends on the order.
  std::vector<std::vector<float>> parts;
  for (int n = 0; n < 3; ++n)
    for (int p = 0; p < 3; ++p) {
      std::vector<float> v(static_cast<std::size_t>(rows) * rank);
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = n == 1 ? 1e8f : (n == 0 ? 1.0f : -1e8f) + static_cast<float>(i + p);
      parts.push_back(v);
    }
  auto part = [&](int n, int p) { return parts[static_cast<std::size_t>(3 * n + p)].data(); };
  CrossNodeSums sums;
  sums.prepare(3);
  CHECK(sums.nodes() == 3);
  std::vector<float> got(static_cast<std::size_t>(2) * rank, -1.0f);
  std::atomic<bool> summed{false};
  std::thread waiter([&] {
    sums.sum_rows(1, 2, 2, rank, got.data());  // rows 2-3 of up's dP
    summed = true;
  });
  sums.publish(2, {part(2, 0), part(2, 1), part(2, 2)});
  sums.publish(0, {part(0, 0), part(0, 1), part(0, 2)});
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(summed.load());  // node 1 has not published
  sums.publish(1, {part(1, 0), part(1, 1), part(1, 2)});
  waiter.join();
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < rank; ++j) {
      const std::size_t k = static_cast<std::size_t>(2 + i) * rank + j;
      float want = part(0, 1)[k];
      want += part(1, 1)[k];
      want += part(2, 1)[k];
      CHECK(got[static_cast<std::size_t>(i) * rank + j] == want);
    }
  // Four threads claim 100 blocks: each once.
  std::vector<std::atomic<int>> claims(100);
  {
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&] {
        for (std::size_t b; (b = sums.claim_block()) < claims.size();) claims[b].fetch_add(1);
      });
    for (auto& t : threads) t.join();
  }
  for (auto& c : claims) CHECK(c.load() == 1);

  // A node that fails before publishing stops the waiters; its error is kept; a new call starts clean.
  sums.prepare(2);
  CHECK_FALSE(sums.error());
  CHECK(sums.claim_block() == 0);
  sums.publish(0, {part(0, 0), part(0, 1), part(0, 2)});
  check_failure_stops_waiter<CrossNodeSums::Stopped>(sums, [&] { sums.sum_rows(0, 0, rows, rank, got.data()); }, "node 1 failed");
  sums.prepare(1);
  CHECK_FALSE(sums.error());
  sums.publish(0, {part(0, 0), part(0, 1), part(0, 2)});
  std::vector<float> one(static_cast<std::size_t>(rows) * rank);
  sums.sum_rows(2, 0, rows, rank, one.data());
  CHECK(std::equal(one.begin(), one.end(), part(0, 2)));
}

TEST_CASE("ExpertPartialSums: a sum waits for every node's rows of its expert, adds in node order, and stops on a failure", "[tp]") {
  const int rows = 6, cols = 3;
  const std::size_t ld = 4;  // a column past cols, never read
  // Node n's rows: values whose f32 sum depends on the order.
  std::vector<std::vector<float>> parts(3, std::vector<float>(static_cast<std::size_t>(rows) * ld));
  for (int n = 0; n < 3; ++n)
    for (std::size_t i = 0; i < parts[n].size(); ++i)
      parts[n][i] = i % ld == cols ? std::nanf("") : n == 1 ? 1e8f : (n == 0 ? 1.0f : -1e8f) + static_cast<float>(i);
  ExpertPartialSums sums;
  sums.prepare(3, 2);
  CHECK(sums.nodes() == 3);
  CHECK(sums.owner(0) == 0);
  CHECK(sums.owner(4) == 1);
  for (int n = 0; n < 3; ++n) sums.set_rows(n, parts[n].data(), ld);
  std::vector<float> got(static_cast<std::size_t>(2) * cols, -1.0f);
  std::atomic<bool> summed{false};
  std::thread waiter([&] {
    sums.sum(1, 3, 2, cols, got.data(), cols);  // expert 1: rows 3-4
    summed = true;
  });
  sums.publish(1);
  sums.publish(0);  // expert 0 does not count for expert 1
  sums.publish(1);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(summed.load());
  sums.publish(1);
  waiter.join();
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < cols; ++j) {
      const std::size_t k = static_cast<std::size_t>(3 + i) * ld + j;
      float want = parts[0][k];
      want += parts[1][k];
      want += parts[2][k];
      CHECK(got[static_cast<std::size_t>(i) * cols + j] == want);
    }

  // A node that fails before publishing stops the waiters; its error is kept; a new call starts clean.
  sums.prepare(2, 1);
  CHECK_FALSE(sums.error());
  sums.set_rows(0, parts[0].data(), ld);
  sums.publish(0);
  check_failure_stops_waiter<ExpertPartialSums::Stopped>(sums, [&] { sums.sum(0, 0, rows, cols, got.data(), cols); }, "node 1 failed");
  sums.prepare(1, 1);
  CHECK_FALSE(sums.error());
  sums.set_rows(0, parts[2].data(), ld);
  sums.publish(0);
  std::vector<float> one(static_cast<std::size_t>(rows) * cols);
  sums.sum(0, 0, rows, cols, one.data(), cols);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) CHECK(one[static_cast<std::size_t>(i) * cols + j] == parts[2][static_cast<std::size_t>(i) * ld + j]);
}

TEST_CASE("portable tensor-parallel layer: a shared gather gives the bits of per-node gathers", "[tp][portable]") {
  test::run_tp_shared_gather_identity(kernels::Isa::portable);
}

TEST_CASE("tensor-parallel layer: nodes that lay out x differently fail cleanly, and agree again", "[tp]") {
  MoeShape s{48, 100, 4, 2};
  auto w = random_expert_weights(s, 51);
  LayerLora lora = random_lora(s, 4, 8.0f, 52, 1);
  auto layer = test::make_tp_layer(kernels::Isa::portable, test::test_node_group(2), w, lora_view(lora), 64, 1);
  REQUIRE(layer->gather_shared());
  const int tokens = 64;  // 32 rows an expert: tile order where forced
  auto routing = random_routing(tokens, s, 53);
  auto x = to_bf16(random_activations(static_cast<std::size_t>(tokens) * s.hidden, 54).data(), static_cast<std::size_t>(tokens) * s.hidden);
  std::vector<float> out(static_cast<std::size_t>(tokens) * s.hidden), want(out.size());
  layer->forward_sft(tokens, s.top_k, x.data(), routing.expert_ids.data(), routing.weights.data(), want.data(), false);
  layer->node_layer(0).forward_pass().set_tile_order_min_rows(16);  // node 1 keeps rows
  CHECK_THROWS_AS(layer->forward_sft(tokens, s.top_k, x.data(), routing.expert_ids.data(), routing.weights.data(), out.data(), true),
                  std::logic_error);
  CHECK(layer->node_layer(0).cached_forwards() == 0);
  CHECK(layer->node_layer(1).cached_forwards() == 0);
  layer->node_layer(1).forward_pass().set_tile_order_min_rows(16);
  layer->forward_sft(tokens, s.top_k, x.data(), routing.expert_ids.data(), routing.weights.data(), out.data(), false);
  CHECK(out == want);
}

TEST_CASE("tensor-parallel layer on int8 and int4 weights equals the unsplit quantized layer", "[tp][quantized]") {
  MoeShape s{96, 320, 6, 2};
  auto w = random_expert_weights(s, 21);
  LayerLora lora = random_lora(s, 8, 16.0f, 22, 1);
  const int tokens = 20;
  auto routing = random_routing(tokens, s, 23);
  auto x = random_activations(static_cast<std::size_t>(tokens) * s.hidden, 24);
  auto xb = to_bf16(x.data(), x.size());
  auto go = random_activations(x.size(), 25);
  for (auto [type, group] : {std::pair{WeightType::int8, 0}, {WeightType::int4, 32}, {WeightType::int4, 128}}) {
    INFO(weight_type_name(type) << " group " << group);
    auto q = quant::quantize_experts(w.view(), type, group, nullptr);
    std::vector<std::vector<float>> outs, dxs;
    std::vector<LayerLora> grads;
    for (int nodes : {1, 2, 3}) {
      SftLayerOptions opt{tokens, 1, 8, s.top_k};
      TensorParallelLayer layer(s, type, group, test::test_node_group(nodes), kernels::Isa::portable, opt,
                                [&](quant::IntermediateSlice sl, numa::ThreadPool& pool, int node) {
                                  return PackedExpertWeights::pack_quantized(quant::slice_experts(q, sl), pool, node);
                                },
                                lora_view(lora));
      CHECK(layer.node_count() == std::min(nodes, type == WeightType::int4 && group == 128 ? 3 : nodes));
      outs.emplace_back(x.size());
      dxs.emplace_back(x.size());
      grads.push_back(lora.zeros_like());
      layer.forward_sft(tokens, s.top_k, xb.data(), routing.expert_ids.data(), routing.weights.data(), outs.back().data(), true);
      layer.backward(go.data(), dxs.back().data(), lora_grad_view(grads.back()));
    }
    for (std::size_t i = 1; i < outs.size(); ++i) {
      INFO(i + 1 << " nodes against 1");
      // Each node quantizes its own slice of h per row (a finer scale than the whole row's), so the
      // outputs differ by the int8 activation rounding; the backward reads no quantized activation,
      // and each node rounds its partial rows of dX to bf16 (about 2e-3 apart here).
      CHECK(test::rel_error(outs[i], outs[0]) <= 3e-2);
      CHECK(test::rel_error(dxs[i], dxs[0]) <= 5e-3);
      for (int p = 0; p < 3; ++p) {
        CHECK(test::rel_error(grads[i].proj[p].a, grads[0].proj[p].a) <= 1e-3);
        CHECK(test::rel_error(grads[i].proj[p].b, grads[0].proj[p].b) <= 1e-3);
      }
    }
  }
}
