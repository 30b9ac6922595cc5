// The public C++ API (include/tilemoe/) as a server or trainer uses it: layers from the caller's
// memory and from checkpoints, bf16 and f32 at the boundary, zero-copy LoRA, adapters, and every
// bad argument answered by an Error that names it and changes nothing. Results are checked
// against the reference path and the PyTorch fixtures, on the portable kernels and the fastest.
#include <cmath>
#include <tuple>

#include "catch.hpp"
#include "expect_error.hpp"
#include "fixture_cases.hpp"
#include "src/layer/moe_compute.hpp"
#include "src/model/checkpoint.hpp"
#include "src/quant/checkpoint_fingerprint.hpp"
#include "src/quant/quantize.hpp"
#include "src/quant/quantized_file.hpp"
#include "src/layer/synthetic_layer.hpp"
#include "src/lora/lora_file.hpp"
#include "src/lora/lora_view.hpp"
#include "src/lora/peft_export.hpp"
#include "src/reference/moe_reference.hpp"
#include "test_util.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/moe_layer.hpp"

using namespace tilemoe;
using test::expect_error;
using tilemoe::test::rel_error;

namespace {

// Awkward on purpose: nothing is a multiple of 16.
const MoeShape kShape{100, 72, 7, 3};
constexpr int kRank = 5;
constexpr double kAlpha = 7.0;

MoeLayerConfig config(int max_tokens = 40, int depth = 2) {
  MoeLayerConfig c;
  c.num_experts = kShape.num_experts;
  c.top_k = kShape.top_k;
  c.hidden = kShape.hidden;
  c.intermediate = kShape.intermediate;
  c.max_tokens = max_tokens;
  c.lora_rank = kRank;
  c.lora_alpha = kAlpha;
  c.max_cache_depth = depth;
  return c;
}

ExpertWeightsRef ref_of(const ExpertWeights& w) { return {w.gate.data(), w.up.data(), w.down.data()}; }

// A LoRA set the way a trainer holds it: plain arrays, one scale for all experts.
struct TrainerLora {
  std::vector<float> ga, gb, ua, ub, da, db;
  LayerLora as_reference;  // the same numbers for the reference path

  explicit TrainerLora(std::uint64_t seed) {
    LayerLora l = random_lora(kShape, kRank, static_cast<float>(kAlpha), seed);
    for (auto& p : l.proj) std::fill(p.scale.begin(), p.scale.end(), static_cast<float>(kAlpha / kRank));
    ga = l[Projection::gate].a, gb = l[Projection::gate].b, ua = l[Projection::up].a, ub = l[Projection::up].b;
    da = l[Projection::down].a, db = l[Projection::down].b;
    as_reference = l;
  }
  LoraWeights weights() const { return {ga.data(), gb.data(), ua.data(), ub.data(), da.data(), db.data()}; }
};

struct GradBuffers {
  std::vector<float> ga, gb, ua, ub, da, db;
  explicit GradBuffers(const TrainerLora& l)
      : ga(l.ga.size()), gb(l.gb.size()), ua(l.ua.size()), ub(l.ub.size()), da(l.da.size()), db(l.db.size()) {}
  LoraGrads grads() { return {ga.data(), gb.data(), ua.data(), ub.data(), da.data(), db.data()}; }
};

struct Batch {
  int tokens;
  RandomRouting routing;
  std::vector<float> x, grad_out;
  std::vector<bf16> xb, grad_out_b;
};

Batch make_batch(int tokens, std::uint64_t seed) {
  Batch b{tokens, random_routing(tokens, kShape, seed), random_activations(static_cast<std::size_t>(tokens) * kShape.hidden, seed + 1),
          random_activations(static_cast<std::size_t>(tokens) * kShape.hidden, seed + 2), {}, {}};
  b.xb = to_bf16(b.x.data(), b.x.size());
  b.grad_out_b = to_bf16(b.grad_out.data(), b.grad_out.size());
  // The reference sees exactly the bf16 values the layer sees.
  for (std::size_t i = 0; i < b.x.size(); ++i) b.x[i] = bf16_to_float(b.xb[i]), b.grad_out[i] = bf16_to_float(b.grad_out_b[i]);
  return b;
}

std::vector<float> as_f32(const std::vector<bf16>& v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = bf16_to_float(v[i]);
  return out;
}

CheckpointLayerOptions checkpoint_options(int max_tokens, const std::string& adapter) {
  CheckpointLayerOptions o;
  o.max_tokens = max_tokens;
  o.max_cache_depth = 1;
  o.adapter = adapter;
  return o;
}

}  // namespace

