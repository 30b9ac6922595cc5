// save_peft_adapter (include/tilemoe/peft_save.hpp): the LoRA layers use, written as a PEFT
// adapter directory, under the held adapter's keys, the checkpoint's module names or the given
// ones; loaded back, it is the same LoRA (values, ranks, scales, coverage) and the same forward.
// Bad arguments are refused naming the layer, and nothing is written then.
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "adapter_compare.hpp"
#include "catch.hpp"
#include "expect_error.hpp"
#include "fixture_cases.hpp"
#include "src/io/safetensors.hpp"
#include "src/io/safetensors_writer.hpp"
#include "src/layer/synthetic_layer.hpp"
#include "src/lora/lora_file.hpp"
#include "src/lora/peft_adapter.hpp"
#include "src/model/checkpoint.hpp"
#include "test_util.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/moe_layer.hpp"
#include "tilemoe/peft_save.hpp"

using namespace tilemoe;
namespace fs = std::filesystem;
using test::error_of;

namespace {

// Nothing a multiple of 16.
const MoeShape kShape{40, 27, 5, 2};
constexpr int kRank = 3;

MoeLayerConfig config() {
  MoeLayerConfig c;
  c.num_experts = kShape.num_experts;
  c.top_k = kShape.top_k;
  c.hidden = kShape.hidden;
  c.intermediate = kShape.intermediate;
  c.max_tokens = 16;
  c.lora_rank = kRank;
  c.lora_alpha = 6.0;
  return c;
}

ExpertWeightsRef ref_of(const ExpertWeights& w) { return {w.gate.data(), w.up.data(), w.down.data()}; }

std::string out_dir(const std::string& name) {
  const std::string d = test::temp_dir() + "/peft_save_" + name;
  fs::remove_all(d);
  return d;
}

nlohmann::json config_of(const std::string& dir) { return nlohmann::json::parse(test::file_text(dir + "/adapter_config.json")); }

// The layer's forward of a fixed random batch, in f32.
std::vector<float> forward_of(MoeLayer& layer, const MoeShape& shape, int tokens = 9) {
  const RandomRouting r = random_routing(tokens, shape, 77);
  const std::vector<float> x = random_activations(static_cast<std::size_t>(tokens) * shape.hidden, 78);
  std::vector<bf16> xb(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) xb[i] = float_to_bf16(x[i]);
  std::vector<float> out(x.size());
  layer.forward(tokens, shape.top_k, xb.data(), r.expert_ids.data(), r.weights.data(), out.data());
  return out;
}

// A LayerLora's arrays as the caller's set (f32), with its scales and coverage.
LayerLoraView view_of(const LayerLora& l) {
  LayerLoraView v;
  for (int i = 0; i < 3; ++i) {
    const auto& p = l.proj[i];
    v.proj[i] = {p.rank, p.in, p.out, p.a.data(), p.b.data(), LoraDType::f32, p.scale.data(), 1.0f, p.present.data(), {}};
  }
  return v;
}

}  // namespace

