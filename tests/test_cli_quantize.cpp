// `tilemoe quantize` driven as a user drives it: on the fixture checkpoints, a synthetic one of odd
// shape stored in F32, and an FP8 one, what it writes loads back as the checkpoint's experts
// quantized in memory; it reports the error it printed; bad arguments exit 1 with one line and
// leave no output behind.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "catch.hpp"
#include "cli_runner.hpp"
#include "fixture_cases.hpp"
#include "fp8_checkpoint.hpp"
#include "quantized_dir_util.hpp"
#include "src/io/safetensors_writer.hpp"
#include "src/layer/synthetic_layer.hpp"
#include "src/model/checkpoint.hpp"
#include "src/quant/checkpoint_fingerprint.hpp"
#include "src/quant/quantization_error.hpp"
#include "src/quant/quantized_file.hpp"
#include "test_util.hpp"

using namespace tilemoe;
namespace fs = std::filesystem;
using test::expect_failure;
using test::run_cli;

namespace {

struct Captured {
  int status;
  std::string out, err;
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Captured run_capturing(const std::string& args) {
  const std::string out = test::temp_dir() + "/stdout.txt", err = test::temp_dir() + "/stderr.txt";
  int raw = std::system((std::string(TILEMOE_CLI) + " " + args + " > " + out + " 2> " + err).c_str());
  return {WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw), read_text(out), read_text(err)};
}

// Runs quantize and checks that every layer it wrote is the checkpoint's layer quantized in
// memory, and that the error it printed is the error of those layers.
void check_quantize(const std::string& model, const std::string& out, const std::string& args, WeightType type, int group,
                    const std::vector<int>& layers) {
  fs::remove_all(out);
  INFO("tilemoe quantize --model " << model << " --output " << out << " " << args);
  auto r = run_capturing("quantize --model " + model + " --output " + out + " " + args);
  INFO(r.err);
  REQUIRE(r.status == 0);
  CHECK(r.err.empty());  // no warning, and no progress bar when stderr is not a terminal

  auto ck = Checkpoint::open(model);
  const auto info = quant::read_quantized_info(out);
  CHECK(info.layers == layers);
  CHECK(read_text(out + "/config.json") == read_text(model + "/config.json"));
  quant::QuantizationError error;
  for (int layer : layers) {
    INFO("layer " << layer);
    ExpertWeights w = ck.load_layer_experts(layer);
    auto want = quant::quantize_experts(w.view(), type, group, nullptr);
    error.add_layer(w.view(), want, nullptr);
    test::check_same_quantized(quant::load_quantized_layer(out, layer, ck.config().shape, quant::checkpoint_fingerprint(ck)), want);
    for (int node = 0; node < info.numa_nodes(); ++node)
      test::check_same_quantized(quant::load_quantized_layer_slice(out, layer, node, ck.config().shape),
                                 quant::slice_experts(want, info.slices[node]));
  }
  double gate = 0, up = 0, down = 0;
  const auto at = r.out.find("quantization error (norm-wise relative, dequantized vs bf16): ");
  REQUIRE(at != std::string::npos);
  REQUIRE(std::sscanf(r.out.c_str() + at, "quantization error (norm-wise relative, dequantized vs bf16): gate %lf, up %lf, down %lf", &gate,
                      &up, &down) == 3);
  CHECK(gate == Approx(error.relative(Projection::gate)).epsilon(1e-3));
  CHECK(up == Approx(error.relative(Projection::up)).epsilon(1e-3));
  CHECK(down == Approx(error.relative(Projection::down)).epsilon(1e-3));
}

// Qwen3-MoE naming, odd shape (hidden 75, intermediate 301, 3 experts), every layer MoE; F32 or
// BF16; `nan_layer` >= 0 puts a NaN in that layer's expert 1 down.
const MoeShape kOdd{75, 301, 3, 2};
std::string make_checkpoint(const std::string& name, io::Dtype dtype, int nan_layer = -1) {
  const std::string d = test::temp_dir() + "/" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  std::ofstream(d + "/config.json") << R"({"model_type": "qwen3_moe", "hidden_size": 75, "moe_intermediate_size": 301, "num_experts": 3,
    "num_experts_per_tok": 2, "num_hidden_layers": 3, "decoder_sparse_step": 1, "norm_topk_prob": true})";
  static std::vector<std::vector<std::byte>> keep;
  keep.clear();
  io::SafetensorsWriter w;
  const std::size_t per = static_cast<std::size_t>(kOdd.hidden) * kOdd.intermediate;
  for (int layer = 0; layer < 3; ++layer) {
    ExpertWeights ew = random_expert_weights(kOdd, 50 + static_cast<std::uint64_t>(layer));
    for (Projection p : kProjections) {
      const auto& src = p == Projection::gate ? ew.gate : p == Projection::up ? ew.up : ew.down;
      for (int e = 0; e < kOdd.num_experts; ++e) {
        std::vector<std::byte> bytes(per * io::dtype_size(dtype));
        for (std::size_t i = 0; i < per; ++i) {
          bf16 b = src[per * e + i];
          if (layer == nan_layer && e == 1 && p == Projection::down && i == 10) b = 0x7fc0;
          if (dtype == io::Dtype::F32) {
            const float f = bf16_to_float(b);
            std::memcpy(bytes.data() + 4 * i, &f, 4);
          } else {
            std::memcpy(bytes.data() + 2 * i, &b, 2);
          }
        }
        keep.push_back(std::move(bytes));
        const char* proj = p == Projection::gate ? "gate_proj" : p == Projection::up ? "up_proj" : "down_proj";
        w.add("model.layers." + std::to_string(layer) + ".mlp.experts." + std::to_string(e) + "." + proj + ".weight", dtype,
              {projection_out(kOdd, p), projection_in(kOdd, p)}, keep.back().data());
      }
    }
    keep.emplace_back(static_cast<std::size_t>(kOdd.num_experts) * kOdd.hidden * 2, std::byte{0x3c});
    w.add("model.layers." + std::to_string(layer) + ".mlp.gate.weight", io::Dtype::BF16, {kOdd.num_experts, kOdd.hidden}, keep.back().data());
  }
  w.write(d + "/model.safetensors");
  return d;
}

}  // namespace

