// MoeSftLayer as a trainer drives it: the cache stack's discipline (depth 1..4, interleaved
// orders, overflow and underflow), LoRA weights that are the caller's memory, gradient
// accumulation, bad arguments, and a short training run whose loss curve must track the
// reference path's. Portable kernels, so it runs everywhere.
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>

#include "catch.hpp"
#include "src/layer/moe_compute.hpp"
#include "src/layer/moe_sft_layer.hpp"
#include "src/layer/synthetic_layer.hpp"
#include "src/reference/moe_reference.hpp"
#include "test_util.hpp"
#include "tilemoe/error.hpp"

using namespace tilemoe;
using tilemoe::test::rel_error;

namespace {

const MoeShape kShape{48, 40, 6, 2};

struct Batch {
  int tokens;
  RandomRouting routing;
  std::vector<float> x, grad_out;
  std::vector<bf16> xb;
};

Batch make_batch(int tokens, std::uint64_t seed) {
  Batch b{tokens, random_routing(tokens, kShape, seed), random_activations(static_cast<std::size_t>(tokens) * kShape.hidden, seed + 1),
          random_activations(static_cast<std::size_t>(tokens) * kShape.hidden, seed + 2), {}};
  b.xb = to_bf16(b.x.data(), b.x.size());
  return b;
}

struct Expected {
  std::vector<float> out, grad_input;
  LayerLora grads;
};

Expected reference(const ExpertWeights& w, const LayerLora& lora, const Batch& b) {
  MoeBatch<float> mb{b.tokens, kShape.top_k, b.x.data(), b.routing.expert_ids.data(), b.routing.weights.data()};
  Expected e{std::vector<float>(b.x.size()), std::vector<float>(b.x.size()), lora.zeros_like()};
  reference_forward(w.view(), lora, mb, e.out.data());
  reference_backward(w.view(), lora, mb, b.grad_out.data(), e.grad_input.data(), &e.grads);
  return e;
}

struct Fixture {
  numa::ThreadPool& pool = pool_for_threads(0);
  ExpertWeights w = random_expert_weights(kShape, 3);
  PackedExpertWeights packed = PackedExpertWeights::pack(w.view(), pool);
  LayerLora lora = random_lora(kShape, 4, 8.0f, 4);
};

std::vector<float> forward(MoeSftLayer& layer, const Batch& b, bool save) {
  std::vector<float> out(b.x.size());
  layer.forward_sft(b.tokens, kShape.top_k, b.xb.data(), b.routing.expert_ids.data(), b.routing.weights.data(), out.data(), save);
  return out;
}

// Pops one saved forward and checks its results against `want`.
void backward_matches(MoeSftLayer& layer, const Batch& b, const Expected& want, const LayerLora& like) {
  std::vector<float> dx(b.x.size());
  LayerLora grads = like.zeros_like();
  layer.backward(b.grad_out.data(), dx.data(), lora_grad_view(grads));
  CHECK(rel_error(dx, want.grad_input) <= 1e-2);
  for (Projection p : kProjections) {
    CHECK(rel_error(grads[p].a, want.grads[p].a) <= 2e-2);
    CHECK(rel_error(grads[p].b, want.grads[p].b) <= 2e-2);
  }
}

}  // namespace

TEST_CASE("the cache stack serves depth 1 to 4 in last-in first-out order", "[sft][cache]") {
  Fixture f;
  for (int depth = 1; depth <= 4; ++depth) {
    INFO("depth " << depth);
    MoeSftLayer layer(f.packed, kernels::Isa::portable, f.pool, {20, depth, 4}, lora_view(f.lora));
    std::vector<Batch> batches;
    for (int i = 0; i < depth; ++i) batches.push_back(make_batch(3 + 5 * i, 100 + 10 * i));
    for (const auto& b : batches) forward(layer, b, true);
    CHECK(layer.cached_forwards() == depth);
    for (int i = depth - 1; i >= 0; --i) backward_matches(layer, batches[i], reference(f.w, f.lora, batches[i]), f.lora);
    CHECK(layer.cached_forwards() == 0);
  }
}