TEST_CASE("a layer from the caller's memory matches the reference path, bf16 and f32 at the boundary", "[api]") {
  ExpertWeights w = random_expert_weights(kShape, 11);
  TrainerLora lora(12);
  // One node, and split over 3 (virtual) NUMA nodes: the same results within rounding.
  for (const auto& [isa, nodes] : {std::pair<const char*, int>{"portable", 1}, {"auto", 1}, {"portable", 3}, {"auto", 3}}) {
    SECTION(std::string(isa) + ", " + std::to_string(nodes) + " node(s)") {
      Runtime rt({isa, 0});
      MoeLayerConfig cfg = config();
      cfg.numa_nodes = nodes;
      MoeLayer layer(rt, cfg, ref_of(w));
      CHECK(layer.config().numa_nodes == nodes);
      layer.update_lora_weights(lora.weights());
      CHECK(layer.lora_scale() == Approx(kAlpha / kRank));
      for (int tokens : {1, 13, 40}) {
        INFO("tokens " << tokens);
        Batch b = make_batch(tokens, 100 + tokens);
        MoeBatch<float> mb{tokens, kShape.top_k, b.x.data(), b.routing.expert_ids.data(), b.routing.weights.data()};
        std::vector<float> want(b.x.size()), want_dx(b.x.size());
        LayerLora want_grads = lora.as_reference.zeros_like();
        reference_forward(w.view(), lora.as_reference, mb, want.data());
        reference_backward(w.view(), lora.as_reference, mb, b.grad_out.data(), want_dx.data(), &want_grads);

        std::vector<float> out(b.x.size());
        std::vector<bf16> out_b(b.x.size());
        layer.forward(tokens, kShape.top_k, b.xb.data(), b.routing.expert_ids.data(), b.routing.weights.data(), out.data());
        CHECK(rel_error(out, want) <= 1e-2);
        layer.forward(tokens, kShape.top_k, b.xb.data(), b.routing.expert_ids.data(), b.routing.weights.data(), out_b.data());
        CHECK(rel_error(as_f32(out_b), want) <= 1e-2);

        // bf16 in and out, then f32 in and out with accumulation: the second adds the same again.
        GradBuffers g(lora);
        std::vector<bf16> dx_b(b.x.size());
        std::vector<float> dx(b.x.size());
        layer.forward_sft(tokens, kShape.top_k, b.xb.data(), b.routing.expert_ids.data(), b.routing.weights.data(), out_b.data(), true);
        layer.forward_sft(tokens, kShape.top_k, b.xb.data(), b.routing.expert_ids.data(), b.routing.weights.data(), out.data(), true);
        CHECK(layer.cached_forwards() == 2);
        layer.backward(b.grad_out.data(), dx.data(), g.grads());
        layer.backward(b.grad_out_b.data(), dx_b.data(), g.grads(), /*accumulate=*/true);
        CHECK(layer.cached_forwards() == 0);
        CHECK(rel_error(dx, want_dx) <= 1e-2);
        CHECK(rel_error(as_f32(dx_b), want_dx) <= 1e-2);
        auto twice = [](std::vector<float> v) {
          for (float& x : v) x *= 2;
          return v;
        };
        CHECK(rel_error(g.ga, twice(want_grads[Projection::gate].a)) <= 2e-2);
        CHECK(rel_error(g.gb, twice(want_grads[Projection::gate].b)) <= 2e-2);
        CHECK(rel_error(g.ua, twice(want_grads[Projection::up].a)) <= 2e-2);
        CHECK(rel_error(g.ub, twice(want_grads[Projection::up].b)) <= 2e-2);
        CHECK(rel_error(g.da, twice(want_grads[Projection::down].a)) <= 2e-2);
        CHECK(rel_error(g.db, twice(want_grads[Projection::down].b)) <= 2e-2);
      }
    }
  }
}