TEST_CASE("quantize every fixture checkpoint: the directory holds the checkpoint's experts quantized", "[cli][quant][fixtures]") {
  for (const auto& c : test::fixture_cases()) {
    SECTION(c.name) {
      const std::string model = c.dir + "/model", out = test::temp_dir() + "/" + c.name + ".q";
      check_quantize(model, out, "--weights int8", WeightType::int8, 0, c.layers);
      check_quantize(model, out, "--weights int4 --group-size 64", WeightType::int4, 64, c.layers);
      check_quantize(model, out, "--weights mxfp4", WeightType::mxfp4, 32, c.layers);
      // The routers are copied as stored.
      auto ck = Checkpoint::open(model);
      auto router = io::SafetensorsFile::open(out + "/router.safetensors");
      CHECK(quant::read_quantized_info(out).router_layers == c.layers);
      for (int layer : c.layers)
        for (const auto& name : ck.router_tensor_names(layer)) {
          const auto& t = router.get(name);
          const auto* src = ck.file_of(name);
          const auto& s = src->get(name);
          CHECK(t.dtype == s.dtype);
          CHECK(t.shape == s.shape);
          CHECK(std::memcmp(router.data(t), src->data(s), s.nbytes) == 0);
        }
    }
  }
}

TEST_CASE("quantize a synthetic F32 checkpoint of odd shape: NUMA slices, --layers, default group", "[cli][quant]") {
  const std::string model = make_checkpoint("odd_f32", io::Dtype::F32);
  const std::string out = test::temp_dir() + "/odd.q";
  check_quantize(model, out, "--weights int4 --numa-nodes 3", WeightType::int4, quant::kDefaultInt4Group, {0, 1, 2});
  auto info = quant::read_quantized_info(out);
  CHECK(info.slices == quant::numa_slices(301, 3));
  CHECK(info.files.at(1) == std::vector<std::string>{"layer_1.node_0.safetensors", "layer_1.node_1.safetensors", "layer_1.node_2.safetensors"});
  CHECK(info.name_templates[0] == "model.layers.{L}.mlp.experts.{E}.gate_proj");
  check_quantize(model, out, "--weights int8 --numa-nodes 2 --layers 2,0 --threads 2", WeightType::int8, 0, {0, 2});
  CHECK_FALSE(fs::exists(out + "/layer_1.node_0.safetensors"));
  CHECK(quant::read_quantized_info(out).router_layers == std::vector<int>{0, 2});
  check_quantize(model, out, "--weights mxfp4 --numa-nodes 3", WeightType::mxfp4, 32, {0, 1, 2});
  CHECK(quant::read_quantized_info(out).group == 32);
}

