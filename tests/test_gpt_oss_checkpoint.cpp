// gpt-oss checkpoints as transformers writes them (experts stacked as x W, gate and up interleaved,
// with biases; the router's bias added to its logits) and as the hub ships them (the experts in
// MXFP4: *_blocks and *_scales), made here from known weights: the loaded experts must be those
// weights exactly, the MXFP4 ones a straightforward dequantization exactly, the router as
// GptOssTopKRouter computes, a layer from the checkpoint the reference on those weights; malformed
// tensors are refused naming the file, layer and tensor. A PEFT adapter on gpt-oss's stacked
// tensors (target_parameters; gate's and up's rows of B interleaved) is read, its gradients
// written back, exported and converted in PEFT's layout.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "adapter_compare.hpp"
#include "catch.hpp"
#include "src/io/safetensors_writer.hpp"
#include "src/lora/lora_file.hpp"
#include "src/lora/peft_adapter.hpp"
#include "src/lora/peft_export.hpp"
#include "src/layer/moe_compute.hpp"
#include "src/layer/synthetic_layer.hpp"
#include "src/model/checkpoint.hpp"
#include "src/quant/mxfp4_checkpoint.hpp"
#include "src/quant/quantized_file.hpp"
#include "src/reference/moe_reference.hpp"
#include "src/routing/router.hpp"
#include "test_util.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/moe_layer.hpp"

using namespace tilemoe;
namespace fs = std::filesystem;
using test::error_of;

namespace {

constexpr int kH = 64, kI = 96, kE = 4, kK = 2, kLayers = 2;

MoeShape gpt_oss_shape() { return {kH, kI, kE, kK, 7.0f, 1.702f, 1.0f}; }

void write_config(const std::string& dir, const std::string& extra = "") {
  std::ofstream(dir + "/config.json") << R"({"model_type":"gpt_oss","hidden_size":64,"intermediate_size":96,"num_local_experts":4,
    "num_experts_per_tok":2,"num_hidden_layers":2,"swiglu_limit":7.0,"hidden_act":"silu")" << extra << "}";
}

struct Tensors {
  io::SafetensorsWriter w;
  std::vector<std::vector<bf16>> keep;
  std::vector<std::vector<std::uint8_t>> keep_u8;
  void add(const std::string& name, std::vector<std::int64_t> shape, std::vector<bf16> v) {
    keep.push_back(std::move(v));
    w.add(name, io::Dtype::BF16, std::move(shape), keep.back().data());
  }
  void add_u8(const std::string& name, std::vector<std::int64_t> shape, std::vector<std::uint8_t> v) {
    keep_u8.push_back(std::move(v));
    w.add(name, io::Dtype::U8, std::move(shape), keep_u8.back().data());
  }
};

// The router of each layer: weight [E][H] and bias [E], bf16.
void add_router(Tensors& t, int layer, std::mt19937& rng) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<bf16> weight(kE * kH), bias(kE);
  for (auto& v : weight) v = float_to_bf16(n(rng) * 0.2f);
  for (auto& v : bias) v = float_to_bf16(n(rng));
  const std::string p = "model.layers." + std::to_string(layer) + ".mlp.router.";
  t.add(p + "weight", {kE, kH}, weight);
  t.add(p + "bias", {kE}, bias);
}

