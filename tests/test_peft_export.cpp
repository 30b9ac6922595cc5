// LoRA back to PEFT: PEFT -> convert-lora -> export gives the same adapter, bit for bit, from a
// file or from LoRA held in memory; failures leave nothing behind.
#include <cmath>
#include <filesystem>
#include <fstream>

#include "adapter_compare.hpp"
#include "catch.hpp"
#include "fixture_cases.hpp"
#include "src/io/f32_encode.hpp"
#include "src/io/safetensors_writer.hpp"
#include "src/layer/synthetic_layer.hpp"
#include "src/lora/lora_file.hpp"
#include "src/lora/peft_export.hpp"
#include "src/model/checkpoint.hpp"
#include "test_util.hpp"
#include "tilemoe/error.hpp"

using namespace tilemoe;
namespace fs = std::filesystem;
using test::check_same_adapter;
using test::check_same_loaded_lora;
using test::file_text;

namespace {

using test::error_of;

std::string fresh_dir(const std::string& name) {
  std::string d = test::temp_dir() + "/" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::vector<std::string> dir_listing(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

const MoeShape kShape{24, 17, 3, 2};

ModelConfig tiny_model() {
  return parse_model_config(R"({"model_type": "deepseek_v2", "hidden_size": 24, "moe_intermediate_size": 17, "n_routed_experts": 3,
             "num_experts_per_tok": 2, "num_hidden_layers": 3, "first_k_dense_replace": 1, "moe_layer_freq": 1})",
                            "tiny config.json");
}

// What PEFT could save but the fixtures do not show: per-expert ranks (rank_pattern), F16 and F32
// next to BF16 (mixed even within one projection), attention LoRA, extra file metadata.
std::string make_mixed_adapter(const std::string& name) {
  std::string d = fresh_dir(name);
  std::ofstream(d + "/adapter_config.json")
      << R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "rank_pattern": {"layers.1.mlp.experts.2.gate_proj": 2,
  "layers.1.mlp.experts.2.up_proj": 2, "layers.1.mlp.experts.2.down_proj": 3}, "target_modules": ["gate_proj", "up_proj", "down_proj", "q_proj"]})";
  static std::vector<std::vector<std::byte>> keep;
  keep.clear();
  io::SafetensorsWriter w;
  auto add = [&](const std::string& key, io::Dtype dt, int rows, int cols) {
    auto v = random_activations(static_cast<std::size_t>(rows) * cols, keep.size() + 1, 0.3f);
    keep.emplace_back(v.size() * io::dtype_size(dt));
    io::convert_from_f32(v.data(), v.size(), dt, keep.back().data());
    w.add(key, dt, {rows, cols}, keep.back().data());
  };
  const char* proj_names[] = {"gate_proj", "up_proj", "down_proj"};
  for (auto [layer, e] : {std::pair{1, 0}, {1, 2}, {2, 1}})
    for (Projection p : kProjections) {
      int r = layer == 1 && e == 2 ? (p == Projection::down ? 3 : 2) : 4;
      io::Dtype da = p == Projection::gate ? io::Dtype::F16 : p == Projection::up ? io::Dtype::F32 : (e == 0 ? io::Dtype::BF16 : io::Dtype::F32);
      io::Dtype db = p == Projection::up ? io::Dtype::BF16 : da;
      std::string key = "base_model.model.model.layers." + std::to_string(layer) + ".mlp.experts." + std::to_string(e) + "." +
                        proj_names[static_cast<int>(p)];
      add(key + ".lora_A.weight", da, r, projection_in(kShape, p));
      add(key + ".lora_B.weight", db, projection_out(kShape, p), r);
    }
  add("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", io::Dtype::F32, 4, 24);
  add("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", io::Dtype::BF16, 24, 4);
  w.set_metadata("format", "pt");
  w.set_metadata("saved_by", "a test");
  w.write(d + "/adapter_model.safetensors");
  return d;
}