TEST_CASE("quantize an FP8 checkpoint straight to int8", "[cli][quant][fp8]") {
  auto fp8 = test::write_fp8_checkpoint(test::temp_dir() + "/fp8_model");
  check_quantize(fp8.dir, test::temp_dir() + "/fp8.q", "--weights int8", WeightType::int8, 0, {1});
  check_quantize(fp8.dir, test::temp_dir() + "/fp8.q4", "--weights int4 --group-size 32 --numa-nodes 2", WeightType::int4, 32, {1});
}

TEST_CASE("quantize errors: one line naming the problem, exit 1, nothing written", "[cli][quant][errors]") {
  const std::string model = test::data_dir() + "/deepseek_tiny/model";
  const std::string out = test::temp_dir() + "/errors.q";
  const std::string base = "quantize --model " + model + " --output " + out;
  expect_failure("quantize --output " + out + " --weights int8", "--model is required", out);
  expect_failure(base + " --weights int3", "--weights", out);
  expect_failure(base + " --weights int8 --group-size 64", "--group-size applies to int4 only", out);
  expect_failure(base + " --weights mxfp4 --group-size 32", "--group-size applies to int4 only", out);
  expect_failure(base + " --weights int4 --group-size 48", "--group-size 48: int4 groups are 32, 64 or 128", out);
  expect_failure(base + " --weights int8 --numa-nodes 0", "--numa-nodes 0", out);
  expect_failure(base + " --weights int8 --numa-nodes 3", "intermediate size 176 has 2 block(s) of 128, too few for 3 nodes", out);
  expect_failure(base + " --weights int8 --layers 0", model + ": layer 0 is not a MoE layer (MoE layers: 1, 2)", out);
  expect_failure(base + " --weights int8 --layers 1,1", "--layers: layer 1 is listed twice", out);
  expect_failure(base + " --weights int8 --layers 1,x", "--layers: 'x' is not a layer index", out);
  expect_failure("quantize --model " + test::temp_dir() + "/nowhere --output " + out + " --weights int8", "/nowhere: not a directory", out);

  // A bad tensor in the second layer: the first layer's file, already written, is removed again.
  const std::string poisoned = make_checkpoint("poisoned", io::Dtype::BF16, 2);
  expect_failure("quantize --model " + poisoned + " --output " + out + " --weights int8",
                 "layer 2 expert 1 down ('model.layers.2.mlp.experts.1.down_proj.weight'): element 10 is NaN", out);

  // The output: a file, or a directory with something in it, is refused and left as it was.
  const std::string file = test::temp_dir() + "/a_file";
  std::ofstream(file) << "keep me";
  auto r = run_cli("quantize --model " + model + " --output " + file + " --weights int8");
  CHECK(r.status == 1);
  CHECK(r.err.find(file + ": exists and is not a directory") != std::string::npos);
  CHECK(read_text(file) == "keep me");
  fs::create_directories(out);
  std::ofstream(out + "/mine") << "mine";
  r = run_cli(base + " --weights int8");
  CHECK(r.status == 1);
  CHECK(r.err.find(out + ": is not empty") != std::string::npos);
  CHECK(read_text(out + "/mine") == "mine");
  CHECK(std::distance(fs::directory_iterator(out), fs::directory_iterator()) == 1);
}