// `w`'s experts as transformers saves gpt-oss: gate_up_proj [E][H][2I] (gate in the even columns),
// down_proj [E][I][H], gate_up_proj_bias [E][2I], down_proj_bias [E][H].
void add_bf16_experts(Tensors& t, int layer, const ExpertWeights& w, bool biases = true) {
  std::vector<bf16> gu(static_cast<std::size_t>(kE) * kH * 2 * kI), down(static_cast<std::size_t>(kE) * kI * kH), gub(kE * 2 * kI);
  for (int e = 0; e < kE; ++e)
    for (int i = 0; i < kI; ++i)
      for (int h = 0; h < kH; ++h) {
        const std::size_t src = (static_cast<std::size_t>(e) * kI + i) * kH + h;
        gu[(static_cast<std::size_t>(e) * kH + h) * 2 * kI + 2 * i] = w.gate[src];
        gu[(static_cast<std::size_t>(e) * kH + h) * 2 * kI + 2 * i + 1] = w.up[src];
        down[(static_cast<std::size_t>(e) * kI + i) * kH + h] = w.down[(static_cast<std::size_t>(e) * kH + h) * kI + i];
      }
  for (int e = 0; e < kE; ++e)
    for (int i = 0; i < kI; ++i) {
      gub[e * 2 * kI + 2 * i] = w.gate_bias[e * kI + i];
      gub[e * 2 * kI + 2 * i + 1] = w.up_bias[e * kI + i];
    }
  const std::string p = "model.layers." + std::to_string(layer) + ".mlp.experts.";
  t.add(p + "gate_up_proj", {kE, kH, 2 * kI}, gu);
  t.add(p + "down_proj", {kE, kI, kH}, down);
  if (!biases) return;
  t.add(p + "gate_up_proj_bias", {kE, 2 * kI}, gub);
  t.add(p + "down_proj_bias", {kE, kH}, w.down_bias);
}

std::string fresh_dir(const std::string& name) {
  const std::string d = test::temp_dir() + "/" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string bf16_checkpoint(const ExpertWeights& w) {
  const std::string d = fresh_dir("gpt_oss_bf16");
  write_config(d);
  Tensors t;
  std::mt19937 rng(3);
  for (int l = 0; l < kLayers; ++l) {
    add_bf16_experts(t, l, w);
    add_router(t, l, rng);
  }
  t.w.write(d + "/model.safetensors");
  return d;
}

// The straightforward dequantization: value = E2M1(code) * 2^(scale - 127), codes low nibble first.
float e2m1(int code) {
  const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  return (code & 8) ? -mag[code & 7] : mag[code & 7];
}

}  // namespace

TEST_CASE("a gpt-oss config.json reads as its SwiGLU form, every layer MoE", "[config][gpt_oss]") {
  const ModelConfig c = parse_model_config(R"({"model_type":"gpt_oss","hidden_size":2880,"intermediate_size":2880,
    "num_local_experts":128,"num_experts_per_tok":4,"num_hidden_layers":36,"swiglu_limit":7.0,
    "quantization_config":{"quant_method":"mxfp4"}})", "oss");
  CHECK(c.shape.hidden == 2880);
  CHECK(c.shape.intermediate == 2880);
  CHECK(c.shape.num_experts == 128);
  CHECK(c.shape.top_k == 4);
  CHECK(c.shape.swiglu_limit == 7.0f);
  CHECK(c.shape.swiglu_alpha == 1.702f);
  CHECK(c.shape.swiglu_up_offset == 1.0f);
  CHECK(c.gpt_oss_layout);
  CHECK(c.norm_topk_prob);
  CHECK(c.moe_layers.size() == 36);
  CHECK(c.routing_unsupported.empty());
  CHECK(c.quant_method == "mxfp4");
  // GptOssConfig's default limit where config.json has none.
  CHECK(parse_model_config(R"({"model_type":"gpt_oss","hidden_size":8,"intermediate_size":8,"num_local_experts":2,
    "num_experts_per_tok":1,"num_hidden_layers":1})", "oss").shape.swiglu_limit == 7.0f);
}