// The in-memory path: every layer loaded from `adapter_dir`, written back with its extras.
PeftExportStats export_in_memory(const std::string& adapter_dir, const ModelConfig& model, const std::vector<int>& layers,
                                 const std::string& out, ExportDtype dtype = ExportDtype::same) {
  auto adapter = PeftAdapter::open(adapter_dir, model);
  std::vector<LoadedLora> loaded;
  for (int l : layers) loaded.push_back(load_layer_lora(adapter_dir, model, l));
  std::vector<std::pair<int, const LoadedLora*>> refs;
  for (std::size_t i = 0; i < layers.size(); ++i) refs.emplace_back(layers[i], &loaded[i]);
  PeftExportOptions opt;
  opt.dtype = dtype;
  opt.extras = peft_extras(adapter);
  return write_peft_adapter(out, adapter.config(), refs, opt);
}

}  // namespace

TEST_CASE("f16 encoding gives every half back bit for bit and rounds to nearest even", "[export][dtype]") {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    INFO(h);
    REQUIRE(io::float_to_f16(f16_to_float(static_cast<std::uint16_t>(h))) == h);
  }
  CHECK(io::float_to_f16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);      // tie -> even
  CHECK(io::float_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);  // tie -> even
  CHECK(io::float_to_f16(65519.0f) == 0x7bff);
  CHECK(io::float_to_f16(65520.0f) == 0x7c00);
  CHECK(io::float_to_f16(-1e30f) == 0xfc00);
  CHECK(io::float_to_f16(std::ldexp(1.0f, -25)) == 0x0000);      // tie -> even (zero)
  CHECK(io::float_to_f16(3 * std::ldexp(1.0f, -25)) == 0x0002);  // tie -> even
  CHECK(std::isnan(f16_to_float(io::float_to_f16(std::nanf("")))));
}

TEST_CASE("every fixture adapter survives convert-lora and export unchanged", "[export][fixtures]") {
  for (const auto& c : test::fixture_cases()) {
    SECTION(c.name) {
      auto ck = Checkpoint::open(c.dir + "/model");
      auto adapter = PeftAdapter::open(c.dir + "/adapter", ck.config());
      std::string converted = test::temp_dir() + "/" + c.name + ".lora";
      convert_peft_to_lora_file(adapter, ck.config(), converted);

      std::string out = test::temp_dir() + "/" + c.name + ".from_file";
      fs::remove_all(out);
      auto st = export_lora_file(converted, out);
      CHECK(st.layers == static_cast<int>(c.layers.size()));
      CHECK(st.expert_tensors == adapter.expert_keys());
      CHECK(st.warnings.empty());
      check_same_adapter(c.dir + "/adapter", out);
      check_same_loaded_lora(c.dir + "/adapter", out, ck.config(), c.layers);
      CHECK(dir_listing(out) == std::vector<std::string>{"adapter_config.json", "adapter_model.safetensors"});

      std::string mem = test::temp_dir() + "/" + c.name + ".from_memory";
      fs::remove_all(mem);
      export_in_memory(c.dir + "/adapter", ck.config(), c.layers, mem);
      check_same_adapter(c.dir + "/adapter", mem);
    }
  }
}

TEST_CASE("per-expert ranks, mixed dtypes and non-expert keys round-trip exactly", "[export]") {
  auto model = tiny_model();
  std::string orig = make_mixed_adapter("mixed");
  auto adapter = PeftAdapter::open(orig, model);
  std::string converted = test::temp_dir() + "/mixed.lora";
  auto cs = convert_peft_to_lora_file(adapter, model, converted);
  CHECK(cs.other_keys == 2);
  auto f = io::SafetensorsFile::open(converted);
  CHECK(f.metadata().at("peft_dtype.layer_1.gate.a") == "F16");
  CHECK(f.metadata().at("peft_dtype.layer_1.down.a") == "BF16,,F32");  // expert 1 is not covered in layer 1
  CHECK(f.find("peft_verbatim.base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"));

  std::string out = test::temp_dir() + "/mixed.out";
  fs::remove_all(out);
  auto st = export_lora_file(converted, out);
  CHECK(st.other_tensors == 2);
  check_same_adapter(orig, out);
  check_same_loaded_lora(orig, out, model, {1, 2});
  auto got = io::SafetensorsFile::open(out + "/adapter_model.safetensors");
  // Written at the expert's own rank, not the layer's padded 4.
  CHECK(got.get("base_model.model.model.layers.1.mlp.experts.2.gate_proj.lora_A.weight").shape == std::vector<std::int64_t>{2, 24});
  CHECK(got.get("base_model.model.model.layers.1.mlp.experts.2.down_proj.lora_B.weight").shape == std::vector<std::int64_t>{24, 3});

  std::string mem = test::temp_dir() + "/mixed.mem";
  fs::remove_all(mem);
  export_in_memory(orig, model, {1, 2}, mem);
  check_same_adapter(orig, mem);
}

