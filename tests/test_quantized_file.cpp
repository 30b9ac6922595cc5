// Quantized directories (src/quant/quantized_file.hpp): what is written is what is loaded, split
// over NUMA nodes or not, at shapes that are no multiple of anything; every kind of damage is an
// error naming the file and the tensor or field; and the quantization error of Gaussian weights
// stays where the issue puts it.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "catch.hpp"
#include "quantized_dir_util.hpp"
#include "src/layer/packed_experts.hpp"
#include "src/layer/synthetic_layer.hpp"
#include "numa/thread_pool.hpp"
#include "src/quant/quantization_error.hpp"
#include "src/quant/quantize_into.hpp"
#include "src/quant/quantized_file.hpp"
#include "test_util.hpp"

using namespace tilemoe;
using namespace tilemoe::quant;
namespace fs = std::filesystem;
using test::error_of;

namespace {

// hidden 75 is odd, so int4 gate/up rows end in a padding nibble; intermediate 301 is three
// blocks of 128 with a short odd last one, so down rows do too and NUMA slices are uneven.
const MoeShape kOdd{75, 301, 3, 2};

std::string fresh_path(const std::string& name) {
  std::string d = test::temp_dir() + "/" + name;
  fs::remove_all(d);
  return d;
}

QuantizedModelSpec spec_of(WeightType type, int group, int nodes, const MoeShape& shape = kOdd) {
  QuantizedModelSpec s;
  s.type = type;
  s.group = group;
  s.numa_nodes = nodes;
  s.layers = {1, 2};
  s.shape = shape;
  s.model_type = "deepseek_v2";
  s.name_templates = {"model.layers.{L}.mlp.experts.{E}.gate_proj", "model.layers.{L}.mlp.experts.{E}.up_proj",
                      "model.layers.{L}.mlp.experts.{E}.down_proj"};
  s.source_hash = "fnv1a64:0123456789abcdef";
  s.config_json = "{\"model_type\": \"deepseek_v2\"}\n";
  return s;
}

QuantizedExperts quantized_layer(const MoeShape& shape, WeightType type, int group, int layer) {
  ExpertWeights w = random_expert_weights(shape, 100 + static_cast<std::uint64_t>(layer));
  return quantize_experts(w.view(), type, group, nullptr);
}

// Writes layers 1 and 2 and returns what was written.
std::map<int, QuantizedExperts> write_dir(const std::string& dir, const QuantizedModelSpec& spec) {
  std::map<int, QuantizedExperts> out;
  QuantizedModelWriter w(dir, spec);
  for (int layer : spec.layers) {
    out[layer] = quantized_layer(spec.shape, spec.type, spec.group, layer);
    CHECK(w.write_layer(layer, out[layer]) > 0);
  }
  w.commit();
  return out;
}

std::string copy_of(const std::string& good, const std::string& name) {
  std::string d = fresh_path(name);
  fs::copy(good, d, fs::copy_options::recursive);
  return d;
}

// The error of loading layer 1 of `dir` (the whole layer, or one node's slice) names all of `parts`.
void expect_load_error(const std::string& dir, const std::vector<std::string>& parts, int node = -1, const MoeShape& shape = kOdd,
                       const std::string& hash = {}) {
  std::string err = error_of([&] {
    if (node < 0) load_quantized_layer(dir, 1, shape, hash);
    else load_quantized_layer_slice(dir, 1, node, shape, hash);
  });
  INFO(err);
  for (const auto& p : parts) {
    INFO("expected to mention: " << p);
    CHECK(err.find(p) != std::string::npos);
  }
}

std::string file_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void replace_in_file(const std::string& path, const std::string& from, const std::string& to) {
  std::string s = file_text(path);
  auto pos = s.find(from);
  REQUIRE(pos != std::string::npos);
  s.replace(pos, from.size(), to);
  std::ofstream(path, std::ios::trunc) << s;
}

std::vector<bf16> gaussian_bf16(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<bf16> v(n);
  for (auto& x : v) x = float_to_bf16(normal(rng));
  return v;
}

}  // namespace

