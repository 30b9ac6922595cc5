// PEFT adapters on stacked expert tensors (LoraConfig.target_parameters, lora.ParamWrapper), as
// PEFT trains transformers v5's MoE models: one A [r*E, in] and one B [out, r*E] per stacked
// tensor, gate and up sharing one A through gate_up_proj. Checked against PEFT's own formula for
// the weight delta, against the same LoRA written per expert (the form the PyTorch fixtures
// check) through the command line's forward and backward, and through convert-lora and export
// round trips; MoeLayer::adapter_stacked_keys names where the adapter keeps them.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "adapter_compare.hpp"
#include "catch.hpp"
#include "cli_runner.hpp"
#include "src/io/safetensors.hpp"
#include "src/io/safetensors_writer.hpp"
#include "src/lora/lora_file.hpp"
#include "src/lora/peft_adapter.hpp"
#include "src/lora/peft_export.hpp"
#include "src/model/model_config.hpp"
#include "src/model/tensor_names.hpp"
#include "test_util.hpp"
#include "tilemoe/error.hpp"
#include "tilemoe/moe_layer.hpp"
#include "tilemoe/peft_save.hpp"
#include "tilemoe/runtime.hpp"

using namespace tilemoe;
namespace fs = std::filesystem;
using test::error_of;
using test::run_cli;

namespace {

// Two MoE layers (0 and 1) of 3 experts, hidden 24, intermediate 17: no size a multiple of 16.
constexpr int kE = 3, kH = 24, kI = 17, kR = 4;

std::string model_config() {
  return R"({"model_type": "qwen3_moe", "hidden_size": 24, "moe_intermediate_size": 17, "num_experts": 3,
             "num_experts_per_tok": 2, "num_hidden_layers": 2, "norm_topk_prob": true})";
}

std::vector<float> values(std::size_t n, unsigned seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::string fresh_dir(const std::string& name) {
  const std::string d = test::temp_dir() + "/" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// The stacked adapter's tensors, as PEFT lays them out: A rows e*r + j, B columns j*E + e.
struct StackedLora {
  std::vector<float> gate_up_a, gate_up_b, down_a, down_b;  // [r*E, H], [2I, r*E], [r*E, I], [H, r*E]
  StackedLora() {
    gate_up_a = values(static_cast<std::size_t>(kR) * kE * kH, 1, 0.3f);
    gate_up_b = values(static_cast<std::size_t>(2 * kI) * kR * kE, 2, 0.3f);
    down_a = values(static_cast<std::size_t>(kR) * kE * kI, 3, 0.3f);
    down_b = values(static_cast<std::size_t>(kH) * kR * kE, 4, 0.3f);
  }
};

const std::string kPrefix = "base_model.model.model.layers.1.mlp.experts.";

// What PEFT writes for target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]:
// the second wrapper nests the first, hence "base_layer" in gate_up_proj's keys.
std::string write_stacked_adapter(const std::string& name, const StackedLora& l, const std::string& extra_config = "",
                                  bool drop_down_b = false) {
  const std::string d = fresh_dir(name);
  std::ofstream(d + "/adapter_config.json") << R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": [],
      "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"], "alpha_pattern": {"down_proj": 2})" +
                                                   extra_config + "}";
  io::SafetensorsWriter w;
  w.add_f32(kPrefix + "base_layer.lora_A.weight", {kR * kE, kH}, l.gate_up_a);
  w.add_f32(kPrefix + "base_layer.lora_B.weight", {2 * kI, kR * kE}, l.gate_up_b);
  w.add_f32(kPrefix + "lora_A.weight", {kR * kE, kI}, l.down_a);
  if (!drop_down_b) w.add_f32(kPrefix + "lora_B.weight", {kH, kR * kE}, l.down_b);
  w.add_f32("base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight", {kR, kH}, std::vector<float>(kR * kH, 0.5f));
  w.write(d + "/adapter_model.safetensors");
  return d;
}