TEST_CASE("--dtype f32 and bf16 convert every float tensor, values kept or rounded", "[export][dtype]") {
  auto model = tiny_model();
  std::string orig = make_mixed_adapter("mixed_dtypes");
  std::string converted = test::temp_dir() + "/mixed_dtypes.lora";
  convert_peft_to_lora_file(PeftAdapter::open(orig, model), model, converted);
  auto want = io::SafetensorsFile::open(orig + "/adapter_model.safetensors");
  for (ExportDtype d : {ExportDtype::f32, ExportDtype::bf16}) {
    std::string out = test::temp_dir() + "/mixed_dtypes." + (d == ExportDtype::f32 ? "f32" : "bf16");
    fs::remove_all(out);
    export_lora_file(converted, out, d);
    auto got = io::SafetensorsFile::open(out + "/adapter_model.safetensors");
    REQUIRE(got.tensors().size() == want.tensors().size());
    for (const auto& t : want.tensors()) {
      INFO(t.name);
      const auto& g = got.get(t.name);
      CHECK(g.dtype == (d == ExportDtype::f32 ? io::Dtype::F32 : io::Dtype::BF16));
      CHECK(g.shape == t.shape);
      auto w = io::read_as_f32(want, t.name);
      if (d == ExportDtype::bf16)
        for (float& v : w) v = bf16_to_float(float_to_bf16(v));
      CHECK(io::read_as_f32(got, t.name) == w);
    }
  }
  CHECK(parse_export_dtype("bf16") == ExportDtype::bf16);
  CHECK_FALSE(parse_export_dtype("f16"));
}

TEST_CASE("LoRA trained in memory is written under its PEFT names", "[export]") {
  auto model = tiny_model();
  std::string orig = make_mixed_adapter("trained");
  LoadedLora l1 = load_layer_lora(orig, model, 1);
  auto& gate = l1.lora[Projection::gate];
  gate.a_of(2)[5] = 0.125f;           // as an optimizer step would
  gate.b_of(2)[3 * gate.rank + 1] = -2.0f;
  std::string out = test::temp_dir() + "/trained.out";
  fs::remove_all(out);
  PeftExportOptions opt;
  opt.dtype = ExportDtype::f32;
  auto st = write_peft_adapter(out, read_peft_config(orig), {{1, &l1}}, opt);
  CHECK(st.layers == 1);
  CHECK(st.expert_tensors == 12);
  CHECK(st.other_tensors == 0);
  auto got = io::SafetensorsFile::open(out + "/adapter_model.safetensors");
  CHECK(got.metadata() == std::map<std::string, std::string>{{"format", "pt"}});
  auto a = io::read_as_f32(got, "base_model.model.model.layers.1.mlp.experts.2.gate_proj.lora_A.weight");
  auto b = io::read_as_f32(got, "base_model.model.model.layers.1.mlp.experts.2.gate_proj.lora_B.weight");
  CHECK(a[5] == 0.125f);
  CHECK(b[3 * 2 + 1] == -2.0f);  // rank 2 unpadded: row 3, column 1
  CHECK(got.find("base_model.model.model.layers.2.mlp.experts.1.gate_proj.lora_A.weight") == nullptr);
  CHECK(file_text(out + "/adapter_config.json") == file_text(orig + "/adapter_config.json"));
}