TEST_CASE("gpt-oss experts stored as x W with interleaved gate and up load as the weights they were", "[checkpoint][gpt_oss]") {
  const ExpertWeights w = random_expert_weights(gpt_oss_shape(), 5);
  REQUIRE(!w.gate_bias.empty());
  const std::string dir = bf16_checkpoint(w);
  const Checkpoint ck = Checkpoint::open(dir);
  for (int l = 0; l < kLayers; ++l) {
    const ExpertWeights got = ck.load_layer_experts(l);
    CHECK(got.gate == w.gate);
    CHECK(got.up == w.up);
    CHECK(got.down == w.down);
    CHECK(got.gate_bias == w.gate_bias);
    CHECK(got.up_bias == w.up_bias);
    CHECK(got.down_bias == w.down_bias);
    CHECK(got.shape.swiglu_alpha == 1.702f);
  }

  // The router: softmax over the top-k of x Wᵀ + bias (GptOssTopKRouter).
  const RouterWeights r = ck.load_router(1);
  REQUIRE(r.logit_bias.size() == static_cast<std::size_t>(kE));
  const int T = 9;
  const std::vector<float> xf = random_activations(static_cast<std::size_t>(T) * kH, 8, 2.0f);
  const std::vector<bf16> x = to_bf16(xf.data(), xf.size());
  const Routing routed = route_tokens(ck.config(), r, 1, x.data(), T);
  for (int t = 0; t < T; ++t) {
    std::vector<double> logits(kE);
    for (int e = 0; e < kE; ++e) {
      double acc = r.logit_bias[e];
      for (int h = 0; h < kH; ++h) acc += static_cast<double>(bf16_to_float(x[t * kH + h])) * r.weight[e * kH + h];
      logits[e] = acc;
    }
    std::vector<int> order(kE);
    for (int e = 0; e < kE; ++e) order[e] = e;
    std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
    const double m = logits[order[0]];
    double sum = 0;
    for (int j = 0; j < kK; ++j) sum += std::exp(logits[order[j]] - m);
    for (int j = 0; j < kK; ++j) {
      CHECK(routed.expert_ids[t * kK + j] == order[j]);
      CHECK(routed.weights[t * kK + j] == Approx(std::exp(logits[order[j]] - m) / sum).epsilon(1e-5));
    }
  }

  // A layer from the checkpoint computes the reference on those weights, biases and form included.
  Runtime rt;
  CheckpointLayerOptions opt;
  opt.max_tokens = T;
  MoeLayer layer = MoeLayer::from_checkpoint(rt, dir, 0, opt);
  CHECK(layer.config().swiglu_alpha == Approx(1.702));
  CHECK(layer.config().swiglu_up_offset == 1.0);
  CHECK(layer.config().swiglu_limit == 7.0);
  const RandomRouting rr = random_routing(T, w.shape, 11);
  std::vector<float> want(xf.size()), got(xf.size()), xr(xf.size());
  for (std::size_t i = 0; i < xf.size(); ++i) xr[i] = bf16_to_float(x[i]);
  MoeBatch<float> b{T, kK, xr.data(), rr.expert_ids.data(), rr.weights.data()};
  reference_forward(w.view(), LayerLora{}, b, want.data());
  layer.forward(T, kK, x.data(), rr.expert_ids.data(), rr.weights.data(), got.data());
  CHECK(test::rel_error(got, want) <= 1e-2);
}