TEST_CASE("stacked gate_up and strided experts are read in place, as the dense arrays", "[api]") {
  ExpertWeights w = random_expert_weights(kShape, 21);
  const std::size_t per = static_cast<std::size_t>(kShape.hidden) * kShape.intermediate;
  // w13 / gate_up_proj [E][2I][H], and down with 3 elements between experts
  std::vector<bf16> gate_up(2 * per * kShape.num_experts), down(static_cast<std::size_t>(kShape.num_experts) * (per + 3));
  for (int e = 0; e < kShape.num_experts; ++e) {
    std::copy_n(w.gate.begin() + static_cast<std::ptrdiff_t>(per * e), per, gate_up.begin() + static_cast<std::ptrdiff_t>(2 * per * e));
    std::copy_n(w.up.begin() + static_cast<std::ptrdiff_t>(per * e), per, gate_up.begin() + static_cast<std::ptrdiff_t>(2 * per * e + per));
    std::copy_n(w.down.begin() + static_cast<std::ptrdiff_t>(per * e), per, down.begin() + static_cast<std::ptrdiff_t>((per + 3) * e));
  }
  ExpertWeightsRef stacked = ExpertWeightsRef::stacked_gate_up(gate_up.data(), down.data(), kShape.hidden, kShape.intermediate);
  stacked.down_stride = per + 3;
  TrainerLora lora(22);
  Batch b = make_batch(29, 23);
  for (WeightType type : {WeightType::bf16, WeightType::int8}) {
    INFO("weights " << weight_type_name(type));
    Runtime rt({"auto", 0});
    MoeLayerConfig cfg = config();
    cfg.weight_type = type;
    MoeLayer dense(rt, cfg, ref_of(w)), strided(rt, cfg, stacked);
    std::vector<float> want(b.x.size()), got(b.x.size()), want_dx(b.x.size()), got_dx(b.x.size());
    GradBuffers gw(lora), gg(lora);
    for (MoeLayer* l : {&dense, &strided}) l->update_lora_weights(lora.weights());
    dense.forward_sft(b.tokens, kShape.top_k, b.xb.data(), b.routing.expert_ids.data(), b.routing.weights.data(), want.data(), true);
    strided.forward_sft(b.tokens, kShape.top_k, b.xb.data(), b.routing.expert_ids.data(), b.routing.weights.data(), got.data(), true);
    CHECK(got == want);
    dense.backward(b.grad_out.data(), want_dx.data(), gw.grads());
    strided.backward(b.grad_out.data(), got_dx.data(), gg.grads());
    CHECK(got_dx == want_dx);
    CHECK(gg.ua == gw.ua);
    CHECK(gg.db == gw.db);
  }
  Runtime rt({"portable", 0});
  ExpertWeightsRef overlapping = stacked;
  overlapping.gate_stride = per - 1;
  expect_error([&] { MoeLayer(rt, config(), overlapping); }, ErrorKind::invalid_argument, "gate_stride is " + std::to_string(per - 1));
}

TEST_CASE("LoRA weights are the caller's memory: an optimizer step is seen by the next forward", "[api][lora]") {
  ExpertWeights w = random_expert_weights(kShape, 21);
  TrainerLora lora(22);
  Runtime rt;
  MoeLayer layer(rt, config(), ref_of(w));
  layer.update_lora_weights(lora.weights());
  Batch b = make_batch(9, 23);
  auto run = [&] {
    std::vector<float> out(b.x.size());
    layer.forward(b.tokens, kShape.top_k, b.xb.data(), b.routing.expert_ids.data(), b.routing.weights.data(), out.data());
    return out;
  };
  std::vector<float> before = run();
  for (float& v : lora.gb) v *= 3.0f;  // the optimizer writes in place; no call tells the layer
  for (auto& v : lora.as_reference[Projection::gate].b) v *= 3.0f;
  std::vector<float> after = run(), want(b.x.size());
  MoeBatch<float> mb{b.tokens, kShape.top_k, b.x.data(), b.routing.expert_ids.data(), b.routing.weights.data()};
  reference_forward(w.view(), lora.as_reference, mb, want.data());
  CHECK(rel_error(after, want) <= 1e-2);
  CHECK(rel_error(after, before) > 1e-3);

  // Gate and up keep their own A: a set with only down LoRA leaves gate and up without.
  layer.update_lora_weights(LoraWeights{nullptr, nullptr, nullptr, nullptr, lora.da.data(), lora.db.data()});
  CHECK(layer.lora()[Projection::gate].rank == 0);
  CHECK(layer.lora()[Projection::down].rank == kRank);
}