TEST_CASE("fixture adapters saved from the layers holding them load back as the same LoRA", "[api][save][fixtures]") {
  Runtime rt({"portable", 1});
  for (const auto& c : test::fixture_cases()) {
    SECTION(c.name) {
      const std::string adapter = c.dir + "/adapter";
      const ModelConfig model = Checkpoint::open(c.dir + "/model").config();
      std::vector<MoeLayer> layers;
      std::vector<PeftSaveLayer> list;
      for (int l : c.layers) {
        CheckpointLayerOptions o;
        o.max_tokens = 16;
        o.adapter = adapter;
        o.adapter_storage = AdapterStorage::f32;
        layers.push_back(MoeLayer::from_checkpoint(rt, c.dir + "/model", l, o));
      }
      for (auto& l : layers) list.push_back({&l, -1});
      const std::string out = out_dir(c.name);
      PeftSaveOptions f32;
      f32.dtype = PeftSaveDtype::f32;
      const PeftSaveStats st = save_peft_adapter(out, list, f32);
      CHECK(st.layers == static_cast<int>(c.layers.size()));
      CHECK(st.tensors == PeftAdapter::open(adapter, model).expert_keys());
      // Values, each expert's rank and scale, coverage and key names; F32 as asked.
      for (int l : c.layers) {
        INFO("layer " << l);
        const LoadedLora want = load_layer_lora(adapter, model, l), got = load_layer_lora(out, model, l);
        for (Projection p : kProjections) {
          INFO(projection_name(p));
          CHECK(got.lora[p].rank == want.lora[p].rank);
          CHECK(got.lora[p].a == want.lora[p].a);
          CHECK(got.lora[p].b == want.lora[p].b);
          CHECK(got.lora[p].scale == want.lora[p].scale);
          CHECK(got.lora[p].present == want.lora[p].present);
          CHECK(got.lora[p].expert_rank == want.lora[p].expert_rank);
          CHECK(got.key_template_a == want.key_template_a);
          CHECK(got.key_template_b == want.key_template_b);
        }
      }
      // Held from a convert-lora file: the keys and adapter_config.json its metadata keeps.
      const std::string converted = test::temp_dir() + "/peft_save_" + c.name + ".lora";
      convert_peft_to_lora_file(PeftAdapter::open(adapter, model), model, converted);
      for (auto& l : layers) l.load_adapter(converted, -1, AdapterStorage::f32);
      const std::string from_file = out_dir(c.name + "_from_file");
      CHECK(save_peft_adapter(from_file, list, f32).tensors == st.tensors);
      for (int l : c.layers) {
        INFO("layer " << l << " from the converted file");
        const LoadedLora want = load_layer_lora(adapter, model, l), got = load_layer_lora(from_file, model, l);
        for (Projection p : kProjections) {
          CHECK(got.lora[p].a == want.lora[p].a);
          CHECK(got.lora[p].b == want.lora[p].b);
          CHECK(got.lora[p].scale == want.lora[p].scale);
          CHECK(got.lora[p].expert_rank == want.lora[p].expert_rank);
        }
        CHECK(got.key_template_a == want.key_template_a);
      }
      // The same LoRA given as the caller's arrays to a layer without an adapter: keys from the
      // checkpoint's names (PEFT's own for these models), each expert at the set's rank.
      std::vector<MoeLayer> plain;
      std::vector<PeftSaveLayer> plain_list;
      for (std::size_t i = 0; i < c.layers.size(); ++i) {
        CheckpointLayerOptions o;
        o.max_tokens = 16;
        o.lora_rank = layers[i].lora().max_rank();
        plain.push_back(MoeLayer::from_checkpoint(rt, c.dir + "/model", c.layers[i], o));
        plain.back().update_lora_weights(layers[i].lora());
      }
      for (auto& l : plain) plain_list.push_back({&l, -1});
      const std::string named = out_dir(c.name + "_named");
      save_peft_adapter(named, plain_list);
      for (std::size_t i = 0; i < c.layers.size(); ++i) {
        INFO("layer " << c.layers[i]);
        CheckpointLayerOptions o;
        o.max_tokens = 16;
        o.adapter = named;
        MoeLayer back = MoeLayer::from_checkpoint(rt, c.dir + "/model", c.layers[i], o);
        CHECK(test::rel_error(forward_of(back, model.shape), forward_of(layers[i], model.shape)) <= 1e-6);
        CHECK(load_layer_lora(named, model, c.layers[i]).key_template_a == load_layer_lora(adapter, model, c.layers[i]).key_template_a);
      }
    }
  }
}