TEST_CASE("NUMA slices: multiples of 128, as even as that allows, never empty", "[quant][numa]") {
  using S = std::vector<IntermediateSlice>;
  CHECK(numa_slices(1408, 1) == S{{0, 1408}});
  CHECK(numa_slices(1408, 2) == S{{0, 640}, {640, 1408}});  // 11 blocks: 5 + 6
  CHECK(numa_slices(1408, 4) == S{{0, 256}, {256, 640}, {640, 1024}, {1024, 1408}});
  CHECK(numa_slices(176, 2) == S{{0, 128}, {128, 176}});
  CHECK(numa_slices(301, 3) == S{{0, 128}, {128, 256}, {256, 301}});
  CHECK(numa_slices(100, 1) == S{{0, 100}});
  CHECK(error_of([] { numa_slices(176, 3); }).find("intermediate size 176 has 2 block(s) of 128, too few for 3 nodes") != std::string::npos);
  CHECK(error_of([] { numa_slices(176, 0); }).find("not a positive count") != std::string::npos);
}

TEST_CASE("expert name templates keep the checkpoint's own naming", "[quant][names]") {
  CHECK(expert_name_template("model.layers.3.mlp.experts.7.gate_proj.weight", 3, 7) == "model.layers.{L}.mlp.experts.{E}.gate_proj");
  CHECK(expert_name_template("model.layers.3.block_sparse_moe.experts.3.w2.weight", 3, 3) ==
        "model.layers.{L}.block_sparse_moe.experts.{E}.w2");
  CHECK(expert_name_template("layers.0.mlp.original_moe.experts.0.w1.weight", 0, 0) == "layers.{L}.mlp.original_moe.experts.{E}.w1");
  CHECK(expert_tensor_base("model.layers.{L}.block_sparse_moe.experts.{E}.w3", 12, 5) == "model.layers.12.block_sparse_moe.experts.5.w3");
  CHECK(error_of([] { expert_name_template("model.layers.3.mlp.experts.7.gate_proj.weight", 4, 7); }).find("layers.4") != std::string::npos);
}

TEST_CASE("quantize -> write -> load gives the same codes and scales, split over nodes or not", "[quant][file]") {
  struct Case {
    WeightType type;
    int group;
  };
  for (Case c : {Case{WeightType::int8, 0}, Case{WeightType::int4, 32}, Case{WeightType::int4, 128}, Case{WeightType::mxfp4, 32}}) {
    for (int nodes : {1, 2, 3}) {
      const std::string name = std::string(weight_type_name(c.type)) + "_g" + std::to_string(c.group) + "_n" + std::to_string(nodes);
      SECTION(name) {
        const std::string dir = fresh_path(name);
        const auto written = write_dir(dir, spec_of(c.type, c.group, nodes));
        const QuantizedModelInfo info = read_quantized_info(dir);
        CHECK(info.type == c.type);
        CHECK(info.group == c.group);
        CHECK(info.layers == std::vector<int>{1, 2});
        CHECK(info.slices == numa_slices(kOdd.intermediate, nodes));
        CHECK(info.source_hash == "fnv1a64:0123456789abcdef");
        CHECK(info.router_file.empty());
        CHECK(file_text(dir + "/config.json") == "{\"model_type\": \"deepseek_v2\"}\n");
        for (const auto& [layer, q] : written) {
          INFO("layer " << layer);
          test::check_same_quantized(load_quantized_layer(dir, layer, kOdd, "fnv1a64:0123456789abcdef"), q);
          for (int node = 0; node < nodes; ++node) {
            INFO("node " << node);
            test::check_same_quantized(load_quantized_layer_slice(dir, layer, node, kOdd), slice_experts(q, info.slices[node]));
          }
        }
        // The tensors carry the source's names, one .qweight and one .scales per expert projection.
        auto f = io::SafetensorsFile::open(dir + "/" + info.files.at(2).back());
        CHECK(f.tensors().size() == 2u * 3u * kOdd.num_experts);
        const auto& down = f.get("model.layers.2.mlp.experts.1.down_proj.qweight");
        CHECK(down.dtype == (c.type == WeightType::int8 ? io::Dtype::I8 : io::Dtype::U8));
        CHECK(f.get("model.layers.2.mlp.experts.1.gate_proj.scales").dtype == io::Dtype::F32);
        CHECK(f.metadata().at("format") == kQuantizedFormat);
        CHECK(f.metadata().at("layer") == "2");
      }
    }
  }
}