TEST_CASE("layers from checkpoints with adapters match every PyTorch fixture", "[api][fixtures]") {
  Runtime rt;
  for (const auto& c : test::fixture_cases()) {
    SECTION(c.name) {
      auto ref = io::SafetensorsFile::open(c.dir + "/reference.safetensors");
      for (int l : c.layers) {
        INFO("layer " << l);
        test::FixtureLayerInputs in = test::read_fixture_layer(ref, l);
        const int tokens = in.tokens, top_k = in.top_k;
        const bf16* xb = in.input_bf16.data();
        const std::int64_t* ids = in.expert_ids.data();
        const float* wts = in.weights.data();

        MoeLayer layer = MoeLayer::from_checkpoint(rt, c.dir + "/model", l, checkpoint_options(tokens, c.dir + "/adapter"));
        std::vector<float> out(in.input.size()), dx(in.input.size());
        layer.forward_sft(tokens, top_k, xb, ids, wts, out.data(), true);
        CHECK(rel_error(out, in.expected(ref, "output")) <= 1e-2);

        // Gradients land in arrays shaped like the adapter's set, which lora() describes.
        LoadedLora shapes = load_layer_lora(c.dir + "/adapter", read_model_config(c.dir + "/model"), l);
        LayerLora grads = shapes.lora.zeros_like();
        LayerLoraGrad gv;
        for (int i = 0; i < 3; ++i) gv[i].a = grads.proj[i].a.data(), gv[i].b = grads.proj[i].b.data();
        CHECK(layer.lora().max_rank() == shapes.lora.proj[0].rank);
        layer.backward(in.grad_output.data(), dx.data(), gv);
        CHECK(rel_error(dx, in.expected(ref, "grad_input")) <= 1e-2);
        test::check_fixture_lora_grads(grads, shapes, ref, layer.config().num_experts);

        // Unloading the adapter gives the base layer; loading it back, the adapter again.
        layer.unload_adapter();
        std::vector<float> base(in.input.size());
        layer.forward(tokens, top_k, xb, ids, wts, base.data());
        CHECK(rel_error(base, out) > 1e-4);
        layer.load_adapter(c.dir + "/adapter");
        layer.forward(tokens, top_k, xb, ids, wts, base.data());
        CHECK(rel_error(base, out) <= 1e-6);

        // The fixtures' adapters are BF16 files: the layer holds them in bf16 (half the memory),
        // with the same results, bit for bit, as their values given in f32.
        for (Projection p : kProjections)
          if (layer.lora()[p].rank > 0) CHECK(layer.lora()[p].dtype == LoraDType::bf16);
        CheckpointLayerOptions plain = checkpoint_options(tokens, "");
        plain.lora_rank = lora_view(shapes.lora).max_rank();
        MoeLayer given_f32 = MoeLayer::from_checkpoint(rt, c.dir + "/model", l, plain);
        given_f32.update_lora_weights(lora_view(shapes.lora));
        std::vector<float> from_f32(in.input.size());
        given_f32.forward(tokens, top_k, xb, ids, wts, from_f32.data());
        CHECK(from_f32 == base);

        // Held as asked: in f32, or in bf16 from an F32 copy of the adapter (the same values).
        layer.load_adapter(c.dir + "/adapter", -1, AdapterStorage::f32);
        for (Projection p : kProjections)
          if (layer.lora()[p].rank > 0) CHECK(layer.lora()[p].dtype == LoraDType::f32);
        layer.forward(tokens, top_k, xb, ids, wts, from_f32.data());
        CHECK(from_f32 == base);
        const std::string f32_copy = test::temp_dir() + "/" + c.name + ".f32_adapter";
        if (l == c.layers.front()) {
          const ModelConfig model = read_model_config(c.dir + "/model");
          convert_peft_to_lora_file(PeftAdapter::open(c.dir + "/adapter", model), model, f32_copy + ".lora");
          std::filesystem::remove_all(f32_copy);
          export_lora_file(f32_copy + ".lora", f32_copy, ExportDtype::f32);
        }
        for (AdapterStorage storage : {AdapterStorage::as_stored, AdapterStorage::bf16}) {
          layer.load_adapter(f32_copy, -1, storage);
          const LoraDType want = storage == AdapterStorage::bf16 ? LoraDType::bf16 : LoraDType::f32;
          for (Projection p : kProjections)
            if (layer.lora()[p].rank > 0) CHECK(layer.lora()[p].dtype == want);
          layer.forward(tokens, top_k, xb, ids, wts, from_f32.data());
          CHECK(from_f32 == base);
        }
      }
    }
  }
}