// The same LoRA per expert, as PEFT writes it for per-expert nn.Linear modules: gate and up each
// get a copy of the shared A.
std::string write_per_expert_adapter(const std::string& name, const StackedLora& l) {
  const std::string d = fresh_dir(name);
  std::ofstream(d + "/adapter_config.json") << R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8,
      "target_modules": ["gate_proj", "up_proj", "down_proj"], "alpha_pattern": {"down_proj": 2}})";
  io::SafetensorsWriter w;
  for (int e = 0; e < kE; ++e) {
    auto write = [&](const char* proj, const std::vector<float>& a, int in, const std::vector<float>& b, int first_row, int out) {
      const std::string key = "base_model.model.model.layers.1.mlp.experts." + std::to_string(e) + "." + proj;
      std::vector<float> ae(a.begin() + static_cast<std::ptrdiff_t>(e) * kR * in, a.begin() + static_cast<std::ptrdiff_t>(e + 1) * kR * in);
      std::vector<float> be(static_cast<std::size_t>(out) * kR);
      for (int o = 0; o < out; ++o)
        for (int j = 0; j < kR; ++j) be[static_cast<std::size_t>(o) * kR + j] = b[static_cast<std::size_t>(first_row + o) * kR * kE + j * kE + e];
      w.add_f32(key + ".lora_A.weight", {kR, in}, ae);
      w.add_f32(key + ".lora_B.weight", {out, kR}, be);
    };
    write("gate_proj", l.gate_up_a, kH, l.gate_up_b, 0, kI);
    write("up_proj", l.gate_up_a, kH, l.gate_up_b, kI, kI);
    write("down_proj", l.down_a, kI, l.down_b, 0, kH);
  }
  w.write(d + "/adapter_model.safetensors");
  return d;
}

// A checkpoint with layers 0 and 1, experts per expert or stacked (transformers v5), and routers.
std::string write_model(const std::string& name, bool stacked) {
  const std::string d = fresh_dir(name);
  std::ofstream(d + "/config.json") << model_config();
  static const std::vector<float> gate = values(static_cast<std::size_t>(kE) * kI * kH, 11, 0.2f),
                                  up = values(static_cast<std::size_t>(kE) * kI * kH, 12, 0.2f),
                                  down = values(static_cast<std::size_t>(kE) * kH * kI, 13, 0.2f),
                                  router = values(static_cast<std::size_t>(kE) * kH, 14, 1.0f);
  io::SafetensorsWriter w;
  for (int layer : {0, 1}) {
    const std::string base = "model.layers." + std::to_string(layer) + ".mlp.";
    w.add_f32(base + "gate.weight", {kE, kH}, router);
    if (stacked) {
      std::vector<float> gate_up;
      for (int e = 0; e < kE; ++e) {
        gate_up.insert(gate_up.end(), gate.begin() + e * kI * kH, gate.begin() + (e + 1) * kI * kH);
        gate_up.insert(gate_up.end(), up.begin() + e * kI * kH, up.begin() + (e + 1) * kI * kH);
      }
      w.add_f32(base + "experts.gate_up_proj", {kE, 2 * kI, kH}, gate_up);
      w.add_f32(base + "experts.down_proj", {kE, kH, kI}, down);
      continue;
    }
    for (int e = 0; e < kE; ++e) {
      const std::string ex = base + "experts." + std::to_string(e) + ".";
      w.add_f32(ex + "gate_proj.weight", {kI, kH}, {gate.begin() + e * kI * kH, gate.begin() + (e + 1) * kI * kH});
      w.add_f32(ex + "up_proj.weight", {kI, kH}, {up.begin() + e * kI * kH, up.begin() + (e + 1) * kI * kH});
      w.add_f32(ex + "down_proj.weight", {kH, kI}, {down.begin() + e * kH * kI, down.begin() + (e + 1) * kH * kI});
    }
  }
  w.write(d + "/model.safetensors");
  return d;
}

ModelConfig config() { return parse_model_config(model_config(), "config.json"); }

}  // namespace

