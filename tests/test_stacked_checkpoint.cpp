// Checkpoints whose experts are stacked in 3-D tensors, as transformers v5 writes them
// ("experts.gate_up_proj" [E, 2I, H], "experts.down_proj" [E, H, I]), made here from the PyTorch
// fixtures' per-expert checkpoints: the same bytes must load, quantize and name the same, and
// every malformed stack is refused with the file, layer and tensor named.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "catch.hpp"
#include "fixture_cases.hpp"
#include "numa/thread_pool.hpp"
#include "quantized_dir_util.hpp"
#include "src/io/safetensors_writer.hpp"
#include "src/model/checkpoint.hpp"
#include "src/model/tensor_names.hpp"
#include "src/quant/checkpoint_fingerprint.hpp"
#include "src/quant/quantized_file.hpp"
#include "test_util.hpp"
#include "tilemoe/error.hpp"

using namespace tilemoe;
namespace fs = std::filesystem;
using test::error_of;

namespace {

enum class StackForm {
  gate_up,        // transformers v5: "experts.gate_up_proj" and "experts.down_proj", no ".weight"
  per_projection,  // one stack a projection under the per-expert token, with ".weight" ("experts.w1.weight")
  granite          // GraniteMoE: "block_sparse_moe.input_linear.weight" (gate_up) and "output_linear.weight" (down)
};

// A copy of `src_dir` with every MoE layer's experts stacked in `form`, in their stored dtype and
// bytes; all other tensors (routers, attention) as they were.
void write_stacked_copy(const std::string& src_dir, const std::string& dst_dir, StackForm form) {
  fs::remove_all(dst_dir);
  fs::create_directories(dst_dir);
  fs::copy_file(src_dir + "/config.json", dst_dir + "/config.json");
  auto ck = Checkpoint::open(src_dir);
  const MoeShape& s = ck.config().shape;
  io::SafetensorsWriter w;
  static std::vector<std::vector<std::byte>> keep;  // the writer reads the bytes at write()
  keep.clear();
  keep.reserve(ck.config().moe_layers.size() * 3);
  for (const auto& f : ck.files())
    for (const auto& t : f->tensors()) {
      auto parsed = parse_expert_tensor_name(t.name);
      if (parsed && !parsed->lora) continue;
      w.add(t.name, t.dtype, t.shape, f->data(t));
    }
  for (int layer : ck.config().moe_layers) {
    const auto refs = ck.expert_tensors(layer);
    const std::string first = refs[0][0].name;
    const std::string prefix = first.substr(0, first.find(".experts.") + 9);  // "...experts."
    auto bytes_of = [&](Projection p, int e) {
      const std::string& name = refs[static_cast<int>(p)][e].name;
      const auto& t = ck.file_of(name)->get(name);
      return std::make_pair(ck.file_of(name)->data(t), t);
    };
    auto stack = [&](std::vector<Projection> parts, const std::string& name) {
      std::vector<std::byte> out;
      io::Dtype dtype = bytes_of(parts[0], 0).second.dtype;
      std::int64_t rows = 0;
      for (Projection p : parts) rows += projection_out(s, p);
      for (int e = 0; e < s.num_experts; ++e)
        for (Projection p : parts) {
          auto [data, t] = bytes_of(p, e);
          REQUIRE(t.dtype == dtype);
          out.insert(out.end(), data, data + t.nbytes);
        }
      keep.push_back(std::move(out));
      w.add(name, dtype, {s.num_experts, rows, projection_in(s, parts[0])}, keep.back().data());
    };
    if (form == StackForm::gate_up) {
      stack({Projection::gate, Projection::up}, prefix + "gate_up_proj");
      stack({Projection::down}, prefix + "down_proj");
    } else if (form == StackForm::granite) {
      const std::string block = "model.layers." + std::to_string(layer) + ".block_sparse_moe.";
      stack({Projection::gate, Projection::up}, block + "input_linear.weight");
      stack({Projection::down}, block + "output_linear.weight");
    } else {
      for (Projection p : kProjections) {
        const std::string& name = refs[static_cast<int>(p)][0].name;  // "...experts.0.w1.weight"
        const std::string token = name.substr(prefix.size() + 2, name.size() - prefix.size() - 2 - 7);
        stack({p}, prefix + token + ".weight");
      }
    }
  }
  w.write(dst_dir + "/model.safetensors");
}

const MoeShape kShape{24, 17, 3, 2};  // hidden 24, intermediate 17, 3 experts, top-2

std::string small_config(const std::string& extra = "") {
  return R"({"model_type": "qwen3_moe", "hidden_size": 24, "moe_intermediate_size": 17, "num_experts": 3,
             "num_experts_per_tok": 2, "num_hidden_layers": 1)" + extra + "}";
}