TEST_CASE("interleaved forwards and backwards pop the right entries", "[sft][cache]") {
  Fixture f;
  MoeSftLayer layer(f.packed, kernels::Isa::portable, f.pool, {20, 3, 4}, lora_view(f.lora));
  Batch b1 = make_batch(7, 11), b2 = make_batch(13, 22), b3 = make_batch(1, 33), b4 = make_batch(20, 44);
  forward(layer, b1, true);
  forward(layer, b2, true);
  forward(layer, b4, false);  // an inference forward in between saves nothing
  backward_matches(layer, b2, reference(f.w, f.lora, b2), f.lora);
  forward(layer, b3, true);
  backward_matches(layer, b3, reference(f.w, f.lora, b3), f.lora);
  forward(layer, b4, true);
  backward_matches(layer, b4, reference(f.w, f.lora, b4), f.lora);
  backward_matches(layer, b1, reference(f.w, f.lora, b1), f.lora);
  CHECK(layer.cached_forwards() == 0);
}

TEST_CASE("overflow and underflow are clear errors that leave the layer usable", "[sft][cache]") {
  Fixture f;
  MoeSftLayer layer(f.packed, kernels::Isa::portable, f.pool, {20, 2, 4}, lora_view(f.lora));
  Batch b1 = make_batch(5, 1), b2 = make_batch(6, 2), b3 = make_batch(7, 3);
  std::vector<float> dx(b1.x.size());
  CHECK_THROWS_WITH(layer.backward(b1.grad_out.data(), dx.data(), {}), Catch::Matchers::Contains("cache stack is empty"));
  forward(layer, b1, true);
  forward(layer, b2, true);
  try {
    forward(layer, b3, true);
    FAIL("a third saved forward on a stack of depth 2 must throw");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::state);
    CHECK(std::string(e.what()).find("full (max_cache_depth 2)") != std::string::npos);
  }
  CHECK(layer.cached_forwards() == 2);
  backward_matches(layer, b2, reference(f.w, f.lora, b2), f.lora);
  backward_matches(layer, b1, reference(f.w, f.lora, b1), f.lora);
  CHECK_THROWS_AS(layer.backward(b1.grad_out.data(), dx.data(), {}), Error);
  forward(layer, b3, true);
  backward_matches(layer, b3, reference(f.w, f.lora, b3), f.lora);
}

TEST_CASE("bad batches are refused before anything is saved", "[sft][cache]") {
  Fixture f;
  MoeSftLayer layer(f.packed, kernels::Isa::portable, f.pool, {8, 2, 4}, lora_view(f.lora));
  Batch big = make_batch(9, 5), ok = make_batch(8, 6);
  CHECK_THROWS_WITH(forward(layer, big, true), Catch::Matchers::Contains("does not fit the forward cache (max_tokens 8"));
  Batch bad = ok;
  bad.routing.expert_ids[3] = kShape.num_experts;
  CHECK_THROWS_WITH(forward(layer, bad, true), Catch::Matchers::Contains("out of range"));
  CHECK(layer.cached_forwards() == 0);
  forward(layer, ok, true);
  backward_matches(layer, ok, reference(f.w, f.lora, ok), f.lora);
  CHECK_THROWS_AS(MoeSftLayer(f.packed, kernels::Isa::portable, f.pool, {0, 1, 4}), Error);
  // A cache depth of 0 is a layer for inference: it builds, and refuses to save a forward.
  MoeSftLayer inference(f.packed, kernels::Isa::portable, f.pool, {8, 0, 4});
  CHECK_THROWS_WITH(forward(inference, ok, true), Catch::Matchers::Contains("saves no forwards"));
}

TEST_CASE("LoRA weights are the caller's memory: edits are seen, sets swap without copies", "[sft][lora]") {
  Fixture f;
  MoeSftLayer layer(f.packed, kernels::Isa::portable, f.pool, {20, 2, 8}, lora_view(f.lora));
  Batch b = make_batch(9, 77);
  CHECK(rel_error(forward(layer, b, false), reference(f.w, f.lora, b).out) <= 1e-2);

  // An optimizer step in place, no call: the next forward uses it.
  for (auto& p : f.lora.proj)
    for (auto& v : p.b) v += 0.03f;
  auto changed = reference(f.w, f.lora, b);
  CHECK(rel_error(forward(layer, b, false), changed.out) <= 1e-2);

  // Another set, by pointer; one that does not fit is refused and the old one kept.
  LayerLora other = random_lora(kShape, 8, 4.0f, 9);
  layer.update_lora_weights(lora_view(other));
  CHECK(rel_error(forward(layer, b, false), reference(f.w, other, b).out) <= 1e-2);
  LayerLora too_big = random_lora(kShape, 9, 4.0f, 10);
  CHECK_THROWS_WITH(layer.update_lora_weights(lora_view(too_big)), Catch::Matchers::Contains("exceeds the layer's max_lora_rank 8"));
  LayerLoraView wrong = lora_view(other);
  wrong[Projection::down].in = kShape.hidden;
  CHECK_THROWS_WITH(layer.update_lora_weights(wrong), Catch::Matchers::Contains("LoRA of down"));
  CHECK(rel_error(forward(layer, b, false), reference(f.w, other, b).out) <= 1e-2);

  // A saved forward is differentiated at the set it used, even after a swap.
  forward(layer, b, true);
  layer.update_lora_weights(lora_view(f.lora));
  backward_matches(layer, b, reference(f.w, other, b), other);
}