TEST_CASE("a slice is the layer's columns: reassembled slices are the layer", "[quant][numa]") {
  auto q = quantized_layer(kOdd, WeightType::int4, 64, 1);
  const auto slices = numa_slices(kOdd.intermediate, 3);
  for (Projection p : kProjections) {
    std::vector<float> whole(static_cast<std::size_t>(kOdd.hidden) * kOdd.intermediate);
    dequantize_expert(q[p], 2, whole.data());
    for (const auto& s : slices) {
      auto part = slice_experts(q, s);
      std::vector<float> piece(static_cast<std::size_t>(kOdd.hidden) * s.width());
      dequantize_expert(part[p], 2, piece.data());
      const int n = part[p].n, k = part[p].k;
      for (int r = 0; r < n; ++r)
        for (int c = 0; c < k; ++c) {
          const std::size_t at = p == Projection::down ? static_cast<std::size_t>(r) * kOdd.intermediate + s.begin + c
                                                       : static_cast<std::size_t>(s.begin + r) * kOdd.hidden + c;
          REQUIRE(piece[static_cast<std::size_t>(r) * k + c] == whole[at]);
        }
    }
  }
}

TEST_CASE("quantize_experts_into reuses its buffers and gives quantize_experts' codes", "[quant]") {
  numa::ThreadPool pool(3, {});
  QuantizedExperts q;
  ExpertWeights a = random_expert_weights(kOdd, 1), b = random_expert_weights(kOdd, 2);
  quantize_experts_into(a.view(), WeightType::int8, 0, &pool, q);
  test::check_same_quantized(q, quantize_experts(a.view(), WeightType::int8, 0, nullptr));
  quantize_experts_into(a.view(), WeightType::int4, 32, &pool, q);  // another type: new buffers
  test::check_same_quantized(q, quantize_experts(a.view(), WeightType::int4, 32, nullptr));
  const std::int8_t* codes = q[Projection::down].codes.data();
  quantize_experts_into(b.view(), WeightType::int4, 32, nullptr, q);  // same form: the same buffers, nothing stale
  CHECK(q[Projection::down].codes.data() == codes);
  test::check_same_quantized(q, quantize_experts(b.view(), WeightType::int4, 32, nullptr));
  CHECK(error_of([&] { quantize_experts_into(b.view(), WeightType::int4, 16, nullptr, q); }).find("group size 16") != std::string::npos);
}

TEST_CASE("the writer refuses what does not fit, and a failed run leaves nothing", "[quant][file][errors]") {
  const std::string dir = fresh_path("writer_errors");
  CHECK(error_of([&] { QuantizedModelWriter(dir, spec_of(WeightType::int4, 48, 1)); }).find("group size 48") != std::string::npos);
  CHECK(error_of([&] { QuantizedModelWriter(dir, spec_of(WeightType::int8, 0, 4)); }).find("too few for 4 nodes") != std::string::npos);
  auto dup = spec_of(WeightType::int8, 0, 1);
  dup.layers = {2, 1};
  CHECK(error_of([&] { QuantizedModelWriter(dir, dup); }).find("ascending") != std::string::npos);
  CHECK_FALSE(fs::exists(dir));
  {
    QuantizedModelWriter w(dir, spec_of(WeightType::int8, 0, 2));
    CHECK(error_of([&] { w.write_layer(1, quantized_layer(kOdd, WeightType::int4, 32, 1)); }).find("is int4 group 32") != std::string::npos);
    CHECK(error_of([&] { w.write_layer(3, quantized_layer(kOdd, WeightType::int8, 0, 3)); }).find("layer 3 is not one of") != std::string::npos);
    CHECK(error_of([&] { w.write_layer(1, quantized_layer({75, 300, 3, 2}, WeightType::int8, 0, 1)); }).find("another shape") !=
          std::string::npos);
    w.write_layer(1, quantized_layer(kOdd, WeightType::int8, 0, 1));
    CHECK(error_of([&] { w.write_layer(1, quantized_layer(kOdd, WeightType::int8, 0, 1)); }).find("written already") != std::string::npos);
    CHECK(error_of([&] { w.commit(); }).find("layer 2 was not written") != std::string::npos);
    CHECK(fs::exists(dir + "/layer_1.node_1.safetensors"));
  }
  CHECK_FALSE(fs::exists(dir));  // not committed: everything removed, the directory too

  // An existing empty directory is used, a non-empty one refused and left as it was.
  fs::create_directories(dir);
  std::ofstream(dir + "/mine.txt") << "keep";
  CHECK(error_of([&] { QuantizedModelWriter(dir, spec_of(WeightType::int8, 0, 1)); }).find(dir + ": is not empty") != std::string::npos);
  CHECK(file_text(dir + "/mine.txt") == "keep");
  fs::remove(dir + "/mine.txt");
  { QuantizedModelWriter w(dir, spec_of(WeightType::int8, 0, 1)); }
  CHECK(fs::exists(dir));  // not created by the writer: only its own files go
  CHECK(fs::is_empty(dir));
  std::ofstream(dir + "_file") << "x";
  CHECK(error_of([&] { QuantizedModelWriter(dir + "_file", spec_of(WeightType::int8, 0, 1)); }).find("exists and is not a directory") !=
        std::string::npos);
}