TEST_CASE("stacked LoRA names", "[names][stacked]") {
  auto a = parse_stacked_lora_name("base_model.model.model.layers.3.mlp.experts.base_layer.lora_B.weight");
  REQUIRE(a);
  CHECK(a->layer == 3);
  CHECK(a->factor == LoraFactor::b);
  CHECK(a->pair_key == "base_model.model.model.layers.3.mlp.experts.base_layer");
  CHECK(a->module == "model.layers.3.mlp.experts");
  auto b = parse_stacked_lora_name("model.layers.0.mlp.experts.lora_A.default.weight");
  REQUIRE(b);
  CHECK(b->factor == LoraFactor::a);
  CHECK(b->pair_key == "model.layers.0.mlp.experts");
  CHECK(parse_stacked_lora_name("model.layers.0.mlp.experts.lora_B.bias")->bias);
  CHECK_FALSE(parse_stacked_lora_name("model.layers.0.mlp.experts.2.gate_proj.lora_A.weight"));
  CHECK_FALSE(parse_stacked_lora_name("model.layers.0.mlp.shared_experts.lora_A.weight"));
  CHECK_FALSE(parse_stacked_lora_name("model.layers.0.self_attn.q_proj.lora_A.weight"));
}

TEST_CASE("a stacked adapter's LoRA is PEFT's delta, expert by expert", "[peft][stacked]") {
  StackedLora l;
  auto adapter = PeftAdapter::open(write_stacked_adapter("stacked", l), config());
  CHECK(adapter.layers() == std::vector<int>{1});
  CHECK(adapter.expert_keys() == 4);
  CHECK(adapter.other_keys().size() == 1);
  REQUIRE(adapter.stacked_entries(1).size() == 2);
  auto loaded = load_peft_layer(adapter, config().shape, 1);
  CHECK(loaded.stacked[0].key_a == kPrefix + "base_layer.lora_A.weight");
  CHECK(loaded.stacked[1].first_row == kI);
  CHECK(loaded.stacked[2].key_b == kPrefix + "lora_B.weight");
  // ParamWrapper.get_delta_weight for [E, out, in] experts: einsum("o r e, e r i -> e o i",
  // B.reshape(out, r, E), A.reshape(E, r, in)) * scaling, written out index by index.
  auto peft_delta = [&](const std::vector<float>& A, const std::vector<float>& B, int in, int out_total, double scaling, int e, int o,
                        int i) {
    double sum = 0;
    for (int j = 0; j < kR; ++j)
      sum += static_cast<double>(B[(static_cast<std::size_t>(o) * kR + j) * kE + e]) * A[(static_cast<std::size_t>(e) * kR + j) * in + i];
    (void)out_total;
    return sum * scaling;
  };
  int compared = 0;
  for (Projection p : kProjections) {
    const auto& proj = loaded.lora[p];
    const bool down = p == Projection::down;
    const int in = down ? kI : kH, out = down ? kH : kI, row0 = p == Projection::up ? kI : 0;
    const double scaling = down ? 2.0 / kR : 8.0 / kR;  // alpha_pattern {"down_proj": 2}
    REQUIRE(proj.rank == kR);
    for (int e = 0; e < kE; ++e) {
      CHECK(proj.active(e));
      CHECK(proj.scale[e] == static_cast<float>(scaling));
      for (int o = 0; o < out; ++o)
        for (int i = 0; i < in; ++i) {
          double ours = 0;
          for (int j = 0; j < kR; ++j)
            ours += static_cast<double>(proj.b_of(e)[static_cast<std::size_t>(o) * kR + j]) * proj.a_of(e)[static_cast<std::size_t>(j) * in + i];
          ours *= proj.scale[e];
          const double want = down ? peft_delta(l.down_a, l.down_b, in, kH, scaling, e, o, i)
                                   : peft_delta(l.gate_up_a, l.gate_up_b, in, 2 * kI, scaling, e, row0 + o, i);
          CHECK(std::abs(ours - want) <= 1e-5 * (1 + std::abs(want)));
          ++compared;
        }
    }
  }
  CHECK(compared == kE * (2 * kI * kH + kH * kI));
}