TEST_CASE("gpt-oss's SwiGLU and the experts' biases: forward and backward through the API, split or not, bf16 and int8", "[api]") {
  MoeShape s = kShape;
  s.swiglu_limit = 1.0f, s.swiglu_alpha = 1.702f, s.swiglu_up_offset = 1.0f;
  const ExpertWeights w = random_expert_weights(s, 41);  // with biases, as gpt-oss's form gets them
  REQUIRE(!w.down_bias.empty());
  TrainerLora lora(42);
  for (const auto& [isa, nodes, type] : {std::tuple<const char*, int, WeightType>{"portable", 1, WeightType::bf16}, {"auto", 1, WeightType::bf16},
                                         {"auto", 3, WeightType::bf16}, {"auto", 2, WeightType::int8}}) {
    SECTION(std::string(isa) + ", " + std::to_string(nodes) + " node(s), " + weight_type_name(type)) {
      Runtime rt({isa, 0});
      MoeLayerConfig cfg = config();
      cfg.numa_nodes = nodes;
      cfg.weight_type = type;
      cfg.swiglu_limit = 1.0, cfg.swiglu_alpha = 1.702, cfg.swiglu_up_offset = 1.0;
      ExpertWeightsRef ref = ref_of(w);
      ref.gate_bias = w.gate_bias.data(), ref.up_bias = w.up_bias.data(), ref.down_bias = w.down_bias.data();
      MoeLayer layer(rt, cfg, ref);
      layer.update_lora_weights(lora.weights());
      // int8: the reference on the same dequantized weights and int8 activations.
      const quant::QuantizedExperts q = quant::quantize_experts(w.view(), WeightType::int8, 0, nullptr);
      ReferenceOptions ro;
      if (type == WeightType::int8) ro = {true, &q};
      for (int tokens : {1, 40}) {
        INFO("tokens " << tokens);
        Batch b = make_batch(tokens, 200 + tokens);
        MoeBatch<float> mb{tokens, s.top_k, b.x.data(), b.routing.expert_ids.data(), b.routing.weights.data()};
        std::vector<float> want(b.x.size()), want_dx(b.x.size()), plain(b.x.size());
        LayerLora want_grads = lora.as_reference.zeros_like();
        reference_forward(w.view(), lora.as_reference, mb, want.data(), ro);
        reference_backward(w.view(), lora.as_reference, mb, b.grad_out.data(), want_dx.data(), &want_grads, ro);
        // The form and the biases move the output: a layer that ignored them would fail below.
        ExpertWeights without = w;
        without.shape = kShape;
        without.gate_bias.clear(), without.up_bias.clear(), without.down_bias.clear();
        reference_forward(without.view(), lora.as_reference, mb, plain.data());
        REQUIRE(rel_error(plain, want) > 0.2);

        std::vector<float> out(b.x.size()), dx(b.x.size());
        GradBuffers g(lora);
        layer.forward_sft(tokens, s.top_k, b.xb.data(), b.routing.expert_ids.data(), b.routing.weights.data(), out.data(), true);
        layer.backward(b.grad_out.data(), dx.data(), g.grads());
        CHECK(rel_error(out, want) <= 1e-2);
        CHECK(rel_error(dx, want_dx) <= 2e-2);
        CHECK(rel_error(g.ga, want_grads[Projection::gate].a) <= 2e-2);
        CHECK(rel_error(g.gb, want_grads[Projection::gate].b) <= 2e-2);
        CHECK(rel_error(g.ua, want_grads[Projection::up].a) <= 2e-2);
        CHECK(rel_error(g.ub, want_grads[Projection::up].b) <= 2e-2);
        CHECK(rel_error(g.da, want_grads[Projection::down].a) <= 2e-2);
        CHECK(rel_error(g.db, want_grads[Projection::down].b) <= 2e-2);
      }
    }
  }
}