TEST_CASE("a large batch's saved input (copied by the pool's workers, in chunks) gives the reference's gradients", "[sft][cache]") {
  Fixture f;
  const int tokens = 1401;  // 67248 elements: two whole chunks and a partial one
  MoeSftLayer layer(f.packed, kernels::Isa::portable, f.pool, {tokens, 1, 4}, lora_view(f.lora));
  Batch b = make_batch(tokens, 41);
  const Expected want = reference(f.w, f.lora, b);
  CHECK(rel_error(forward(layer, b, true), want.out) <= 1e-2);
  backward_matches(layer, b, want, f.lora);
}

TEST_CASE("gradients accumulate when asked; experts without tokens get zero otherwise", "[sft][lora]") {
  Fixture f;
  MoeSftLayer layer(f.packed, kernels::Isa::portable, f.pool, {20, 2, 4}, lora_view(f.lora));
  Batch b1 = make_batch(4, 8), b2 = make_batch(11, 9);
  auto w1 = reference(f.w, f.lora, b1), w2 = reference(f.w, f.lora, b2);
  LayerLora grads = f.lora.zeros_like();
  for (auto& p : grads.proj) std::fill(p.a.begin(), p.a.end(), 5.0f);
  std::vector<float> dx(b2.x.size());
  forward(layer, b1, true);
  layer.backward(b1.grad_out.data(), dx.data(), lora_grad_view(grads), /*accumulate=*/false);
  forward(layer, b2, true);
  layer.backward(b2.grad_out.data(), dx.data(), lora_grad_view(grads), /*accumulate=*/true);
  for (Projection p : kProjections) {
    std::vector<float> sa(grads[p].a.size()), sb(grads[p].b.size());
    for (std::size_t i = 0; i < sa.size(); ++i) sa[i] = w1.grads[p].a[i] + w2.grads[p].a[i];
    for (std::size_t i = 0; i < sb.size(); ++i) sb[i] = w1.grads[p].b[i] + w2.grads[p].b[i];
    CHECK(rel_error(grads[p].a, sa) <= 2e-2);
    CHECK(rel_error(grads[p].b, sb) <= 2e-2);
  }
}

// A student LoRA learns a teacher's delta with SGD, once on the runtime's gradients and once on
// the reference path's; the two loss curves must agree at every step, and fall.
TEST_CASE("50 SGD steps on the runtime's gradients track the reference path's loss curve", "[sft][train]") {
  Fixture f;
  LayerLora teacher = random_lora(kShape, 4, 8.0f, 21);
  for (auto& p : teacher.proj)
    for (auto& v : p.b) v *= 8.0f;  // a delta large enough to learn
  Batch b = make_batch(24, 55);
  auto target = reference(f.w, teacher, b).out;
  LayerLora student = random_lora(kShape, 4, 8.0f, 22), student_ref = student;
  for (auto* s : {&student, &student_ref})
    for (auto& p : s->proj) std::fill(p.b.begin(), p.b.end(), 0.0f);  // PEFT's initialisation
  MoeSftLayer layer(f.packed, kernels::Isa::portable, f.pool, {24, 1, 4}, lora_view(student));
  LayerLora grads = student.zeros_like(), grads_ref = student.zeros_like();
  std::vector<float> dx(b.x.size()), dx_ref(b.x.size()), go(b.x.size()), out_ref(b.x.size());
  const float lr = 0.15f;
  auto loss_and_grad = [&](const std::vector<float>& out) {
    double loss = 0;
    for (std::size_t i = 0; i < out.size(); ++i) {
      const double d = out[i] - target[i];
      loss += 0.5 * d * d / b.tokens;
      go[i] = static_cast<float>(d / b.tokens);
    }
    return loss;
  };
  auto sgd = [&](LayerLora& l, const LayerLora& g) {
    for (int p = 0; p < 3; ++p) {
      for (std::size_t i = 0; i < l.proj[p].a.size(); ++i) l.proj[p].a[i] -= lr * g.proj[p].a[i];
      for (std::size_t i = 0; i < l.proj[p].b.size(); ++i) l.proj[p].b[i] -= lr * g.proj[p].b[i];
    }
  };
  double first = 0, last = 0;
  for (int step = 0; step < 50; ++step) {
    double loss = loss_and_grad(forward(layer, b, true));
    layer.backward(go.data(), dx.data(), lora_grad_view(grads));
    sgd(student, grads);  // in place: the layer sees it at the next forward

    MoeBatch<float> mb{b.tokens, kShape.top_k, b.x.data(), b.routing.expert_ids.data(), b.routing.weights.data()};
    reference_forward(f.w.view(), student_ref, mb, out_ref.data());
    double loss_ref = loss_and_grad(out_ref);
    reference_backward(f.w.view(), student_ref, mb, go.data(), dx_ref.data(), &grads_ref);
    sgd(student_ref, grads_ref);

    INFO("step " << step << ": loss " << loss << ", reference " << loss_ref);
    REQUIRE(std::fabs(loss - loss_ref) <= 1e-2 * loss_ref);
    if (step == 0) first = loss;
    last = loss;
  }
  INFO("loss " << first << " -> " << last);
  CHECK(last < 0.5 * first);
}