TEST_CASE("a stacked adapter's gradients and export keep PEFT's layout", "[peft][stacked][export]") {
  StackedLora l;
  const std::string dir = write_stacked_adapter("stacked_export", l);
  auto adapter = PeftAdapter::open(dir, config());
  auto loaded = load_peft_layer(adapter, config().shape, 1);

  // Gradients: A's is the sum of gate's and up's, B's lands where PEFT keeps B.
  LayerLora grads = loaded.lora.zeros_like();
  for (Projection p : kProjections) {
    auto v = values(grads[p].a.size(), 20 + static_cast<unsigned>(p), 1.0f);
    std::copy(v.begin(), v.end(), grads[p].a.begin());
    auto w = values(grads[p].b.size(), 30 + static_cast<unsigned>(p), 1.0f);
    std::copy(w.begin(), w.end(), grads[p].b.begin());
  }
  auto stacked = stacked_lora_grads(loaded, grads);
  REQUIRE(stacked.size() == 4);
  for (const auto& g : stacked) {
    INFO(g.key);
    if (g.key == kPrefix + "base_layer.lora_A.weight") {
      CHECK(g.shape == std::vector<std::int64_t>{kR * kE, kH});
      CHECK(g.values[(1 * kR + 2) * kH + 5] == grads[Projection::gate].a_of(1)[2 * kH + 5] + grads[Projection::up].a_of(1)[2 * kH + 5]);
    } else if (g.key == kPrefix + "base_layer.lora_B.weight") {
      CHECK(g.shape == std::vector<std::int64_t>{2 * kI, kR * kE});
      CHECK(g.values[(kI + 3) * kR * kE + 1 * kE + 2] == grads[Projection::up].b_of(2)[3 * kR + 1]);
      CHECK(g.values[3 * kR * kE + 1 * kE + 2] == grads[Projection::gate].b_of(2)[3 * kR + 1]);
    } else if (g.key == kPrefix + "lora_B.weight") {
      CHECK(g.shape == std::vector<std::int64_t>{kH, kR * kE});
      CHECK(g.values[7 * kR * kE + 3 * kE + 0] == grads[Projection::down].b_of(0)[7 * kR + 3]);
    } else {
      CHECK(g.key == kPrefix + "lora_A.weight");
      CHECK(g.values[(2 * kR + 3) * kI + 16] == grads[Projection::down].a_of(2)[3 * kI + 16]);
    }
  }

  // Export writes the stacked tensors back bit for bit, the other keys verbatim.
  const std::string out = test::temp_dir() + "/stacked_exported";
  PeftExportOptions opt;
  opt.extras = peft_extras(adapter);
  write_peft_adapter(out, adapter.config(), {{1, &loaded}}, opt);
  test::check_same_adapter(dir, out);
  // A trainer that stepped gate's and up's copies of the shared A apart cannot be written back.
  loaded.lora[Projection::up].a_of(2)[0] += 1.0f;
  CHECK(error_of([&] { write_peft_adapter(test::temp_dir() + "/stacked_bad", adapter.config(), {{1, &loaded}}); })
            .find("gate and up share one A in this adapter, but their A differ") != std::string::npos);
  CHECK_FALSE(fs::exists(test::temp_dir() + "/stacked_bad"));
}