TEST_CASE("bad configs, weights and calls are clear errors that change nothing", "[api][errors]") {
  ExpertWeights w = random_expert_weights(kShape, 31);
  Runtime rt;
  auto with = [](auto edit) {
    MoeLayerConfig c = config();
    edit(c);
    return c;
  };
  expect_error([&] { MoeLayer(rt, with([](auto& c) { c.top_k = 8; }), ref_of(w)); }, ErrorKind::invalid_argument, "top_k 8");
  expect_error([&] { MoeLayer(rt, with([](auto& c) { c.max_tokens = 0; }), ref_of(w)); }, ErrorKind::invalid_argument, "max_tokens 0");
  expect_error([&] { MoeLayer(rt, with([](auto& c) { c.hidden = -3; }), ref_of(w)); }, ErrorKind::invalid_argument, "hidden -3");
  expect_error([&] { MoeLayer(rt, with([](auto& c) { c.weight_type = WeightType::int4, c.group_size = 100; }), ref_of(w)); },
               ErrorKind::invalid_argument, "group_size 100");
  expect_error([&] { MoeLayer(rt, with([](auto& c) { c.numa_nodes = -1; }), ref_of(w)); }, ErrorKind::invalid_argument, "numa_nodes -1");
  expect_error([&] { MoeLayer(rt, config(), {w.gate.data(), nullptr, w.down.data()}); }, ErrorKind::invalid_argument, "null");
  expect_error([&] { Runtime({"sse2", 0}); }, ErrorKind::invalid_argument, "sse2");
  expect_error([&] { Runtime({"reference", 0}); }, ErrorKind::invalid_argument, "reference");
  {
    ExpertWeights bad = w;
    bad.up[static_cast<std::size_t>(4) * kShape.hidden * kShape.intermediate + 17] = 0x7fc0;  // NaN in expert 4's up
    expect_error([&] { MoeLayer(rt, config(), ref_of(bad)); }, ErrorKind::bad_file, "expert 4 up weight");
  }
  {
    std::vector<bf16> bias(static_cast<std::size_t>(kShape.num_experts) * kShape.hidden, float_to_bf16(0.25f));
    bias[static_cast<std::size_t>(2) * kShape.hidden + 5] = 0x7f80;  // +inf in expert 2's down bias
    ExpertWeightsRef ref = ref_of(w);
    ref.down_bias = bias.data();
    expect_error([&] { MoeLayer(rt, config(), ref); }, ErrorKind::bad_file, "expert 2 down bias");
  }
  expect_error([&] { MoeLayer(rt, with([](auto& c) { c.swiglu_alpha = 0; }), ref_of(w)); }, ErrorKind::invalid_argument, "swiglu_alpha 0");
  expect_error([&] { MoeLayer(rt, with([](auto& c) { c.swiglu_up_offset = INFINITY; }), ref_of(w)); }, ErrorKind::invalid_argument,
               "swiglu_up_offset inf");
  expect_error([&] { (void)MoeLayer::from_checkpoint(rt, test::data_dir() + "/nowhere", 1, checkpoint_options(4, "")); }, ErrorKind::bad_file, "nowhere");

  MoeLayer layer(rt, config(8, 1), ref_of(w));
  TrainerLora lora(32);
  Batch b = make_batch(8, 33);
  std::vector<float> out(b.x.size(), 7.0f), dx(b.x.size(), 7.0f);
  const auto* ids = b.routing.expert_ids.data();
  const auto* wts = b.routing.weights.data();
  expect_error([&] { layer.forward(9, 3, b.xb.data(), ids, wts, out.data()); }, ErrorKind::invalid_argument, "tokens 9");
  expect_error([&] { layer.forward(8, 4, b.xb.data(), ids, wts, out.data()); }, ErrorKind::invalid_argument, "top_k 4");
  expect_error([&] { layer.forward(8, 3, nullptr, ids, wts, out.data()); }, ErrorKind::invalid_argument, "null");
  std::vector<std::int64_t> bad_ids = b.routing.expert_ids;
  bad_ids[5] = kShape.num_experts;
  expect_error([&] { layer.forward_sft(8, 3, b.xb.data(), bad_ids.data(), wts, out.data(), true); }, ErrorKind::invalid_argument,
               "expert_ids[1][2] = 7");
  CHECK(layer.cached_forwards() == 0);
  for (float v : out) REQUIRE(v == 7.0f);
  expect_error([&] { layer.backward(b.grad_out.data(), dx.data(), LoraGrads{}); }, ErrorKind::state, "empty");
  expect_error([&] { layer.update_lora_weights(LoraWeights{lora.ga.data(), nullptr}); }, ErrorKind::invalid_argument, "B is null");
  expect_error([&] { layer.load_adapter(test::data_dir() + "/deepseek_tiny/adapter"); }, ErrorKind::invalid_argument,
               "index in the model");

  // Adapters cannot be swapped under a saved forward: its backward needs the set it used.
  layer.forward_sft(8, 3, b.xb.data(), ids, wts, out.data(), true);
  expect_error([&] { layer.forward_sft(8, 3, b.xb.data(), ids, wts, out.data(), true); }, ErrorKind::state, "full");
  expect_error([&] { layer.unload_adapter(); }, ErrorKind::state, "saved forward");
  {
    LoraGrads bad_type;
    bad_type.dtype = static_cast<LoraDType>(7);
    expect_error([&] { layer.backward(b.grad_out.data(), dx.data(), bad_type); }, ErrorKind::invalid_argument, "gate: unknown element type 7");
    CHECK(layer.cached_forwards() == 1);  // the saved forward is still there
    LoraWeights bad_set{lora.ga.data(), lora.gb.data()};
    bad_set.dtype = static_cast<LoraDType>(3);
    expect_error([&] { layer.update_lora_weights(bad_set); }, ErrorKind::invalid_argument, "unknown element type 3");
  }
  layer.backward(b.grad_out.data(), dx.data(), LoraGrads{});
  CHECK(layer.cached_forwards() == 0);

  MoeLayer inference(rt, config(8, 0), ref_of(w));
  CHECK(inference.cache_bytes() == 0);
  expect_error([&] { inference.forward_sft(8, 3, b.xb.data(), ids, wts, out.data(), true); }, ErrorKind::state, "max_cache_depth 0");
  inference.forward(8, 3, b.xb.data(), ids, wts, out.data());
  inference.forward(0, 3, nullptr, nullptr, nullptr, out.data());  // an empty batch is fine
}