TEST_CASE("a trainer's arrays are saved under the given names, ranks and scales, and load back", "[api][save]") {
  Runtime rt({"portable", 1});
  const ExpertWeights w = random_expert_weights(kShape, 5);
  MoeLayer layer(rt, config(), ref_of(w));
  LayerLora l = random_lora(kShape, kRank, 6.0f, 6);
  for (auto& p : l.proj) std::fill(p.scale.begin(), p.scale.end(), 2.0f);

  SECTION("one scale, f32 arrays (LoraWeights)") {
    layer.update_lora_weights(LoraWeights{l.proj[0].a.data(), l.proj[0].b.data(), l.proj[1].a.data(), l.proj[1].b.data(),
                                          l.proj[2].a.data(), l.proj[2].b.data()});
    const std::string out = out_dir("trainer");
    const PeftSaveStats st = save_peft_adapter(out, {{&layer, 4}}, {});
    CHECK(st.layers == 1);
    CHECK(st.tensors == 2 * 3 * kShape.num_experts);
    const nlohmann::json j = config_of(out);
    CHECK(j["peft_type"] == "LORA");
    CHECK(j["r"] == kRank);
    CHECK(j["lora_alpha"] == 6);  // 6 / 3 = the layer's scale 2, written as 6 rather than 6.0000001
    CHECK(j["use_rslora"] == false);
    CHECK(j["target_modules"] == nlohmann::json::array({"down_proj", "gate_proj", "up_proj"}));
    CHECK(j["rank_pattern"].empty());
    CHECK(j["alpha_pattern"].empty());
    auto f = io::SafetensorsFile::open(out + "/adapter_model.safetensors");
    const auto* a = f.find("base_model.model.model.layers.4.mlp.experts.3.up_proj.lora_A.weight");
    REQUIRE(a);
    CHECK(a->dtype == io::Dtype::F32);
    CHECK(a->shape == std::vector<std::int64_t>{kRank, kShape.hidden});
    CHECK(io::read_as_f32(f, a->name) == std::vector<float>(l.proj[1].a_of(3), l.proj[1].a_of(3) + kRank * kShape.hidden));
    CHECK(f.find("base_model.model.model.layers.4.mlp.experts.2.down_proj.lora_B.weight")->shape ==
          std::vector<std::int64_t>{kShape.hidden, kRank});

    MoeLayer back(rt, config(), ref_of(w));
    back.load_adapter(out, 4);
    CHECK(test::rel_error(forward_of(back, kShape), forward_of(layer, kShape)) <= 1e-6);
    // The index a layer's adapter was loaded at is its own from then on.
    const std::string again = out_dir("trainer_again");
    CHECK(save_peft_adapter(again, {{&back}}).tensors == st.tensors);
    CHECK(io::SafetensorsFile::open(again + "/adapter_model.safetensors").find("base_model.model.model.layers.4.mlp.experts.0.gate_proj.lora_A.weight") != nullptr);
  }

  SECTION("a layer split over NUMA nodes saves its whole set") {
    MoeLayerConfig split_cfg = config();
    split_cfg.numa_nodes = 3;  // virtual nodes: each holds a slice of the intermediate dimension
    MoeLayer split(rt, split_cfg, ref_of(w));
    split.update_lora_weights(view_of(l));
    layer.update_lora_weights(view_of(l));
    const std::string one = out_dir("numa_one"), three = out_dir("numa_three");
    save_peft_adapter(one, {{&layer, 1}});
    save_peft_adapter(three, {{&split, 1}});
    test::check_same_adapter(one, three);
  }

  SECTION("per-expert scales and coverage, bf16 arrays, Mixtral's names") {
    std::vector<float> scales{2.0f, 2.0f, 0.5f, 2.0f, 2.0f};
    std::vector<std::uint8_t> present{1, 1, 1, 0, 1};
    LayerLoraBf16 held = round_lora_to_bf16(l);
    LayerLoraView v;
    for (int i = 0; i < 3; ++i) {
      const auto& p = held.proj[i];
      v.proj[i] = {p.rank, p.in, p.out, p.a.data(), p.b.data(), LoraDType::bf16, scales.data(), 1.0f, present.data(), {}};
    }
    v.proj[2] = {};  // no LoRA on down
    layer.update_lora_weights(v);
    PeftSaveOptions o;
    o.experts_module = "model.layers.{layer}.block_sparse_moe.experts.{expert}";
    o.projection_names = {"w1", "w3", "w2"};
    o.base_model_name_or_path = "mistralai/Mixtral-8x7B-v0.1";
    const std::string out = out_dir("mixtral_names");
    CHECK(save_peft_adapter(out, {{&layer, 0}}, o).tensors == 2 * 2 * 4);
    const nlohmann::json j = config_of(out);
    CHECK(j["r"] == kRank);
    CHECK(j["lora_alpha"] == 6);
    CHECK(j["alpha_pattern"] == nlohmann::json{{"layers.0.block_sparse_moe.experts.2.w1", 1.5}, {"layers.0.block_sparse_moe.experts.2.w3", 1.5}});
    CHECK(j["target_modules"] == nlohmann::json::array({"w1", "w3"}));
    CHECK(j["base_model_name_or_path"] == "mistralai/Mixtral-8x7B-v0.1");
    auto f = io::SafetensorsFile::open(out + "/adapter_model.safetensors");
    const auto* b = f.find("base_model.model.model.layers.0.block_sparse_moe.experts.1.w3.lora_B.weight");
    REQUIRE(b);
    CHECK(b->dtype == io::Dtype::BF16);  // as the set holds its factors
    CHECK(f.find("base_model.model.model.layers.0.block_sparse_moe.experts.3.w1.lora_A.weight") == nullptr);  // not covered
    CHECK(f.find("base_model.model.model.layers.0.block_sparse_moe.experts.0.w2.lora_A.weight") == nullptr);

    ModelConfig model;
    model.shape = kShape;
    model.num_layers = 1;
    model.moe_layers = {0};
    const LoadedLora got = load_layer_lora(out, model, 0);
    for (Projection p : {Projection::gate, Projection::up}) {
      const auto& g = got.lora[p];
      CHECK(g.present == present);
      for (int e = 0; e < kShape.num_experts; ++e) {
        INFO("expert " << e);
        CHECK(g.scale[e] == (present[e] ? scales[e] : 0.0f));
        if (!present[e]) continue;
        for (int i = 0; i < kRank * kShape.hidden; ++i) REQUIRE(g.a_of(e)[i] == bf16_to_float(held[p].a_of(e)[i]));
        for (int i = 0; i < kShape.intermediate * kRank; ++i) REQUIRE(g.b_of(e)[i] == bf16_to_float(held[p].b_of(e)[i]));
      }
    }
    CHECK(got.lora[Projection::down].rank == 0);
    MoeLayer back(rt, config(), ref_of(w));
    back.load_adapter(out, 0);
    CHECK(test::rel_error(forward_of(back, kShape), forward_of(layer, kShape)) <= 1e-6);
  }

  SECTION("an adapter's smaller ranks are kept while their padding stays zero") {
    // Expert 1's gate at rank 2 in an adapter of rank 3: written back at rank 2 (rank_pattern).
    LayerLora ranked = l;
    auto& gate = ranked[Projection::gate];
    for (int j = 2; j < kRank; ++j) std::fill_n(gate.a_of(1) + j * kShape.hidden, kShape.hidden, 0.0f);
    for (int row = 0; row < kShape.intermediate; ++row) gate.b_of(1)[row * kRank + 2] = 0.0f;
    layer.update_lora_weights(view_of(ranked));
    const std::string first = out_dir("ranked_first");
    save_peft_adapter(first, {{&layer, 2}});
    CHECK(config_of(first)["rank_pattern"].empty());  // no adapter: the set's rank for every expert
    // An adapter whose expert 1 has rank 2 there: that rank is its own.
    nlohmann::json j = config_of(first);
    j["rank_pattern"] = {{"layers.2.mlp.experts.1.gate_proj", 2}};
    j["alpha_pattern"] = {{"layers.2.mlp.experts.1.gate_proj", 4}};
    {
      auto f = io::SafetensorsFile::open(first + "/adapter_model.safetensors");
      io::SafetensorsWriter wr;
      for (const auto& t : f.tensors()) {
        std::vector<float> v = io::read_as_f32(f, t.name);
        std::vector<std::int64_t> shape = t.shape;
        if (t.name.find("experts.1.gate_proj.lora_A") != std::string::npos) v.resize(2 * kShape.hidden), shape[0] = 2;
        if (t.name.find("experts.1.gate_proj.lora_B") != std::string::npos) {
          std::vector<float> narrow;
          for (int row = 0; row < kShape.intermediate; ++row) narrow.insert(narrow.end(), v.begin() + row * kRank, v.begin() + row * kRank + 2);
          v = narrow, shape[1] = 2;
        }
        wr.add_f32(t.name, shape, v);
      }
      const std::string ranked_dir = out_dir("ranked_adapter");
      fs::create_directories(ranked_dir);
      wr.write(ranked_dir + "/adapter_model.safetensors");
      std::ofstream(ranked_dir + "/adapter_config.json") << j.dump();
      MoeLayer held(rt, config(), ref_of(w));
      held.load_adapter(ranked_dir, 2);
      const std::string out = out_dir("ranked_saved");
      save_peft_adapter(out, {{&held}});
      CHECK(config_of(out)["rank_pattern"] == nlohmann::json{{"layers.2.mlp.experts.1.gate_proj", 2}});
      CHECK(config_of(out)["alpha_pattern"] == nlohmann::json{{"layers.2.mlp.experts.1.gate_proj", 4}});
      // Trained so that the padding is no longer zero: written at the set's rank.
      LayerLora trained = l;
      held.update_lora_weights(view_of(trained));
      const std::string out2 = out_dir("ranked_trained");
      save_peft_adapter(out2, {{&held}});
      CHECK(config_of(out2)["rank_pattern"].empty());
    }
  }
}