TEST_CASE("malformed stacked adapters are refused naming the file and keys", "[peft][stacked]") {
  StackedLora l;
  const ModelConfig cfg = config();
  auto open_error = [&](const std::string& dir) { return error_of([&] { PeftAdapter::open(dir, cfg); }); };
  CHECK(open_error(write_stacked_adapter("no_b", l, "", true)).find("experts LoRA ('" + kPrefix.substr(0, kPrefix.size() - 1) +
                                                                    ".lora_A/B'): has lora_A but no lora_B") != std::string::npos);
  CHECK(open_error(write_stacked_adapter("rank", l, R"(, "rank_pattern": {"gate_up_proj": 8})"))
            .find("have rank 4 over 3 experts but adapter_config.json says 8") != std::string::npos);

  auto write_one = [&](const std::string& name, std::vector<std::int64_t> a_shape, std::vector<std::int64_t> b_shape,
                       const std::string& layer = "1") {
    const std::string d = fresh_dir(name);
    std::ofstream(d + "/adapter_config.json") << R"({"r": 4, "lora_alpha": 8, "target_parameters": ["experts.gate_up_proj"]})";
    io::SafetensorsWriter w;
    const std::string k = "base_model.model.model.layers." + layer + ".mlp.experts.";
    w.add_f32(k + "lora_A.weight", a_shape, std::vector<float>(static_cast<std::size_t>(a_shape[0] * a_shape[1]), 0.1f));
    w.add_f32(k + "lora_B.weight", b_shape, std::vector<float>(static_cast<std::size_t>(b_shape[0] * b_shape[1]), 0.1f));
    w.write(d + "/adapter_model.safetensors");
    return d;
  };
  std::string err = open_error(write_one("not_multiple", {10, kH}, {2 * kI, 10}));
  CHECK(err.find("adapter_model.safetensors: layer 1 experts LoRA") != std::string::npos);
  CHECK(err.find("are not a LoRA of rank r over the model's 3 experts stacked") != std::string::npos);
  err = open_error(write_one("fits_nothing", {12, kH}, {kH, 12}));
  CHECK(err.find("do not fit the model's stacked experts") != std::string::npos);
  err = open_error(write_one("gate_or_up", {12, kH}, {kI, 12}));  // gate_proj or up_proj: target_parameters names neither
  CHECK(err.find("do not fit the model's stacked experts") != std::string::npos);
  CHECK(PeftAdapter::open(write_one("ok_one", {12, kH}, {2 * kI, 12}), cfg).stacked_entries(1).size() == 1);
  err = open_error(write_one("layer", {12, kH}, {2 * kI, 12}, "5"));
  CHECK(err.find("the model's layer 5 is not a MoE layer") != std::string::npos);

  // Per-expert LoRA on a projection that also has stacked LoRA.
  {
    const std::string d = write_stacked_adapter("both", l);
    auto f = io::SafetensorsFile::open(d + "/adapter_model.safetensors");
    io::SafetensorsWriter w;
    for (const auto& t : f.tensors()) w.add(t.name, t.dtype, t.shape, f.data(t));
    w.add_f32(kPrefix + "1.down_proj.lora_A.weight", {kR, kI}, std::vector<float>(kR * kI, 0.1f));
    w.add_f32(kPrefix + "1.down_proj.lora_B.weight", {kH, kR}, std::vector<float>(kR * kH, 0.1f));
    w.write(d + "/adapter_model.safetensors.new");
    fs::rename(d + "/adapter_model.safetensors.new", d + "/adapter_model.safetensors");
    CHECK(open_error(d).find("layer 1 down has LoRA both per expert") != std::string::npos);
  }
}

