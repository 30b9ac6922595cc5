// FP8 checkpoints (DeepSeek-V3/R1): F8_E4M3 expert weights with block scales load as the block-wise
// dequantization written out here, partial edge blocks included; broken scales are errors naming
// the file and tensor; and such a checkpoint quantizes to int8 without a bf16 copy of the model.
#include <filesystem>

#include "catch.hpp"
#include "numa/thread_pool.hpp"
#include "fp8_checkpoint.hpp"
#include "quantized_dir_util.hpp"
#include "src/model/checkpoint.hpp"
#include "src/quant/checkpoint_fingerprint.hpp"
#include "src/quant/quantized_file.hpp"
#include "test_util.hpp"

using namespace tilemoe;
using test::error_of;

namespace {

// Default options with some changed (designated initializers would warn about the others).
template <typename F>
test::Fp8Options options(F change) {
  test::Fp8Options o;
  change(o);
  return o;
}

// w[r][c] = e4m3(code[r][c]) * scale_inv[r / block_rows][c / block_cols], rounded once to bf16.
std::vector<bf16> dequantize_plainly(const test::Fp8Checkpoint& ck, Projection p, int e) {
  const int rows = projection_out(ck.shape, p), cols = projection_in(ck.shape, p);
  const auto& codes = ck.codes[static_cast<int>(p)][e];
  const auto& scales = ck.scale_inv[static_cast<int>(p)][e];
  std::vector<bf16> out;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const float s = scales[static_cast<std::size_t>(r / ck.opt.block_rows) * ck.scale_cols(p) + c / ck.opt.block_cols];
      out.push_back(float_to_bf16(f8e4m3_to_float(codes[static_cast<std::size_t>(r) * cols + c]) * s));
    }
  return out;
}

void check_loads_plainly(const test::Fp8Checkpoint& fp8) {
  auto ck = Checkpoint::open(fp8.dir);
  ExpertWeights w = ck.load_layer_experts(fp8.layer);
  const std::size_t per = static_cast<std::size_t>(fp8.shape.hidden) * fp8.shape.intermediate;
  for (Projection p : kProjections)
    for (int e = 0; e < fp8.shape.num_experts; ++e) {
      INFO(projection_name(p) << " expert " << e);
      const auto& got = p == Projection::gate ? w.gate : p == Projection::up ? w.up : w.down;
      const auto want = dequantize_plainly(fp8, p, e);
      CHECK(std::equal(want.begin(), want.end(), got.begin() + static_cast<std::ptrdiff_t>(per * e)));
    }
}

}  // namespace

TEST_CASE("FP8 experts with 128x128 block scales, edge blocks partial, load as plain block-wise dequantization", "[fp8][checkpoint]") {
  auto fp8 = test::write_fp8_checkpoint(test::temp_dir() + "/fp8");
  CHECK(fp8.scale_rows(Projection::gate) == 3);  // 300 rows: 128 + 128 + 44
  CHECK(fp8.scale_cols(Projection::gate) == 2);  // 200 columns: 128 + 72
  check_loads_plainly(fp8);
  // config.json without quantization_config: DeepSeek's 128 x 128.
  check_loads_plainly(test::write_fp8_checkpoint(test::temp_dir() + "/fp8_noconfig", options([](auto& o) { o.block_in_config = false; })));
  // Another block size, from quantization_config.weight_block_size.
  check_loads_plainly(test::write_fp8_checkpoint(test::temp_dir() + "/fp8_64x32", options([](auto& o) { o.block_rows = 64, o.block_cols = 32; })));
  // In parallel, into buffers reused from another layer's load: the same values.
  numa::ThreadPool pool(3, {});
  auto ck = Checkpoint::open(fp8.dir);
  ExpertWeights reused = ck.load_layer_experts(1);
  std::fill(reused.down.begin(), reused.down.end(), bf16{0x7fc0});
  std::size_t last_done = 0, last_total = 0;
  ck.load_layer_experts(1, reused, [&](std::size_t done, std::size_t total) { last_done = done, last_total = total; }, &pool);
  ExpertWeights plain = ck.load_layer_experts(1);
  CHECK(reused.gate == plain.gate);
  CHECK(reused.up == plain.up);
  CHECK(reused.down == plain.down);
  CHECK(last_done == last_total);
  CHECK(last_total == 3u * 2u * 300u * 200u);  // the FP8 bytes stored
  // The router loads as stored next to it.
  auto router = Checkpoint::open(fp8.dir).load_router(1);
  CHECK(router.correction_bias == std::vector<float>{0.5f, -0.5f});
}