TEST_CASE("a failed export leaves no new files and keeps an earlier export", "[export][errors]") {
  auto model = tiny_model();
  std::string orig = make_mixed_adapter("failing");
  LoadedLora l1 = load_layer_lora(orig, model, 1);
  PeftConfig config = read_peft_config(orig);
  // A key twice: the writer refuses it only once the whole layout is known, after the directory exists.
  PeftExportOptions clash;
  static std::vector<std::byte> bytes(4 * 24 * 4);
  clash.extras.tensors.push_back({l1.key_a(Projection::gate, 0), io::Dtype::F32, {4, 24}, bytes.data()});

  std::string fresh = test::temp_dir() + "/failing.new";
  fs::remove_all(fresh);
  CHECK(error_of([&] { write_peft_adapter(fresh, config, {{1, &l1}}, clash); }).find("added twice") != std::string::npos);
  CHECK_FALSE(fs::exists(fresh));

  std::string earlier = test::temp_dir() + "/failing.earlier";
  fs::remove_all(earlier);
  write_peft_adapter(earlier, config, {{1, &l1}});
  std::string before = file_text(earlier + "/adapter_model.safetensors");
  CHECK(error_of([&] { write_peft_adapter(earlier, config, {{1, &l1}}, clash); }).find("added twice") != std::string::npos);
  CHECK(file_text(earlier + "/adapter_model.safetensors") == before);
  CHECK(dir_listing(earlier) == std::vector<std::string>{"adapter_config.json", "adapter_model.safetensors"});

  LoadedLora unnamed = l1;
  unnamed.key_template_a = {};
  std::string out = test::temp_dir() + "/failing.unnamed";
  CHECK(error_of([&] { write_peft_adapter(out, config, {{1, &unnamed}}); }).find("layer 1 gate: LoRA without PEFT key names") == 0);
  CHECK(error_of([&] { write_peft_adapter(out, PeftConfig{}, {{1, &l1}}); }).find("json_text is empty") != std::string::npos);
  CHECK_FALSE(fs::exists(out));

  std::string not_lora = test::data_dir() + "/deepseek_tiny/reference.safetensors";
  CHECK(error_of([&] { export_lora_file(not_lora, out); }).find(not_lora + ": not a tilemoe LoRA file") == 0);
  CHECK(error_of([&] { export_lora_file(orig, out); }).find(orig + ": is a PEFT adapter directory already") == 0);
  CHECK(error_of([&] { export_lora_file(orig + "/missing.lora", out); }) == orig + "/missing.lora: no such file");
  std::string converted = test::temp_dir() + "/failing.lora";
  convert_peft_to_lora_file(PeftAdapter::open(orig, model), model, converted);
  CHECK(error_of([&] { export_lora_file(converted, converted); }).find(converted + ": exists and is not a directory") == 0);
  CHECK(error_of([&] { export_lora_file(converted, converted + "/sub"); }).find(converted + "/sub: cannot create the directory") == 0);
  CHECK_FALSE(fs::exists(out));
}

TEST_CASE("a format 1 file (no dtypes, no other keys) exports what it has, with a warning", "[export]") {
  auto model = tiny_model();
  std::string orig = make_mixed_adapter("v1");
  std::string v2 = test::temp_dir() + "/v1.v2.lora";
  convert_peft_to_lora_file(PeftAdapter::open(orig, model), model, v2);
  // The same file as the first convert-lora wrote it.
  auto f = io::SafetensorsFile::open(v2);
  io::SafetensorsWriter w;
  for (const auto& t : f.tensors())
    if (t.name.rfind(kVerbatimPrefix, 0) != 0) w.add(t.name, t.dtype, t.shape, f.data(t));
  for (const auto& [k, v] : f.metadata())
    if (k.rfind("peft_dtype.", 0) != 0 && k != kPeftFileMetadataKey) w.set_metadata(k, k == "format_version" ? "1" : v);
  std::string v1 = test::temp_dir() + "/v1.lora";
  w.write(v1);

  std::string out = test::temp_dir() + "/v1.out";
  fs::remove_all(out);
  auto st = export_lora_file(v1, out);
  REQUIRE(st.warnings.size() == 1);
  CHECK(st.warnings[0].find("older convert-lora") != std::string::npos);
  CHECK(st.other_tensors == 0);
  auto got = io::SafetensorsFile::open(out + "/adapter_model.safetensors");
  auto want = io::SafetensorsFile::open(orig + "/adapter_model.safetensors");
  CHECK(got.tensors().size() == want.tensors().size() - 2);
  for (const auto& t : got.tensors()) {
    INFO(t.name);
    CHECK(t.dtype == io::Dtype::F32);  // the mixed adapter was stored in F32
    CHECK(io::read_as_f32(got, t.name) == io::read_as_f32(want, t.name));
  }
}