// A one-layer checkpoint of hand-made stacks: name -> (dtype, shape, values as f32 or raw bytes).
struct Stack {
  io::Dtype dtype = io::Dtype::BF16;
  std::vector<std::int64_t> shape;
  float nan_at = -1;  // element index of a NaN
};

std::string write_small(const std::string& name, const std::map<std::string, Stack>& stacks) {
  const std::string d = test::temp_dir() + "/" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  std::ofstream(d + "/config.json") << small_config();
  io::SafetensorsWriter w;
  static std::vector<std::vector<std::byte>> keep;
  for (const auto& [key, st] : stacks) {
    std::size_t n = 1;
    for (auto v : st.shape) n *= static_cast<std::size_t>(v);
    std::vector<std::byte> bytes(n * io::dtype_size(st.dtype));
    for (std::size_t i = 0; i < n; ++i) {
      const float v = static_cast<float>(i % 7) * 0.125f - 0.25f;
      if (st.dtype == io::Dtype::BF16) {
        const bf16 b = static_cast<float>(i) == st.nan_at ? bf16(0x7fc0) : float_to_bf16(v);
        std::memcpy(bytes.data() + 2 * i, &b, 2);
      } else if (st.dtype == io::Dtype::F32) {
        std::memcpy(bytes.data() + 4 * i, &v, 4);
      } else {
        bytes[i] = std::byte{0x38};  // e4m3 1.0
      }
    }
    keep.push_back(std::move(bytes));
    w.add(key, st.dtype, st.shape, keep.back().data());
  }
  w.write(d + "/model.safetensors");
  return d;
}

const std::string kL = "model.layers.0.mlp.experts.";

}  // namespace

TEST_CASE("stacked expert tensor names", "[names][stacked]") {
  auto a = parse_stacked_expert_tensor_name("model.language_model.layers.7.mlp.experts.gate_up_proj");
  REQUIRE(a);
  CHECK(a->layer == 7);
  CHECK(a->kind == StackedExperts::gate_up);
  CHECK_FALSE(a->bias);
  auto b = parse_stacked_expert_tensor_name("model.layers.2.block_sparse_moe.experts.w2.weight");
  REQUIRE(b);
  CHECK(b->kind == StackedExperts::down);
  CHECK(b->projection_token == "w2");
  auto c = parse_stacked_expert_tensor_name("model.layers.1.mlp.experts.gate_up_proj_bias");
  REQUIRE(c);
  CHECK(c->bias);
  CHECK(c->kind == StackedExperts::gate_up);
  CHECK(parse_stacked_expert_tensor_name("model.layers.1.mlp.experts.down_proj.bias")->bias);
  CHECK_FALSE(parse_stacked_expert_tensor_name("model.layers.1.mlp.experts.3.gate_proj.weight"));    // per expert
  CHECK_FALSE(parse_stacked_expert_tensor_name("model.layers.1.mlp.experts.gate_up_proj_blocks"));    // gpt-oss MXFP4
  CHECK_FALSE(parse_stacked_expert_tensor_name("model.layers.1.mlp.shared_experts.gate_proj.weight"));
  CHECK_FALSE(parse_stacked_expert_tensor_name("model.layers.1.mlp.experts.lora_A.weight"));
  CHECK_FALSE(parse_stacked_expert_tensor_name("model.mlp.experts.gate_up_proj"));  // no layer
  CHECK_FALSE(parse_expert_tensor_name("model.layers.1.mlp.experts.gate_up_proj"));
  // GraniteMoE's names for the same two stacks
  auto g = parse_stacked_expert_tensor_name("model.layers.3.block_sparse_moe.input_linear.weight");
  REQUIRE(g);
  CHECK(g->layer == 3);
  CHECK(g->kind == StackedExperts::gate_up);
  CHECK(g->projection_token == "input_linear");
  CHECK(parse_stacked_expert_tensor_name("model.layers.3.block_sparse_moe.output_linear.weight")->kind == StackedExperts::down);
  CHECK(parse_stacked_expert_tensor_name("model.layers.3.block_sparse_moe.output_linear.bias")->bias);
  CHECK_FALSE(parse_stacked_expert_tensor_name("model.layers.3.block_sparse_moe.router.layer.weight"));
  CHECK_FALSE(parse_stacked_expert_tensor_name("model.layers.3.self_attention.experts.input_linear.weight"));  // JetMoE's MoA
  CHECK_FALSE(parse_stacked_expert_tensor_name("model.block_sparse_moe.input_linear.weight"));                 // no layer
}