TEST_CASE("FP8 errors: missing or misshapen scale_inv, NaN codes, bad block size", "[fp8][checkpoint][errors]") {
  const std::string dir = test::temp_dir() + "/fp8_bad";
  const std::string file = dir + "/model.safetensors";
  {
    auto fp8 = test::write_fp8_checkpoint(dir, options([](auto& o) { o.drop_one_scale = true; }));
    std::string err = error_of([&] { Checkpoint::open(dir).load_layer_experts(1); });
    INFO(err);
    CHECK(err.find(file) != std::string::npos);
    CHECK(err.find("layer 1 expert 1 up") != std::string::npos);
    CHECK(err.find("'model.layers.1.mlp.experts.1.up_proj.weight_scale_inv' is missing") != std::string::npos);
  }
  // One scale too few (as if the blocks had been [150, 100]), and one per element.
  for (std::vector<std::int64_t> shape : {std::vector<std::int64_t>{2, 2}, std::vector<std::int64_t>{300, 200}, std::vector<std::int64_t>{6}}) {
    auto fp8 = test::write_fp8_checkpoint(dir, options([&](auto& o) { o.gate_scale_shape = shape; }));
    std::string err = error_of([&] { Checkpoint::open(dir).load_layer_experts(1); });
    INFO(err);
    CHECK(err.find(file) != std::string::npos);
    CHECK(err.find("'model.layers.1.mlp.experts.0.gate_proj.weight_scale_inv' has shape") != std::string::npos);
    CHECK(err.find("expected [3, 2]: one scale per 128x128 block of the [300, 200] weight") != std::string::npos);
  }
  {
    auto fp8 = test::write_fp8_checkpoint(dir, options([](auto& o) { o.nan_code_at = 1234; }));
    std::string err = error_of([&] { Checkpoint::open(dir).load_layer_experts(1); });
    INFO(err);
    CHECK(err.find("layer 1 expert 0 up ('model.layers.1.mlp.experts.0.up_proj.weight'): element 1234 is NaN") != std::string::npos);
  }
  {
    auto fp8 = test::write_fp8_checkpoint(dir);
    std::ofstream(dir + "/config.json") << R"({"model_type": "deepseek_v3", "hidden_size": 200, "moe_intermediate_size": 300,
      "n_routed_experts": 2, "num_experts_per_tok": 1, "num_hidden_layers": 2, "first_k_dense_replace": 1,
      "quantization_config": {"weight_block_size": [128]}})";
    CHECK(error_of([&] { Checkpoint::open(dir); }).find(dir + "/config.json: quantization_config.weight_block_size must be two positive integers") !=
          std::string::npos);
  }
}

TEST_CASE("an FP8 checkpoint quantizes to int8 layer by layer, as its dequantized weights do", "[fp8][quant]") {
  auto fp8 = test::write_fp8_checkpoint(test::temp_dir() + "/fp8_to_int8");
  auto ck = Checkpoint::open(fp8.dir);
  const std::string out = test::temp_dir() + "/fp8_int8";
  std::filesystem::remove_all(out);
  {
    quant::QuantizedModelWriter w(out, quant::spec_for_checkpoint(ck, WeightType::int8, 0, 1, {1}));
    w.write_layer(1, quant::quantize_experts(ck.load_layer_experts(1).view(), WeightType::int8, 0, nullptr));
    w.commit();
  }
  auto want = quant::quantize_experts(ck.load_layer_experts(1).view(), WeightType::int8, 0, nullptr);
  test::check_same_quantized(quant::load_quantized_layer(out, 1, fp8.shape, quant::checkpoint_fingerprint(ck)), want);
}