TEST_CASE("gpt-oss experts in MXFP4, as the hub ships them, load as their dequantization", "[checkpoint][gpt_oss][mxfp4]") {
  const std::string dir = fresh_dir("gpt_oss_mxfp4");
  write_config(dir, R"(,"quantization_config":{"quant_method":"mxfp4"})");
  std::mt19937 rng(9);
  std::uniform_int_distribution<int> byte(0, 255), exponent(118, 130);
  Tensors t;
  // gate_up: [E, 2I, H/32, 16] blocks, [E, 2I, H/32] scales; down: [E, H, I/32, 16], [E, H, I/32].
  auto make = [&](int rows, int cols, std::vector<std::uint8_t>& blocks, std::vector<std::uint8_t>& scales) {
    blocks.resize(static_cast<std::size_t>(kE) * rows * cols / 2);
    scales.resize(static_cast<std::size_t>(kE) * rows * cols / 32);
    for (auto& v : blocks) v = static_cast<std::uint8_t>(byte(rng));
    for (auto& v : scales) v = static_cast<std::uint8_t>(exponent(rng));
  };
  auto value = [](const std::vector<std::uint8_t>& blocks, const std::vector<std::uint8_t>& scales, std::size_t row, int cols, int k) {
    const std::uint8_t b = blocks[row * cols / 2 + k / 2];
    const int code = (k % 2 == 0) ? (b & 0x0f) : (b >> 4);
    return e2m1(code) * std::pow(2.0f, static_cast<float>(scales[row * cols / 32 + k / 32]) - 127.0f);
  };
  std::vector<std::uint8_t> gub, gus, db, ds;
  make(2 * kI, kH, gub, gus);
  make(kH, kI, db, ds);
  // Groups of zeros whose exponents lie outside what the kernels multiply exactly (0 and 253):
  // their values are zeros all the same.
  gus[0] = 0;
  std::fill(gub.begin(), gub.begin() + 16, std::uint8_t{0});
  ds[3] = 253;
  std::fill(db.begin() + 3 * 16, db.begin() + 4 * 16, std::uint8_t{0x88});  // -0
  ExpertWeights biases = random_expert_weights(gpt_oss_shape(), 6);
  const std::string p = "model.layers.0.mlp.experts.";
  t.add_u8(p + "gate_up_proj_blocks", {kE, 2 * kI, kH / 32, 16}, gub);
  t.add_u8(p + "gate_up_proj_scales", {kE, 2 * kI, kH / 32}, gus);
  t.add_u8(p + "down_proj_blocks", {kE, kH, kI / 32, 16}, db);
  t.add_u8(p + "down_proj_scales", {kE, kH, kI / 32}, ds);
  std::vector<bf16> gu_bias(kE * 2 * kI);
  for (auto& v : gu_bias) v = float_to_bf16(0.25f);
  t.add(p + "gate_up_proj_bias", {kE, 2 * kI}, gu_bias);
  t.add(p + "down_proj_bias", {kE, kH}, biases.down_bias);
  add_router(t, 0, rng);
  // Layer 1 as bf16 x W, beside: a checkpoint may mix the forms.
  add_bf16_experts(t, 1, biases);
  add_router(t, 1, rng);
  t.w.write(dir + "/model.safetensors");

  const Checkpoint ck = Checkpoint::open(dir);
  const ExpertWeights got = ck.load_layer_experts(0);
  std::size_t checked = 0, nonzero = 0;
  for (int e = 0; e < kE; ++e) {
    for (int i = 0; i < kI; ++i)
      for (int h = 0; h < kH; ++h) {
        const std::size_t at = (static_cast<std::size_t>(e) * kI + i) * kH + h;
        REQUIRE(bf16_to_float(got.gate[at]) == value(gub, gus, static_cast<std::size_t>(e) * 2 * kI + 2 * i, kH, h));
        REQUIRE(bf16_to_float(got.up[at]) == value(gub, gus, static_cast<std::size_t>(e) * 2 * kI + 2 * i + 1, kH, h));
        nonzero += got.gate[at] != 0;
        checked += 2;
      }
    for (int h = 0; h < kH; ++h)
      for (int i = 0; i < kI; ++i)
        REQUIRE(bf16_to_float(got.down[(static_cast<std::size_t>(e) * kH + h) * kI + i]) ==
                value(db, ds, static_cast<std::size_t>(e) * kH + h, kI, i));
  }
  CHECK(checked == static_cast<std::size_t>(2) * kE * kI * kH);
  CHECK(nonzero > checked / 4);
  CHECK(bf16_to_float(got.gate_bias[5]) == 0.25f);
  CHECK(got.down_bias == biases.down_bias);
  CHECK(ck.load_layer_experts(1).gate == biases.gate);
  // As mxfp4 weights the experts stay exactly the checkpoint's: each group's values come back.
  const quant::QuantizedExperts mx = quant::quantize_experts(got.view(), WeightType::mxfp4, 0, nullptr);
  const ExpertWeights back = quant::dequantize_experts(mx);
  CHECK(back.gate == got.gate);
  CHECK(back.up == got.up);
  CHECK(back.down == got.down);
  // Read as stored (no bf16 copy): the same values, the codes byte for byte, the biases.
  quant::QuantizedExperts native;
  REQUIRE(quant::read_mxfp4_layer(ck, 0, native));
  CHECK(native.type == WeightType::mxfp4);
  CHECK(native[Projection::down].codes_of(1)[0] == static_cast<std::int8_t>(db[static_cast<std::size_t>(kH) * kI / 2]));
  const ExpertWeights native_values = quant::dequantize_experts(native);
  CHECK(native_values.gate == got.gate);
  CHECK(native_values.up == got.up);
  CHECK(native_values.down == got.down);
  CHECK(native.biases.down == ExpertBiases::of_view(got.view()).down);
  CHECK(native.biases.gate == ExpertBiases::of_view(got.view()).gate);
  quant::QuantizedExperts not_mxfp4;
  CHECK_FALSE(quant::read_mxfp4_layer(ck, 1, not_mxfp4));  // layer 1 is bf16 x W
  {
    // A layer in mxfp4 from the checkpoint computes as the bf16 layer of the same values: up to
    // f32 rounding at 64 tokens (32 rows an expert), and within a step of h's bf16 rounding at 3
    // (decode rows, whose activations the AVX-512 rows kernel may round: amx/gemm_mxfp4.hpp).
    Runtime rt;
    CheckpointLayerOptions o;
    o.max_tokens = 64;
    MoeLayer bf = MoeLayer::from_checkpoint(rt, dir, 0, o);
    o.weight_type = WeightType::mxfp4;
    MoeLayer mxl = MoeLayer::from_checkpoint(rt, dir, 0, o);
    CHECK(mxl.config().weight_type == WeightType::mxfp4);
    CHECK(mxl.weight_bytes() * 3 < bf.weight_bytes());
    for (int tokens : {64, 3}) {
      INFO(tokens << " tokens");
      const RandomRouting routing = random_routing(tokens, gpt_oss_shape(), 4);
      const std::vector<float> x = random_activations(static_cast<std::size_t>(tokens) * kH, 5);
      const std::vector<bf16> xb = to_bf16(x.data(), x.size());
      std::vector<float> a(x.size()), b(x.size());
      bf.forward(tokens, kK, xb.data(), routing.expert_ids.data(), routing.weights.data(), a.data());
      mxl.forward(tokens, kK, xb.data(), routing.expert_ids.data(), routing.weights.data(), b.data());
      CHECK(test::rel_error(b, a) <= (tokens == 64 ? 1e-5 : 2e-3));
    }
  }
  {
    // A group with values whose exponent is outside that range: not taken as stored (the caller
    // quantizes the bf16 experts instead).
    const std::string tiny = fresh_dir("gpt_oss_mxfp4_tiny");
    write_config(tiny, R"(,"quantization_config":{"quant_method":"mxfp4"})");
    Tensors u;
    std::vector<std::uint8_t> low = ds;
    low[5] = 1;
    db[5 * 16] = 0x11;
    u.add_u8(p + "gate_up_proj_blocks", {kE, 2 * kI, kH / 32, 16}, gub);
    u.add_u8(p + "gate_up_proj_scales", {kE, 2 * kI, kH / 32}, gus);
    u.add_u8(p + "down_proj_blocks", {kE, kH, kI / 32, 16}, db);
    u.add_u8(p + "down_proj_scales", {kE, kH, kI / 32}, low);
    u.add(p + "gate_up_proj_bias", {kE, 2 * kI}, gu_bias);
    u.add(p + "down_proj_bias", {kE, kH}, biases.down_bias);
    add_bf16_experts(u, 1, biases);
    u.w.write(tiny + "/model.safetensors");
    quant::QuantizedExperts refused;
    CHECK_FALSE(quant::read_mxfp4_layer(Checkpoint::open(tiny), 0, refused));
  }
  const auto refs = ck.expert_tensors(0);
  CHECK(refs[0][1].bytes == static_cast<std::size_t>(kI) * kH / 2 + static_cast<std::size_t>(kI) * kH / 32);
  // `tilemoe quantize` names the MXFP4 layer's experts as the bf16 one's (one naming throughout).
  const quant::QuantizedModelSpec spec = quant::spec_for_checkpoint(ck, WeightType::int4, 32, 1, {0, 1});
  CHECK(spec.name_templates[0].find("gate_up_proj") == std::string::npos);
  CHECK(spec.name_templates[0].find("_blocks") == std::string::npos);
}