TEST_CASE("int8, int4 and mxfp4 layers: quantized at construction, inference and training through them, split or not", "[api][quantized]") {
  ExpertWeights w = random_expert_weights(kShape, 41);
  TrainerLora lora(42);
  Runtime rt;
  for (auto [type, group] : {std::pair{WeightType::int8, 128}, {WeightType::int4, 32}, {WeightType::int4, 64}, {WeightType::mxfp4, 0}})
    for (int nodes : {1, 2}) {
      INFO(weight_type_name(type) << " group " << group << ", " << nodes << " node(s)");
      MoeLayerConfig cfg = config();
      cfg.weight_type = type;
      cfg.group_size = group;
      cfg.numa_nodes = nodes;
      MoeLayer layer(rt, cfg, ref_of(w));
      CHECK(layer.config().weight_type == type);
      layer.update_lora_weights(lora.weights());
      const auto q = quant::quantize_experts(w.view(), type, group, nullptr);
      const ExpertWeights dq = quant::dequantize_experts(q);
      Batch b = make_batch(13, 77);
      MoeBatch<float> mb{b.tokens, kShape.top_k, b.x.data(), b.routing.expert_ids.data(), b.routing.weights.data()};
      std::vector<float> want(b.x.size()), want_dx(b.x.size()), out(b.x.size()), dx(b.x.size());
      // Inference: the reference on the dequantized weights with the same int8 activations (one
      // node: each node quantizes its own slice of h, so the split is held to the looser bar below).
      reference_forward(w.view(), lora.as_reference, mb, want.data(), ReferenceOptions{is_integer_weight_type(type), &q});
      layer.forward(b.tokens, kShape.top_k, b.xb.data(), b.routing.expert_ids.data(), b.routing.weights.data(), out.data());
      CHECK(rel_error(out, want) <= (nodes == 1 ? 1e-2 : 3e-2));
      // Training (QLoRA): gradients through the dequantized weights.
      LayerLora want_grads = lora.as_reference.zeros_like();
      reference_backward(dq.view(), lora.as_reference, mb, b.grad_out.data(), want_dx.data(), &want_grads);
      GradBuffers g(lora);
      layer.forward_sft(b.tokens, kShape.top_k, b.xb.data(), b.routing.expert_ids.data(), b.routing.weights.data(), out.data(), true);
      layer.backward(b.grad_out.data(), dx.data(), g.grads());
      CHECK(rel_error(dx, want_dx) <= 2e-2);
      CHECK(rel_error(g.ga, want_grads[Projection::gate].a) <= 4e-2);
      CHECK(rel_error(g.db, want_grads[Projection::down].b) <= 4e-2);
    }
}