TEST_CASE("configs of experts tilemoe does not compute are refused by name", "[config][stacked]") {
  std::string err = error_of([] {
    parse_model_config(R"({"model_type":"llama4","text_config":{"model_type":"llama4_text","hidden_size":5120,
      "intermediate_size":8192,"num_local_experts":16,"num_experts_per_tok":1,"num_hidden_layers":48}})", "l4");
  });
  CHECK(err.find("model_type 'llama4_text'") != std::string::npos);
  CHECK(err.find("router score") != std::string::npos);
}

TEST_CASE("fixture checkpoints restacked as transformers v5 writes them load the same bytes", "[checkpoint][stacked]") {
  for (const auto& c : test::fixture_cases()) {
    auto original = Checkpoint::open(c.dir + "/model");
    for (StackForm form : {StackForm::gate_up, StackForm::per_projection, StackForm::granite}) {
      const char* form_name = form == StackForm::gate_up ? "gate_up_proj" : form == StackForm::granite ? "input_linear" : "per projection";
      const std::string dir = test::temp_dir() + "/stacked_" + c.name + "_" + std::to_string(static_cast<int>(form));
      write_stacked_copy(c.dir + "/model", dir, form);
      auto stacked = Checkpoint::open(dir);
      for (int layer : c.layers) {
        INFO(c.name << " layer " << layer << " " << form_name);
        const auto refs = stacked.expert_tensors(layer);
        CHECK(refs[0][1].stacked());
        CHECK(refs[0][1].stacked_expert == 1);
        CHECK(refs[1][0].first_row == (form != StackForm::per_projection ? original.config().shape.intermediate : 0));
        CHECK(refs[1][0].bytes == original.expert_tensors(layer)[1][0].bytes);
        const auto want = original.load_layer_experts(layer);
        numa::ThreadPool pool(2, {});
        ExpertWeights got;
        std::size_t last_done = 0, last_total = 1;
        stacked.load_layer_experts(layer, got, [&](std::size_t d, std::size_t t) { last_done = d, last_total = t; }, &pool);
        CHECK(got.gate == want.gate);
        CHECK(got.up == want.up);
        CHECK(got.down == want.down);
        CHECK(last_done == last_total);
        CHECK(stacked.load_router(layer).weight == original.load_router(layer).weight);
      }
      // quantize reads the stacks and names the experts as the per-expert checkpoint did
      const int layer = c.layers.front();
      auto spec = quant::spec_for_checkpoint(stacked, WeightType::int8, 0, 1, {layer});
      auto want_spec = quant::spec_for_checkpoint(original, WeightType::int8, 0, 1, {layer});
      if (form == StackForm::per_projection || (form == StackForm::gate_up && c.name != "mixtral_tiny"))
        CHECK(spec.name_templates == want_spec.name_templates);
      if (form == StackForm::granite) {
        CHECK(spec.name_templates[0] == "model.layers.{L}.block_sparse_moe.experts.{E}.gate_proj");
        CHECK(spec.name_templates[1] == "model.layers.{L}.block_sparse_moe.experts.{E}.up_proj");
        CHECK(spec.name_templates[2] == "model.layers.{L}.block_sparse_moe.experts.{E}.down_proj");
      }
      const std::string out = dir + "_int8";
      fs::remove_all(out);
      {
        quant::QuantizedModelWriter w(out, spec);
        w.write_layer(layer, quant::quantize_experts(stacked.load_layer_experts(layer).view(), WeightType::int8, 0, nullptr));
        w.commit();
      }
      auto want_q = quant::quantize_experts(original.load_layer_experts(layer).view(), WeightType::int8, 0, nullptr);
      test::check_same_quantized(
          quant::load_quantized_layer(out, layer, original.config().shape, quant::checkpoint_fingerprint(stacked)), want_q);
    }
  }
}