TEST_CASE("malformed gpt-oss checkpoints are refused naming the file, layer and tensor", "[checkpoint][gpt_oss][errors]") {
  const ExpertWeights w = random_expert_weights(gpt_oss_shape(), 7);
  std::mt19937 rng(4);
  {  // no biases
    const std::string d = fresh_dir("gpt_oss_no_bias");
    write_config(d);
    Tensors t;
    for (int l = 0; l < kLayers; ++l) add_bf16_experts(t, l, w, /*biases=*/false), add_router(t, l, rng);
    t.w.write(d + "/model.safetensors");
    const std::string err = error_of([&] { (void)Checkpoint::open(d).load_layer_experts(1); });
    CHECK(err.find("layer 1 experts: gpt-oss's gate_up_proj_bias is missing") != std::string::npos);
  }
  {  // gate_up stored as W x ([E, 2I, H]), not gpt-oss's x W
    const std::string d = fresh_dir("gpt_oss_w_x");
    write_config(d);
    Tensors t;
    t.add("model.layers.0.mlp.experts.gate_up_proj", {kE, 2 * kI, kH}, std::vector<bf16>(static_cast<std::size_t>(kE) * 2 * kI * kH));
    t.w.write(d + "/model.safetensors");
    const std::string err = error_of([&] { (void)Checkpoint::open(d).expert_tensors(0); });
    CHECK(err.find("model.safetensors: layer 0 experts: 'model.layers.0.mlp.experts.gate_up_proj' has shape [4, 192, 64], expected [4, 64, 192]") !=
          std::string::npos);
  }
  {  // MXFP4 blocks without their scales, and scales of the wrong shape
    const std::string d = fresh_dir("gpt_oss_no_scales");
    write_config(d);
    Tensors t;
    t.add_u8("model.layers.0.mlp.experts.down_proj_blocks", {kE, kH, kI / 32, 16}, std::vector<std::uint8_t>(kE * kH * kI / 2));
    t.add_u8("model.layers.1.mlp.experts.down_proj_blocks", {kE, kH, kI / 32, 16}, std::vector<std::uint8_t>(kE * kH * kI / 2));
    t.add_u8("model.layers.1.mlp.experts.down_proj_scales", {kE, kH, kI / 16}, std::vector<std::uint8_t>(kE * kH * kI / 16));
    t.w.write(d + "/model.safetensors");
    const Checkpoint ck = Checkpoint::open(d);
    CHECK(error_of([&] { (void)ck.expert_tensors(0); })
              .find("'model.layers.0.mlp.experts.down_proj_blocks' is MXFP4 blocks but 'model.layers.0.mlp.experts.down_proj_scales' is missing") !=
          std::string::npos);
    CHECK(error_of([&] { (void)ck.expert_tensors(1); }).find("'model.layers.1.mlp.experts.down_proj_scales' is U8 [4, 64, 6], expected U8 [4, 64, 3]") !=
          std::string::npos);
  }
  {  // a non-finite bias names the file, layer and tensor
    ExpertWeights bad = w;
    bad.down_bias[7] = 0x7fc0;
    const std::string d = bf16_checkpoint(bad);
    const std::string err = error_of([&] { (void)Checkpoint::open(d).load_layer_experts(0); });
    CHECK(err.find("layer 0 experts' down bias ('model.layers.0.mlp.experts.down_proj_bias')") != std::string::npos);
  }
}