TEST_CASE("a layer says where its adapter keeps the stacked LoRA", "[api][stacked]") {
  StackedLora l;
  const std::string model = write_model("keys_model", true);
  const std::string stacked = write_stacked_adapter("keys_stacked", l), per_expert = write_per_expert_adapter("keys_per_expert", l);
  Runtime rt({"portable", 1});
  CheckpointLayerOptions o;
  o.max_tokens = 8;
  o.adapter = stacked;
  MoeLayer layer = MoeLayer::from_checkpoint(rt, model, 1, o);
  auto check_stacked = [&](const LayerPeftStackedKeys& k) {
    for (int p = 0; p < 2; ++p) {
      CHECK(k[p].key_a == kPrefix + "base_layer.lora_A.weight");  // one A for gate and up
      CHECK(k[p].key_b == kPrefix + "base_layer.lora_B.weight");
      CHECK(k[p].first_row == p * kI);
      CHECK(k[p].b_rows == 2 * kI);
    }
    CHECK(k[2].key_a == kPrefix + "lora_A.weight");
    CHECK(k[2].key_b == kPrefix + "lora_B.weight");
    CHECK(k[2].first_row == 0);
    CHECK(k[2].b_rows == kH);
  };
  check_stacked(layer.adapter_stacked_keys());
  auto all_empty = [](const LayerPeftStackedKeys& k) { return k[0].empty() && k[1].empty() && k[2].empty(); };
  layer.load_adapter(per_expert);
  CHECK(all_empty(layer.adapter_stacked_keys()));
  const std::string converted = test::temp_dir() + "/keys.safetensors";
  convert_peft_to_lora_file(PeftAdapter::open(stacked, config()), config(), converted);
  layer.load_adapter(converted);  // the file keeps the keys
  check_stacked(layer.adapter_stacked_keys());
  layer.unload_adapter();
  CHECK(all_empty(layer.adapter_stacked_keys()));
}

TEST_CASE("save_peft_adapter writes a stacked adapter back under its keys and adapter_config.json", "[api][stacked][save]") {
  StackedLora l;
  const std::string model = write_model("save_model", true);
  const std::string stacked = write_stacked_adapter("save_stacked", l);
  Runtime rt({"portable", 1});
  CheckpointLayerOptions o;
  o.max_tokens = 8;
  o.adapter = stacked;
  MoeLayer layer = MoeLayer::from_checkpoint(rt, model, 1, o);
  const auto fresh_out = [](const std::string& name) {
    const std::string d = test::temp_dir() + "/" + name;
    fs::remove_all(d);
    return d;
  };
  const std::vector<std::string> keys{kPrefix + "base_layer.lora_A.weight", kPrefix + "base_layer.lora_B.weight",
                                      kPrefix + "lora_A.weight", kPrefix + "lora_B.weight"};
  // The held adapter: its four tensors bit for bit (F32 as held), its config verbatim, nothing else.
  const std::string out = fresh_out("save_stacked_out");
  CHECK(save_peft_adapter(out, {{&layer}}).tensors == 4);
  CHECK(test::file_text(out + "/adapter_config.json") == test::file_text(stacked + "/adapter_config.json"));
  auto want = io::SafetensorsFile::open(stacked + "/adapter_model.safetensors");
  auto got = io::SafetensorsFile::open(out + "/adapter_model.safetensors");
  CHECK(got.tensors().size() == 4);
  for (const auto& key : keys) {
    INFO(key);
    const auto *w = want.find(key), *g = got.find(key);
    REQUIRE((w && g));
    CHECK(g->shape == w->shape);
    CHECK(io::read_as_f32(got, key) == io::read_as_f32(want, key));
  }
  // A trainer's copy, stepped with gate's and up's A together: written under the same keys.
  const LayerLoraView held = layer.lora();
  std::array<std::vector<float>, 3> a, b;
  LayerLoraView mine = held;
  for (int p = 0; p < 3; ++p) {
    const auto& v = held.proj[p];
    const auto* av = static_cast<const float*>(v.a);
    const auto* bv = static_cast<const float*>(v.b);
    a[p].assign(av, av + static_cast<std::size_t>(kE) * v.rank * v.in);
    b[p].assign(bv, bv + static_cast<std::size_t>(kE) * v.out * v.rank);
    mine.proj[p].a = a[p].data();
    mine.proj[p].b = b[p].data();
  }
  a[0][5] += 0.25f, a[1][5] += 0.25f;
  b[2][7] -= 1.0f;
  layer.update_lora_weights(mine);
  const std::string trained = fresh_out("save_stacked_trained");
  save_peft_adapter(trained, {{&layer}});
  auto t = io::SafetensorsFile::open(trained + "/adapter_model.safetensors");
  CHECK(io::read_as_f32(t, keys[0])[5] == a[0][5]);
  const LoadedLora back = load_layer_lora(trained, config(), 1);
  for (int p = 0; p < 3; ++p) {
    CHECK(back.lora.proj[p].a == a[p]);
    CHECK(back.lora.proj[p].b == b[p]);
  }
  // Refused, nothing written: gate's and up's A apart, another scale, another rank.
  const std::string bad = fresh_out("save_stacked_bad");
  a[1][6] += 1.0f;
  CHECK(error_of([&] { save_peft_adapter(bad, {{&layer}}); }).find("gate and up share one A in this adapter, but their A differ") !=
        std::string::npos);
  a[1][6] = a[0][6];
  LayerLoraView scaled = mine;
  scaled.proj[2].scale = nullptr;
  scaled.proj[2].uniform_scale = 3.0f;
  layer.update_lora_weights(scaled);
  CHECK(error_of([&] { save_peft_adapter(bad, {{&layer}}); }).find("layer 1 down, expert 0: the set in use scales by 3") !=
        std::string::npos);
  LayerLoraView narrow = mine;
  narrow.proj[2].rank = kR - 1;
  narrow.proj[2].strides.b_expert = static_cast<std::size_t>(kH) * kR;
  layer.update_lora_weights(narrow);
  CHECK(error_of([&] { save_peft_adapter(bad, {{&layer}}); }).find("layer 1 down: the set in use has rank 3") != std::string::npos);
  CHECK_FALSE(fs::exists(bad));
  // Without the adapter, a stacked checkpoint gives no per-expert names PEFT could load.
  layer.unload_adapter();
  LayerLoraView plain = mine;
  for (auto& p : plain.proj) p.scale = nullptr, p.present = nullptr, p.uniform_scale = 2.0f;
  layer.update_lora_weights(plain);
  CHECK(error_of([&] { save_peft_adapter(bad, {{&layer}}); }).find("layer 1 gate: the checkpoint stacks its experts (transformers v5)") !=
        std::string::npos);
  CHECK_FALSE(fs::exists(bad));
}