TEST_CASE("a damaged or mismatched directory is an error naming the file and tensor", "[quant][file][errors]") {
  // Written once; every section damages a copy (Catch runs the test case once per section).
  static const std::string good8 = [] {
    std::string d = fresh_path("good_int8");
    write_dir(d, spec_of(WeightType::int8, 0, 2));
    return d;
  }();
  static const std::string good4 = [] {
    std::string d = fresh_path("good_int4");
    write_dir(d, spec_of(WeightType::int4, 32, 3));
    return d;
  }();
  const std::string f8 = "/layer_1.node_0.safetensors", f8b = "/layer_1.node_1.safetensors";
  const std::string f4 = "/layer_1.node_2.safetensors";  // the odd-width last slice
  const std::string gate1 = "model.layers.1.mlp.experts.1.gate_proj", down2 = "model.layers.1.mlp.experts.2.down_proj";

  SECTION("wrong dtype") {
    auto d = copy_of(good8, "bad_dtype");
    test::rewrite_safetensors(d + f8, [&](test::StoredFile& s) { s[gate1 + ".qweight"].dtype = io::Dtype::U8; });
    expect_load_error(d, {d + f8, gate1 + ".qweight", "layer 1 expert 1 gate codes", "has dtype U8, expected I8"});
  }
  SECTION("wrong shape") {
    auto d = copy_of(good4, "bad_shape");
    test::rewrite_safetensors(d + f4, [&](test::StoredFile& s) {
      auto& t = s[down2 + ".scales"];
      t.shape = {kOdd.hidden, 1};
      t.bytes.resize(sizeof(float) * kOdd.hidden);
    });
    expect_load_error(d, {d + f4, down2 + ".scales", "has shape [75, 1], expected [75, 2]"});
    expect_load_error(d, {d + f4, down2 + ".scales"}, 2);
    CHECK_NOTHROW(load_quantized_layer_slice(d, 1, 0, kOdd));  // the other nodes' files are fine
  }
  SECTION("missing tensor") {
    auto d = copy_of(good8, "missing_tensor");
    test::rewrite_safetensors(d + f8b, [&](test::StoredFile& s) { s.erase(down2 + ".qweight"); });
    expect_load_error(d, {d + f8b, down2 + ".qweight", "is missing"});
  }
  SECTION("unexpected tensor") {
    auto d = copy_of(good8, "extra_tensor");
    test::rewrite_safetensors(d + f8, [&](test::StoredFile& s) {
      auto t = s[gate1 + ".scales"];
      t.name = "model.layers.1.mlp.experts.3.gate_proj.scales";
      s.tensors.push_back(t);
    });
    expect_load_error(d, {d + f8, "unexpected tensor 'model.layers.1.mlp.experts.3.gate_proj.scales'"});
  }
  SECTION("int8 code -128") {
    auto d = copy_of(good8, "code_128");
    test::rewrite_safetensors(d + f8b, [&](test::StoredFile& s) { s[down2 + ".qweight"].bytes[77] = std::byte{0x80}; });
    expect_load_error(d, {d + f8b, down2 + ".qweight", "holds the code -128 at element 77"});
  }
  SECTION("non-finite and negative scales") {
    for (float bad : {std::nanf(""), INFINITY, -0.5f}) {
      auto d = copy_of(good4, "bad_scale");
      test::rewrite_safetensors(d + f4, [&](test::StoredFile& s) { std::memcpy(s[gate1 + ".scales"].bytes.data() + 8, &bad, 4); });
      expect_load_error(d, {d + f4, gate1 + ".scales", "element 2 is", "scales must be finite and >= 0"});
    }
  }
  SECTION("mxfp4 scales that are not powers of two in range") {
    static const std::string good_mx = [] {
      std::string d = fresh_path("good_mxfp4");
      write_dir(d, spec_of(WeightType::mxfp4, 32, 3));
      return d;
    }();
    for (float bad : {0.75f, 0.0f, std::ldexp(1.0f, 126), std::ldexp(1.0f, -126)}) {
      INFO("scale " << bad);
      auto d = copy_of(good_mx, "bad_mx_scale");
      test::rewrite_safetensors(d + f4, [&](test::StoredFile& s) { std::memcpy(s[gate1 + ".scales"].bytes.data() + 8, &bad, 4); });
      expect_load_error(d, {d + f4, gate1 + ".scales", "element 2 is", "mxfp4 scales are powers of two in [2^-125, 2^125]"});
    }
  }
  SECTION("int4 padding nibble") {
    auto d = copy_of(good4, "padding");
    // down in the last slice has 45 inputs: 23 bytes a row, the last one's high nibble unused.
    test::rewrite_safetensors(d + f4, [&](test::StoredFile& s) { s[down2 + ".qweight"].bytes[23 * 4 + 22] |= std::byte{0x10}; });
    expect_load_error(d, {d + f4, down2 + ".qweight", "row 4", "padding nibble"});
  }
  SECTION("int8 down scales that differ between nodes") {
    auto d = copy_of(good8, "node_scales");
    test::rewrite_safetensors(d + f8b, [&](test::StoredFile& s) { s[down2 + ".scales"].bytes[0] ^= std::byte{1}; });
    expect_load_error(d, {d + f8b, down2 + ".scales", "differs from node 0's"});
  }
  SECTION("file metadata: version, type, layer, source") {
    struct M {
      const char* key;
      const char* value;
    };
    for (M m : {M{"format_version", "2"}, M{"weight_type", "int4"}, M{"layer", "2"}, M{"source_hash", "fnv1a64:ffffffffffffffff"},
                M{"slice_end", "256"}}) {
      INFO(m.key);
      auto d = copy_of(good8, "metadata");
      test::rewrite_safetensors(d + f8, [&](test::StoredFile& s) { s.metadata[m.key] = m.value; });
      expect_load_error(d, {d + f8, std::string("metadata '") + m.key + "' is '" + m.value + "' but quantization.json says"});
    }
    auto d = copy_of(good8, "metadata_missing");
    test::rewrite_safetensors(d + f8, [&](test::StoredFile& s) { s.metadata.erase("format"); });
    expect_load_error(d, {d + f8, "metadata 'format' is missing"});
    // Another layer's file in this layer's place.
    auto swapped = copy_of(good8, "swapped");
    fs::copy_file(swapped + "/layer_2.node_0.safetensors", swapped + f8, fs::copy_options::overwrite_existing);
    expect_load_error(swapped, {swapped + f8, "metadata 'layer' is '2'"});
  }
  SECTION("truncated and missing files") {
    auto d = copy_of(good4, "truncated");
    fs::resize_file(d + f4, fs::file_size(d + f4) - 100);
    expect_load_error(d, {d + f4});
    auto m = copy_of(good4, "missing_file");
    fs::remove(m + f4);
    expect_load_error(m, {m + f4, "cannot open"});
  }
  SECTION("quantization.json") {
    auto d = copy_of(good8, "index");
    const std::string index = d + "/quantization.json";
    replace_in_file(index, "\"format_version\": 1", "\"format_version\": 2");
    expect_load_error(d, {index, "'format_version' is 2, newer than this build reads (1)"});
    replace_in_file(index, "\"format_version\": 2", "\"format_version\": 1");
    replace_in_file(index, "\"weight_type\": \"int8\"", "\"weight_type\": \"int2\"");
    expect_load_error(d, {index, "'weight_type' is 'int2'"});
    replace_in_file(index, "\"weight_type\": \"int2\"", "\"weight_type\": \"int8\"");
    replace_in_file(index, "tilemoe.quantized_experts", "something.else");
    expect_load_error(d, {index, "'format' is 'something.else'"});
    replace_in_file(index, "something.else", "tilemoe.quantized_experts");
    replace_in_file(index, "\"hidden\": 75", "\"hiddne\": 75");
    expect_load_error(d, {index, "'shape.hidden' is missing"});
    std::ofstream(index, std::ios::trunc) << "{ not json";
    expect_load_error(d, {index, "not valid JSON"});
    fs::remove(index);
    expect_load_error(d, {index, "cannot open", "interrupted run"});
  }
  SECTION("a directory that does not fit the model") {
    expect_load_error(good8, {good8 + "/quantization.json", "shape.hidden is 75 but the model's hidden size is 76"}, -1, {76, 301, 3, 2});
    expect_load_error(good8, {"shape.intermediate is 301 but the model's expert intermediate size is 300"}, -1, {75, 300, 3, 2});
    expect_load_error(good8, {"shape.num_experts is 3 but the model's expert count is 4"}, 0, {75, 301, 4, 2});
    expect_load_error(good8, {"source.hash is fnv1a64:0123456789abcdef but the model checkpoint's is fnv1a64:1", "another checkpoint"}, -1,
                      kOdd, "fnv1a64:1");
    expect_load_error(good8, {"node 2 does not exist (numa_nodes 2)"}, 2);
    CHECK(error_of([&] { load_quantized_layer(good8, 5, kOdd); }).find("layer 5 was not quantized (layers: 1, 2)") != std::string::npos);
  }
}