TEST_CASE("malformed stacks are refused naming the file, layer and tensor", "[checkpoint][stacked]") {
  const std::int64_t E = kShape.num_experts, I = kShape.intermediate, H = kShape.hidden;
  auto load = [](const std::string& dir) { return error_of([&] { Checkpoint::open(dir).load_layer_experts(0); }); };

  // v5 form in f32 loads; per-expert and stacked forms may be mixed across projections.
  auto ok = write_small("ok", {{kL + "gate_up_proj", {io::Dtype::F32, {E, 2 * I, H}}},
                               {kL + "0.down_proj.weight", {io::Dtype::BF16, {H, I}}},
                               {kL + "1.down_proj.weight", {io::Dtype::BF16, {H, I}}},
                               {kL + "2.down_proj.weight", {io::Dtype::BF16, {H, I}}}});
  auto w = Checkpoint::open(ok).load_layer_experts(0);
  // expert 1's up rows start at element (1 * 2I + I) * H of the stack
  const std::size_t first_up = static_cast<std::size_t>(1 * 2 * I + I) * H;
  CHECK(bf16_to_float(w.up[static_cast<std::size_t>(I) * H]) == static_cast<float>(first_up % 7) * 0.125f - 0.25f);

  std::string err = load(write_small("transposed", {{kL + "gate_up_proj", {io::Dtype::BF16, {E, H, 2 * I}}},
                                                    {kL + "down_proj", {io::Dtype::BF16, {E, H, I}}}}));
  CHECK(err.find("model.safetensors: layer 0 experts: 'model.layers.0.mlp.experts.gate_up_proj' has shape [3, 24, 34]") !=
        std::string::npos);
  CHECK(err.find("[in, out]") != std::string::npos);

  err = load(write_small("count", {{kL + "gate_up_proj", {io::Dtype::BF16, {E + 1, 2 * I, H}}}}));
  CHECK(err.find("stacks 4 experts but config.json says 3") != std::string::npos);

  err = load(write_small("rank2", {{kL + "down_proj", {io::Dtype::BF16, {H, I}}}}));
  CHECK(err.find("'model.layers.0.mlp.experts.down_proj' has shape [24, 17], expected [3, 24, 17]") != std::string::npos);

  err = load(write_small("rows", {{kL + "gate_up_proj", {io::Dtype::BF16, {E, I, H}}}}));
  CHECK(err.find("has shape [3, 17, 24], expected [3, 34, 24] from config.json") != std::string::npos);

  err = load(write_small("fp8", {{kL + "gate_up_proj", {io::Dtype::F8_E4M3, {E, 2 * I, H}}}}));
  CHECK(err.find("is FP8 in a tensor that stacks the experts") != std::string::npos);

  err = load(write_small("bias", {{kL + "gate_up_proj", {io::Dtype::BF16, {E, 2 * I, H}}},
                                  {kL + "gate_up_proj_bias", {io::Dtype::BF16, {E, 2 * I}}},
                                  {kL + "down_proj", {io::Dtype::BF16, {E, H, I}}}}));
  CHECK(err.find("layer 0 experts has a bias ('model.layers.0.mlp.experts.gate_up_proj_bias')") != std::string::npos);

  err = load(write_small("twice", {{kL + "gate_up_proj", {io::Dtype::BF16, {E, 2 * I, H}}},
                                   {kL + "up_proj", {io::Dtype::BF16, {E, I, H}}},
                                   {kL + "down_proj", {io::Dtype::BF16, {E, H, I}}}}));
  CHECK(err.find("layer 0 expert 0 up: stored twice") != std::string::npos);
  err = load(write_small("twice_per_expert", {{kL + "gate_up_proj", {io::Dtype::BF16, {E, 2 * I, H}}},
                                              {kL + "2.up_proj.weight", {io::Dtype::BF16, {I, H}}},
                                              {kL + "down_proj", {io::Dtype::BF16, {E, H, I}}}}));
  CHECK(err.find("layer 0 expert 2 up: stored twice, as 'model.layers.0.mlp.experts.gate_up_proj' and "
                 "'model.layers.0.mlp.experts.2.up_proj.weight'") != std::string::npos);

  err = load(write_small("no_down", {{kL + "gate_up_proj", {io::Dtype::BF16, {E, 2 * I, H}}}}));
  CHECK(err.find("layer 0 expert 0 down weight is missing") != std::string::npos);
  CHECK(err.find("'...layers.0...experts.down_proj|w2' stacking every expert") != std::string::npos);

  // NaN in expert 2's up rows: named as expert 2 up of the stack, element counted in up's matrix.
  const float nan_at = static_cast<float>((2 * 2 * I + I) * H + 5);
  err = load(write_small("nan", {{kL + "gate_up_proj", {io::Dtype::BF16, {E, 2 * I, H}, nan_at}},
                                 {kL + "down_proj", {io::Dtype::BF16, {E, H, I}}}}));
  CHECK(err.find("layer 0 expert 2 up ('model.layers.0.mlp.experts.gate_up_proj', expert 2 of the stack)") != std::string::npos);
  CHECK(err.find("element 5 is NaN") != std::string::npos);
}