TEST_CASE("a PEFT adapter on gpt-oss's stacked experts: B's rows interleaved as gate_up_proj's", "[peft][gpt_oss][stacked]") {
  const ExpertWeights w = random_expert_weights(gpt_oss_shape(), 12);
  const std::string model = bf16_checkpoint(w);
  const ModelConfig config = Checkpoint::open(model).config();
  constexpr int kR = 3;
  // What PEFT writes for target_parameters ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"] on
  // GptOssExperts (is_transposed: in = the parameter's dimension 1): A [r*E, in], B [out, r*E].
  std::mt19937 rng(21);
  std::normal_distribution<float> n(0.0f, 0.3f);
  auto values = [&](std::size_t count) {
    std::vector<float> v(count);
    for (auto& x : v) x = bf16_to_float(float_to_bf16(n(rng)));
    return v;
  };
  const std::vector<float> gua = values(kR * kE * kH), gub = values(2 * kI * kR * kE), da = values(kR * kE * kI), db = values(kH * kR * kE);
  const std::string dir = fresh_dir("gpt_oss_adapter");
  std::ofstream(dir + "/adapter_config.json") << R"({"peft_type": "LORA", "r": 3, "lora_alpha": 6, "target_modules": [],
      "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]})";
  const std::string prefix = "base_model.model.model.layers.0.mlp.experts.";
  {
    io::SafetensorsWriter aw;
    aw.add_f32(prefix + "base_layer.lora_A.weight", {kR * kE, kH}, gua);
    aw.add_f32(prefix + "base_layer.lora_B.weight", {2 * kI, kR * kE}, gub);
    aw.add_f32(prefix + "lora_A.weight", {kR * kE, kI}, da);
    aw.add_f32(prefix + "lora_B.weight", {kH, kR * kE}, db);
    aw.write(dir + "/adapter_model.safetensors");
  }
  const PeftAdapter adapter = PeftAdapter::open(dir, config);
  LoadedLora loaded = load_peft_layer(adapter, config.shape, 0);
  // PEFT's delta of gate_up_proj [E, in, out] is s * sum_j A[e*r + j][i] * B[o][j*E + e]; gate is its even
  // outputs, up its odd ones.
  for (int e = 0; e < kE; ++e)
    for (int i = 0; i < kI; i += 7)
      for (int h = 0; h < kH; h += 5)
        for (int up = 0; up < 2; ++up) {
          double want = 0, got = 0;
          const auto& proj = loaded.lora[up ? Projection::up : Projection::gate];
          for (int j = 0; j < kR; ++j) {
            want += static_cast<double>(gua[(e * kR + j) * kH + h]) * gub[(2 * i + up) * kR * kE + j * kE + e];
            got += static_cast<double>(proj.a_of(e)[j * kH + h]) * proj.b_of(e)[i * kR + j];
          }
          REQUIRE(got * proj.scale[e] == Approx(2.0 * want).margin(1e-6));
        }
  CHECK(loaded.stacked[0].row_step == 2);
  CHECK(loaded.stacked[1].first_row == 1);
  CHECK(loaded.stacked[2].row_step == 1);

  // Gradients land on B's interleaved rows; export gives the adapter back bit for bit.
  LayerLora grads = loaded.lora.zeros_like();
  for (Projection p : kProjections)
    for (std::size_t i = 0; i < grads[p].b.size(); ++i) grads[p].b[i] = static_cast<float>(i % 97) + 100.0f * static_cast<float>(p);
  for (const auto& g : stacked_lora_grads(loaded, grads)) {
    if (g.key != prefix + "base_layer.lora_B.weight") continue;
    CHECK(g.values[(2 * 5 + 1) * kR * kE + 2 * kE + 3] == grads[Projection::up].b_of(3)[5 * kR + 2]);
    CHECK(g.values[(2 * 5) * kR * kE + 2 * kE + 3] == grads[Projection::gate].b_of(3)[5 * kR + 2]);
  }
  const std::string out = test::temp_dir() + "/gpt_oss_adapter_exported";
  PeftExportOptions opt;
  opt.extras = peft_extras(adapter);
  write_peft_adapter(out, adapter.config(), {{0, &loaded}}, opt);
  test::check_same_adapter(dir, out);
  // convert-lora's file keeps the interleaving (row_step in its metadata) and exports back the same.
  const std::string converted = test::temp_dir() + "/gpt_oss_adapter.tilemoe-lora";
  convert_peft_to_lora_file(adapter, config, converted);
  const LoadedLora again = load_converted_layer(converted, config, 0);
  CHECK(again.stacked[1].row_step == 2);
  CHECK(again.lora[Projection::up].b == loaded.lora[Projection::up].b);
  const std::string out2 = test::temp_dir() + "/gpt_oss_adapter_exported2";
  export_lora_file(converted, out2);
  test::check_same_adapter(dir, out2);

  // A layer from the checkpoint with the adapter: the reference on the weights and that LoRA.
  Runtime rt;
  CheckpointLayerOptions o;
  o.max_tokens = 16;
  o.adapter = dir;
  MoeLayer layer = MoeLayer::from_checkpoint(rt, model, 0, o);
  CHECK(layer.adapter_stacked_keys()[1].row_step == 2);
  const int T = 16;
  const std::vector<float> xf = random_activations(static_cast<std::size_t>(T) * kH, 31, 2.0f);
  const std::vector<bf16> x = to_bf16(xf.data(), xf.size());
  std::vector<float> xr(xf.size()), want(xf.size()), got(xf.size());
  for (std::size_t i = 0; i < xf.size(); ++i) xr[i] = bf16_to_float(x[i]);
  const RandomRouting rr = random_routing(T, w.shape, 32);
  MoeBatch<float> b{T, kK, xr.data(), rr.expert_ids.data(), rr.weights.data()};
  reference_forward(w.view(), loaded.lora, b, want.data());
  layer.forward(T, kK, x.data(), rr.expert_ids.data(), rr.weights.data(), got.data());
  CHECK(test::rel_error(got, want) <= 1e-2);
}