TEST_CASE("convert-lora keeps a stacked adapter, and export-peft gives it back stacked", "[convert][stacked][export]") {
  StackedLora l;
  const ModelConfig cfg = config();
  const std::string dir = write_stacked_adapter("convert", l);
  auto adapter = PeftAdapter::open(dir, cfg);
  const std::string converted = test::temp_dir() + "/stacked.safetensors";
  convert_peft_to_lora_file(adapter, cfg, converted);
  test::check_same_loaded_lora(dir, converted, cfg, {1});
  CHECK(load_converted_layer(converted, cfg, 1).stacked[1].first_row == kI);
  // The file's stacked tensors and the attention LoRA come back as PEFT wrote them.
  const std::string out = test::temp_dir() + "/stacked_from_file";
  export_lora_file(converted, out);
  test::check_same_adapter(dir, out);
  // Metadata that does not describe a stack is refused naming the key.
  {
    auto f = io::SafetensorsFile::open(converted);
    io::SafetensorsWriter w;
    for (const auto& t : f.tensors()) w.add(t.name, t.dtype, t.shape, f.data(t));
    for (const auto& [k, v] : f.metadata()) w.set_metadata(k, v);
    w.set_metadata("peft_stacked.layer_1.up.ab", R"({"a": "x", "b": "y", "first_row": 30, "b_rows": 34})");
    const std::string broken = test::temp_dir() + "/stacked_broken.safetensors";
    w.write(broken);
    CHECK(error_of([&] { load_converted_layer(broken, cfg, 1); })
              .find("metadata 'peft_stacked.layer_1.up.ab' has rows 30 + 17 outside B's 34") != std::string::npos);
  }
}