TEST_CASE("save_peft_adapter refuses bad arguments naming the layer, and writes nothing", "[api][save][errors]") {
  Runtime rt({"portable", 1});
  const ExpertWeights w = random_expert_weights(kShape, 5);
  MoeLayer a(rt, config(), ref_of(w)), b(rt, config(), ref_of(w));
  LayerLora l = random_lora(kShape, kRank, 6.0f, 6);
  a.update_lora_weights(view_of(l));
  b.update_lora_weights(view_of(l));
  const std::string out = out_dir("refused");
  auto refused = [&](auto&& fn, ErrorKind kind, const std::string& mention) {
    test::expect_error(fn, kind, mention);
    CHECK_FALSE(fs::exists(out));  // nothing written
  };
  refused([&] { save_peft_adapter(out, {}); }, ErrorKind::invalid_argument, "no layers given");
  refused([&] { save_peft_adapter(out, {{nullptr, 1}}); }, ErrorKind::invalid_argument, "layers[0] is null");
  refused([&] { save_peft_adapter(out, {{&a}}); }, ErrorKind::invalid_argument, "layers[0]: the layer was made from memory");
  refused([&] { save_peft_adapter(out, {{&a, 1}, {&b, 1}}); }, ErrorKind::invalid_argument, "layers[1]: layer 1 is given twice");
  refused([&] { save_peft_adapter(out, {{&a, -2}}); }, ErrorKind::invalid_argument, "layers[0]: index -2");
  PeftSaveOptions no_expert;
  no_expert.experts_module = "model.layers.{layer}.mlp.experts";
  refused([&] { save_peft_adapter(out, {{&a, 1}}, no_expert); }, ErrorKind::invalid_argument, "must hold both {layer} and {expert}");
  PeftSaveOptions dotted;
  dotted.projection_names[1] = "mlp.up";
  refused([&] { save_peft_adapter(out, {{&a, 1}}, dotted); }, ErrorKind::invalid_argument, "projection_names");
  LayerLora diverged = l;
  diverged[Projection::up].b_of(4)[2 * kRank + 1] = std::numeric_limits<float>::quiet_NaN();
  a.update_lora_weights(view_of(diverged));
  refused([&] { save_peft_adapter(out, {{&a, 1}}); }, ErrorKind::invalid_argument, "layer 1 up, expert 4: LoRA B[2][1] is not finite");
  diverged[Projection::up].b_of(4)[2 * kRank + 1] = 0.5f;
  diverged[Projection::down].a_of(0)[kShape.intermediate + 3] = std::numeric_limits<float>::infinity();
  refused([&] { save_peft_adapter(out, {{&a, 1}}); }, ErrorKind::invalid_argument, "layer 1 down, expert 0: LoRA A[1][3] is not finite");
  a.update_lora_weights(view_of(l));
  MoeLayer bare(rt, config(), ref_of(w));
  refused([&] { save_peft_adapter(out, {{&bare, 1}}); }, ErrorKind::invalid_argument, "no layer has LoRA to save");
  // A checkpoint layer given another index than its own.
  const auto c = test::fixture_cases().front();
  CheckpointLayerOptions o;
  o.max_tokens = 4;
  o.adapter = c.dir + "/adapter";
  MoeLayer ck = MoeLayer::from_checkpoint(rt, c.dir + "/model", c.layers.front(), o);
  refused([&] { save_peft_adapter(out, {{&ck, c.layers.front() + 1}}); }, ErrorKind::invalid_argument,
          "index " + std::to_string(c.layers.front() + 1) + " given, but the layer is layer " + std::to_string(c.layers.front()));
  // A path that is a file: named, and the file is left alone.
  const std::string file = out_dir("a_file");
  std::ofstream(file) << "x";
  try {
    save_peft_adapter(file, {{&a, 1}});
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::bad_file);
    CHECK(std::string(e.what()).find(file + ": exists and is not a directory") != std::string::npos);
  }
  CHECK(test::file_text(file) == "x");
}