TEST_CASE("a gpt-oss layer from a quantized directory takes its biases from the checkpoint", "[api][gpt_oss][quantized]") {
  const ExpertWeights w = random_expert_weights(gpt_oss_shape(), 14);
  const std::string model = bf16_checkpoint(w);
  const Checkpoint ck = Checkpoint::open(model);
  const std::string dir = test::temp_dir() + "/gpt_oss_int8";
  {
    quant::QuantizedModelWriter writer(dir, quant::spec_for_checkpoint(ck, WeightType::int8, 128, 1, {1}));
    writer.write_layer(1, quant::quantize_experts(ck.load_layer_experts(1).view(), WeightType::int8, 128, nullptr));
    writer.commit();
  }
  Runtime rt;
  CheckpointLayerOptions o;
  o.max_tokens = 12;
  o.weight_type = WeightType::int8;
  MoeLayer at_load = MoeLayer::from_checkpoint(rt, model, 1, o);
  o.quantized_dir = dir;
  MoeLayer from_dir = MoeLayer::from_checkpoint(rt, model, 1, o);
  const int T = 12;
  const RandomRouting rr = random_routing(T, w.shape, 15);
  const std::vector<float> xf = random_activations(static_cast<std::size_t>(T) * kH, 16, 2.0f);
  const std::vector<bf16> x = to_bf16(xf.data(), xf.size());
  std::vector<float> a(xf.size()), b(xf.size()), want(xf.size());
  at_load.forward(T, kK, x.data(), rr.expert_ids.data(), rr.weights.data(), a.data());
  from_dir.forward(T, kK, x.data(), rr.expert_ids.data(), rr.weights.data(), b.data());
  CHECK(a == b);
  std::vector<float> xr(xf.size());
  for (std::size_t i = 0; i < xf.size(); ++i) xr[i] = bf16_to_float(x[i]);
  MoeBatch<float> batch{T, kK, xr.data(), rr.expert_ids.data(), rr.weights.data()};
  reference_forward(w.view(), LayerLora{}, batch, want.data());
  CHECK(test::rel_error(b, want) <= 5e-2);  // int8's error on top; without the biases it would be far off
  ExpertWeights no_bias = w;
  no_bias.gate_bias.clear(), no_bias.up_bias.clear(), no_bias.down_bias.clear();
  std::vector<float> plain(xf.size());
  reference_forward(no_bias.view(), LayerLora{}, batch, plain.data());
  CHECK(test::rel_error(plain, want) > 0.2);
}