TEST_CASE("quantization error of Gaussian weights against bf16", "[quant][error]") {
  // Large enough rows for the statistics, small enough to take milliseconds.
  const MoeShape s{512, 384, 2, 1};
  ExpertWeights w;
  w.shape = s;
  const std::size_t n = static_cast<std::size_t>(s.num_experts) * s.hidden * s.intermediate;
  w.gate = gaussian_bf16(n, 1);
  w.up = gaussian_bf16(n, 2);
  w.down = gaussian_bf16(n, 3);
  auto error_of_type = [&](WeightType type, int group) {
    auto q = quantize_experts(w.view(), type, group, nullptr);
    if (type == WeightType::int4) {
      // The quantizer's group scales are multiples of one scale per output channel, so the AMX
      // kernel takes its one-group path (pack_int.hpp).
      numa::ThreadPool pool(1, {});
      const PackedExpertWeights packed = PackedExpertWeights::pack_quantized(q, pool);
      for (Projection p : kProjections)
        for (int e = 0; e < s.num_experts; ++e) {
          INFO(projection_name(p) << " expert " << e << " group " << group);
          CHECK(packed.packed_int(p, e).column_scales != nullptr);
          CHECK(packed.packed_int(p, e).group_multiples != nullptr);
        }
    }
    QuantizationError sum;
    sum.add_layer(w.view(), q, nullptr);
    std::vector<float> ref, got;
    const std::size_t per = static_cast<std::size_t>(s.hidden) * s.intermediate;
    for (Projection p : kProjections) {
      std::vector<float> fa, fb(per * s.num_experts);
      for (int e = 0; e < s.num_experts; ++e) {
        dequantize_expert(q[p], e, fb.data() + per * e);
        for (std::size_t i = 0; i < per; ++i) fa.push_back(bf16_to_float(w.view().projection(p, e)[i]));
      }
      // What the quantize command reports: code * scale in f32 against the bf16 weights.
      CHECK(sum.relative(p) == Approx(test::rel_error(fb, fa)).epsilon(1e-6));
      ref.insert(ref.end(), fa.begin(), fa.end());
      got.insert(got.end(), fb.begin(), fb.end());
    }
    const double e = test::rel_error(got, ref);
    std::printf("quantization error, Gaussian weights vs bf16: %s group %d: %.4f\n", weight_type_name(type), group, e);
    return e;
  };
  const double e8 = error_of_type(WeightType::int8, 0);
  CHECK(e8 <= 1e-2);  // ~0.75e-2; the bar for the output is 2.5e-2
  const double e32 = error_of_type(WeightType::int4, 32), e64 = error_of_type(WeightType::int4, 64),
               e128 = error_of_type(WeightType::int4, 128);
  CHECK(e32 <= 9e-2);
  CHECK(e128 <= 1.2e-1);
  CHECK(e32 < e64);
  CHECK(e64 < e128);
  CHECK(e8 > 1e-3);  // a quantizer that changes nothing would not be quantizing
}