TEST_CASE("quantize --help names its options", "[cli][quant]") {
  auto r = run_capturing("quantize --help");
  CHECK(r.status == 0);
  CHECK(r.err.empty());
  for (const char* opt : {"--model", "--output", "--weights", "int8", "int4", "--group-size", "--numa-nodes", "--layers", "--threads"}) {
    INFO(opt);
    CHECK(r.out.find(opt) != std::string::npos);
  }
}

TEST_CASE("forward and backward on int8/int4 weights: quantized at load or from a quantize directory", "[cli][quant][fixtures]") {
  for (const auto& c : test::fixture_cases()) {
    auto ref = io::SafetensorsFile::open(c.dir + "/reference.safetensors");
    const int layer = c.layers.front();
    const std::string p = "layer_" + std::to_string(layer) + ".";
    // The fixture's inputs as a --input file.
    io::SafetensorsWriter in;
    for (const char* key : {"input", "expert_ids", "weights", "grad_output"}) {
      const auto& t = ref.get(p + key);
      in.add(key, t.dtype, t.shape, ref.data(t));
    }
    const std::string input = test::temp_dir() + "/" + c.name + "_in.safetensors";
    in.write(input);
    const std::string base = "--model " + c.dir + "/model --layer " + std::to_string(layer) + " --adapter " + c.dir + "/adapter --input " +
                             input + " --output ";
    const std::string dir = test::temp_dir() + "/" + c.name + "_q4";
    REQUIRE(run_cli("quantize --model " + c.dir + "/model --output " + dir + " --weights int4 --group-size 32").status == 0);
    for (const auto& [weights, bar] : {std::pair<std::string, double>{"--weights int8", 2.5e-2}, {"--weights int4 --group-size 32", 0.15}}) {
      INFO(c.name << " " << weights);
      const std::string out = test::temp_dir() + "/" + c.name + "_out.safetensors";
      auto r = run_cli("backward " + base + out + " " + weights);
      INFO(r.err);
      REQUIRE(r.status == 0);
      auto got = io::SafetensorsFile::open(out);
      CHECK(test::rel_error(io::read_as_f32(got, "output"), io::read_as_f32(ref, p + "output")) <= bar);
      CHECK(test::rel_error(io::read_as_f32(got, "grad_input"), io::read_as_f32(ref, p + "grad_input")) <= bar);
      if (weights.find("int4") == std::string::npos) continue;
      // The quantize directory gives the same bits as quantizing at load, split over 2 nodes or not.
      for (const std::string extra : {"", " --numa-nodes 2"}) {
        const std::string out2 = test::temp_dir() + "/" + c.name + "_out2.safetensors";
        auto r2 = run_cli("backward " + base + out2 + " --quantized " + dir + extra);
        INFO(r2.err);
        REQUIRE(r2.status == 0);
        auto got2 = io::SafetensorsFile::open(out2);
        if (extra.empty()) {
          CHECK(io::read_as_f32(got2, "output") == io::read_as_f32(got, "output"));
          CHECK(io::read_as_f32(got2, "grad_input") == io::read_as_f32(got, "grad_input"));
        } else {
          CHECK(test::rel_error(io::read_as_f32(got2, "output"), io::read_as_f32(got, "output")) <= 3e-2);
          // Each node rounds its partial rows of dX to bf16 (about 2e-3 apart here).
          CHECK(test::rel_error(io::read_as_f32(got2, "grad_input"), io::read_as_f32(got, "grad_input")) <= 5e-3);
        }
      }
    }
    // The directory holds int4: asking for int8 from it is an error that names it.
    const std::string never = test::temp_dir() + "/never.safetensors";
    expect_failure("forward " + base + never + " --quantized " + dir + " --weights int8", dir, never);
    expect_failure("forward " + base + never + " --weights int4 --group-size 48", "--group-size 48", never);
    expect_failure("forward " + base + never + " --weights int5", "int5", never);
  }
}