TEST_CASE("forward and backward with a stacked adapter on a stacked checkpoint match the per-expert forms", "[cli][stacked]") {
  StackedLora l;
  const std::string stacked_model = write_model("v5_model", true), per_expert_model = write_model("v4_model", false);
  const std::string stacked_adapter = write_stacked_adapter("v5_adapter", l), per_expert_adapter = write_per_expert_adapter("v4_adapter", l);
  const std::string out_v5 = test::temp_dir() + "/v5_grads.safetensors", out_v4 = test::temp_dir() + "/v4_grads.safetensors";
  for (const auto& [model, adapter, out] : {std::tuple{stacked_model, stacked_adapter, out_v5}, std::tuple{per_expert_model, per_expert_adapter, out_v4}}) {
    auto r = run_cli("backward --model " + model + " --layer 1 --adapter " + adapter + " --tokens 37 --seed 5 --output " + out);
    INFO(r.err);
    REQUIRE(r.status == 0);
  }
  // The same through a convert-lora file: every tensor of the output, gradients under the stacked keys included.
  const std::string converted = test::temp_dir() + "/v5_adapter.safetensors", out_conv = test::temp_dir() + "/v5_conv_grads.safetensors";
  REQUIRE(run_cli("convert-lora --adapter " + stacked_adapter + " --model " + stacked_model + " --output " + converted).status == 0);
  REQUIRE(run_cli("backward --model " + stacked_model + " --layer 1 --adapter " + converted + " --tokens 37 --seed 5 --output " + out_conv)
              .status == 0);
  {
    auto a = io::SafetensorsFile::open(out_v5), b = io::SafetensorsFile::open(out_conv);
    REQUIRE(a.tensors().size() == b.tensors().size());
    for (const auto& t : a.tensors()) {
      INFO(t.name);
      REQUIRE(b.find(t.name));
      CHECK(io::read_as_f32(a, t.name) == io::read_as_f32(b, t.name));
    }
  }
  auto v5 = io::SafetensorsFile::open(out_v5), v4 = io::SafetensorsFile::open(out_v4);
  for (const char* key : {"input", "expert_ids", "weights", "output", "grad_input"}) {
    INFO(key);
    CHECK(io::read_as_f32(v5, key) == io::read_as_f32(v4, key));
  }
  // grad.<stacked key> holds the per-expert gradients in PEFT's stacked layout.
  const auto ga = io::read_as_f32(v5, "grad." + kPrefix + "base_layer.lora_A.weight");
  const auto gb = io::read_as_f32(v5, "grad." + kPrefix + "base_layer.lora_B.weight");
  const auto gda = io::read_as_f32(v5, "grad." + kPrefix + "lora_A.weight");
  CHECK(v5.get("grad." + kPrefix + "lora_B.weight").shape == std::vector<std::int64_t>{kH, kR * kE});
  int compared = 0;
  for (int e = 0; e < kE; ++e) {
    const std::string k = "grad.base_model.model.model.layers.1.mlp.experts." + std::to_string(e) + ".";
    if (!v4.find(k + "gate_proj.lora_A.weight")) continue;  // no token reached the expert: zero in v5
    const auto gate_a = io::read_as_f32(v4, k + "gate_proj.lora_A.weight"), up_a = io::read_as_f32(v4, k + "up_proj.lora_A.weight");
    const auto up_b = io::read_as_f32(v4, k + "up_proj.lora_B.weight"), down_a = io::read_as_f32(v4, k + "down_proj.lora_A.weight");
    for (int j = 0; j < kR; ++j) {
      for (int i = 0; i < kH; ++i) CHECK(ga[(static_cast<std::size_t>(e) * kR + j) * kH + i] == gate_a[j * kH + i] + up_a[j * kH + i]);
      for (int i = 0; i < kI; ++i) CHECK(gda[(static_cast<std::size_t>(e) * kR + j) * kI + i] == down_a[j * kI + i]);
      for (int o = 0; o < kI; ++o) CHECK(gb[(static_cast<std::size_t>(kI + o) * kR + j) * kE + e] == up_b[o * kR + j]);
    }
    ++compared;
  }
  CHECK(compared >= 2);
}