TEST_CASE("layers on one pool share their backward buffers and take turns from several threads", "[sft][workspace]") {
  // Two layers of different shapes on one pool: their forward and backward buffers are the
  // pool's (pool_workspace.hpp). Each thread trains its own layer; every step must give the
  // results of the same step made alone, bit for bit.
  numa::ThreadPool& pool = pool_for_threads(2);
  const MoeShape shapes[2] = {kShape, MoeShape{72, 56, 5, 3}};
  struct Layer {
    ExpertWeights w;
    PackedExpertWeights packed;
    LayerLora lora;
    std::unique_ptr<MoeSftLayer> sft;
  };
  struct Step {
    int tokens;
    RandomRouting routing;
    std::vector<bf16> x;
    std::vector<float> grad_out, out, grad_input;
    LayerLora grads;
  };
  Layer layers[2];
  std::vector<Step> steps[2];
  auto run = [&](int l, const Step& st, std::vector<float>& out, std::vector<float>& dx, LayerLora& grads) {
    const MoeShape& s = shapes[l];
    layers[l].sft->forward_sft(st.tokens, s.top_k, st.x.data(), st.routing.expert_ids.data(), st.routing.weights.data(), out.data(), true);
    layers[l].sft->backward(st.grad_out.data(), dx.data(), lora_grad_view(grads));
  };
  for (int l = 0; l < 2; ++l) {
    const MoeShape& s = shapes[l];
    Layer& L = layers[l];
    L.w = random_expert_weights(s, 30 + l);
    L.packed = PackedExpertWeights::pack(L.w.view(), pool);
    L.lora = random_lora(s, 4 + l, 8.0f, 40 + l);
    L.sft = std::make_unique<MoeSftLayer>(L.packed, kernels::Isa::portable, pool, SftLayerOptions{100, 1, 8}, lora_view(L.lora));
    for (int tokens : {1, 37, 5, 90}) {
      Step st{tokens, random_routing(tokens, s, 50 + tokens + l), {}, {}, {}, {}, L.lora.zeros_like()};
      const auto x = random_activations(static_cast<std::size_t>(tokens) * s.hidden, 60 + tokens + l);
      st.x = to_bf16(x.data(), x.size());
      st.grad_out = random_activations(x.size(), 70 + tokens + l);
      st.out.resize(x.size());
      st.grad_input.resize(x.size());
      run(l, st, st.out, st.grad_input, st.grads);
      steps[l].push_back(std::move(st));
    }
  }
  std::atomic<int> mismatches{0};
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  auto hammer = [&](int l) {
    for (int round = 0; round < 10; ++round)
      for (const Step& st : steps[l]) {
        std::vector<float> out(st.out.size()), dx(st.grad_input.size());
        LayerLora grads = layers[l].lora.zeros_like();
        run(l, st, out, dx, grads);
        bool ok = same(out, st.out) && same(dx, st.grad_input);
        for (Projection p : kProjections) ok = ok && same(grads[p].a, st.grads[p].a) && same(grads[p].b, st.grads[p].b);
        if (!ok) ++mismatches;
      }
  };
  std::thread other(hammer, 1);
  hammer(0);
  other.join();
  CHECK(mismatches.load() == 0);
}