TEST_CASE("a layer from a quantized directory equals the same checkpoint quantized at load", "[api][quantized]") {
  const std::string model = test::data_dir() + "/deepseek_tiny/model";
  Checkpoint ck = Checkpoint::open(model);
  const int layer_index = 1;
  Runtime rt;
  for (auto [type, group] : {std::pair{WeightType::int8, 128}, {WeightType::int4, 64}, {WeightType::mxfp4, 32}}) {
    INFO(weight_type_name(type) << " group " << group);
    const std::string dir = test::temp_dir() + "/q_" + weight_type_name(type);
    {
      quant::QuantizedModelWriter writer(dir, quant::spec_for_checkpoint(ck, type, group, 1, {layer_index}));
      writer.write_layer(layer_index, quant::quantize_experts(ck.load_layer_experts(layer_index).view(), type, group, nullptr));
      writer.commit();
    }
    CheckpointLayerOptions o;
    o.max_tokens = 16;
    o.weight_type = type;
    o.group_size = group;
    MoeLayer at_load = MoeLayer::from_checkpoint(rt, model, layer_index, o);
    o.quantized_dir = dir;
    MoeLayer from_dir = MoeLayer::from_checkpoint(rt, model, layer_index, o);
    o.weight_type = WeightType::bf16;  // not given: the directory's type
    MoeLayer from_dir_any = MoeLayer::from_checkpoint(rt, model, layer_index, o);
    CHECK(from_dir_any.config().weight_type == type);
    CHECK(from_dir.weight_bytes() == at_load.weight_bytes());
    const MoeShape s = ck.config().shape;
    auto routing = random_routing(9, s, 5);
    auto x = random_activations(static_cast<std::size_t>(9) * s.hidden, 6);
    auto xb = to_bf16(x.data(), x.size());
    std::vector<float> a(x.size()), b(x.size()), c(x.size());
    at_load.forward(9, s.top_k, xb.data(), routing.expert_ids.data(), routing.weights.data(), a.data());
    from_dir.forward(9, s.top_k, xb.data(), routing.expert_ids.data(), routing.weights.data(), b.data());
    from_dir_any.forward(9, s.top_k, xb.data(), routing.expert_ids.data(), routing.weights.data(), c.data());
    CHECK(a == b);
    CHECK(a == c);
    // Asking for another type than the directory holds, or another layer than it has.
    o.weight_type = type == WeightType::int8 ? WeightType::int4 : WeightType::int8;
    expect_error([&] { MoeLayer::from_checkpoint(rt, model, layer_index, o); }, ErrorKind::invalid_argument, dir);
    o.weight_type = type;
    expect_error([&] { MoeLayer::from_checkpoint(rt, model, 2, o); }, ErrorKind::invalid_argument, "layer");
  }
}
