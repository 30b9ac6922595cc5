// The `tilemoe` command driven as a user drives it: real files in, exit status and files out.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <filesystem>
#include <tuple>
#include <vector>

#include "amx/isa.hpp"
#include "amx/one_row_tile_block.hpp"
#include "catch.hpp"
#include "cli_runner.hpp"
#include "fixture_cases.hpp"
#include "src/io/safetensors.hpp"
#include "src/io/safetensors_writer.hpp"
#include "test_util.hpp"

using namespace tilemoe;
namespace fs = std::filesystem;
using tilemoe::test::expect_failure;
using tilemoe::test::rel_error;
using tilemoe::test::run_cli;

namespace {

// The CLI's --input file, taken from a fixture's reference.safetensors.
std::string write_inputs(const io::SafetensorsFile& ref, int layer, const std::string& path) {
  std::string p = "layer_" + std::to_string(layer) + ".";
  io::SafetensorsWriter w;
  for (const char* key : {"input", "expert_ids", "weights", "grad_output"}) {
    const auto& t = ref.get(p + key);
    w.add(key, t.dtype, t.shape, ref.data(t));
  }
  w.write(path);
  return path;
}

}  // namespace

TEST_CASE("backward through the command line matches every fixture case", "[cli][fixtures]") {
  for (const auto& c : test::fixture_cases()) {
    SECTION(c.name) {
      auto ref = io::SafetensorsFile::open(c.dir + "/reference.safetensors");
      std::string converted = test::temp_dir() + "/" + c.name + ".lora";
      auto conv = run_cli("convert-lora --adapter " + c.dir + "/adapter --model " + c.dir + "/model --output " + converted);
      REQUIRE(conv.status == 0);
      for (int layer : c.layers) {
        std::string in = write_inputs(ref, layer, test::temp_dir() + "/in.safetensors");
        // Every implementation: the reference path, the portable kernels and the fastest this CPU has.
        // The last splits the layer over 3 virtual NUMA nodes.
        for (const auto& [isa, adapter, extra] :
             {std::tuple<std::string, std::string, std::string>{"reference", c.dir + "/adapter", ""}, {"reference", converted, ""},
              {"portable", converted, ""}, {"auto", c.dir + "/adapter", ""}, {"auto", converted, ""}, {"auto", converted, " --numa-nodes 3"},
              {"auto", converted, " --backward-weight-copy"}}) {
          std::string out = test::temp_dir() + "/out.safetensors";
          auto r = run_cli("backward --isa " + isa + " --model " + c.dir + "/model --layer " + std::to_string(layer) + " --adapter " +
                           adapter + " --input " + in + " --output " + out + extra);
          INFO(c.name << " layer " << layer << " isa " << isa << " adapter " << adapter << extra << ": " << r.err);
          REQUIRE(r.status == 0);
          auto got = io::SafetensorsFile::open(out);
          std::string p = "layer_" + std::to_string(layer) + ".";
          CHECK(rel_error(io::read_as_f32(got, "output"), io::read_as_f32(ref, p + "output")) <= 1e-2);
          CHECK(rel_error(io::read_as_f32(got, "grad_input"), io::read_as_f32(ref, p + "grad_input")) <= 1e-2);
          int grads = 0;
          for (const auto& t : got.tensors()) {
            if (t.name.rfind("grad.", 0) != 0 || t.name == "grad_input") continue;
            if (t.name.find("layers." + std::to_string(layer) + ".") == std::string::npos) FAIL("gradient of another layer: " << t.name);
            auto mine = io::read_as_f32(got, t.name);
            if (ref.find(t.name)) {
              INFO(t.name);
              CHECK(rel_error(mine, io::read_as_f32(ref, t.name)) <= 2e-2);
              ++grads;
            } else {
              for (float v : mine) REQUIRE(v == 0.0f);
            }
          }
          int want = 0;
          for (const auto& t : ref.tensors())
            if (t.name.rfind("grad.", 0) == 0 && t.name.find("layers." + std::to_string(layer) + ".") != std::string::npos) ++want;
          CHECK(grads == want);
          fs::remove(out);
        }
        // forward alone writes the same output
        std::string out = test::temp_dir() + "/fwd.safetensors";
        auto r = run_cli("forward --model " + c.dir + "/model --layer " + std::to_string(layer) + " --adapter " + converted +
                         " --input " + in + " --output " + out);
        REQUIRE(r.status == 0);
        auto got = io::SafetensorsFile::open(out);
        CHECK(rel_error(io::read_as_f32(got, "output"), io::read_as_f32(ref, "layer_" + std::to_string(layer) + ".output")) <= 1e-2);
        fs::remove(out);
      }
    }
  }
}

TEST_CASE("bad input exits 1 with one clear line and no output file", "[cli][errors]") {
  const std::string d = test::data_dir() + "/deepseek_tiny";
  const std::string tmp = test::temp_dir();
  const std::string out = tmp + "/never.safetensors";
  auto ref = io::SafetensorsFile::open(d + "/reference.safetensors");
  std::string good = write_inputs(ref, 1, tmp + "/good_in.safetensors");
  const std::string base = "forward --model " + d + "/model --adapter " + d + "/adapter --output " + out;

  expect_failure(base + " --layer 0 --input " + good, "layer 0 is not a MoE layer", out);
  expect_failure(base + " --layer 1 --input " + tmp + "/missing.safetensors", "missing.safetensors", out);
  expect_failure("forward --model " + tmp + "/nope --layer 1 --input " + good + " --output " + out, "nope", out);
  expect_failure(base + " --layer 1 --input " + good + " --isa sse2", "--isa 'sse2' is unknown", out);
  if (!kernels::isa_available(kernels::Isa::amx_bf16))
    expect_failure(base + " --layer 1 --input " + good + " --isa amx", "cannot run on this machine", out);

  SECTION("truncated input file") {
    std::ifstream in(good, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    for (std::size_t cut : {std::size_t(4), std::size_t(20), bytes.size() / 2, bytes.size() - 1}) {
      std::string p = tmp + "/trunc.safetensors";
      std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(cut));
      expect_failure(base + " --layer 1 --input " + p, "trunc.safetensors", out);
    }
  }
  SECTION("a header that lies about its length") {
    std::ifstream in(good, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::uint64_t huge = 1ull << 40;
    std::memcpy(bytes.data(), &huge, 8);
    std::string p = tmp + "/lying.safetensors";
    std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    expect_failure(base + " --layer 1 --input " + p, "lying.safetensors", out);
  }
  SECTION("wrong shapes, missing keys, ids out of range") {
    auto x = io::read_as_f32(ref, "layer_1.input");
    auto ids = io::read_as_i64(ref, "layer_1.expert_ids");
    auto w = io::read_as_f32(ref, "layer_1.weights");
    {
      io::SafetensorsWriter f;  // hidden 319 instead of 320
      std::vector<float> narrow(13 * 319, 0.1f);
      f.add_f32("input", {13, 319}, narrow);
      f.add("expert_ids", io::Dtype::I64, {13, 2}, ids.data());
      f.add_f32("weights", {13, 2}, w);
      f.write(tmp + "/narrow.safetensors");
      expect_failure(base + " --layer 1 --input " + tmp + "/narrow.safetensors", "expected [tokens, 320]", out);
    }
    {
      io::SafetensorsWriter f;
      f.add_f32("input", {13, 320}, x);
      f.add("expert_ids", io::Dtype::I64, {13, 2}, ids.data());
      f.write(tmp + "/noweights.safetensors");
      expect_failure(base + " --layer 1 --input " + tmp + "/noweights.safetensors", "'weights'", out);
    }
    {
      auto bad = ids;
      bad[7] = 8;  // the layer has experts 0..7
      io::SafetensorsWriter f;
      f.add_f32("input", {13, 320}, x);
      f.add("expert_ids", io::Dtype::I64, {13, 2}, bad.data());
      f.add_f32("weights", {13, 2}, w);
      f.write(tmp + "/badids.safetensors");
      expect_failure(base + " --layer 1 --input " + tmp + "/badids.safetensors", "expert_ids[3][1] = 8 is out of range", out);
    }
    {
      io::SafetensorsWriter f;
      f.add_f32("input", {13, 320}, x);
      f.add("expert_ids", io::Dtype::I64, {13, 2}, ids.data());
      f.add_f32("weights", {13, 3}, std::vector<float>(39, 0.3f));
      f.write(tmp + "/wshape.safetensors");
      expect_failure(base + " --layer 1 --input " + tmp + "/wshape.safetensors", "'weights'", out);
    }
  }
  SECTION("a broken checkpoint or adapter") {
    std::string model = tmp + "/model_copy", adapter = tmp + "/adapter_copy";
    fs::remove_all(model);
    fs::remove_all(adapter);
    fs::copy(d + "/model", model);
    fs::copy(d + "/adapter", adapter);
    for (auto& e : fs::directory_iterator(model)) fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
    for (auto& e : fs::directory_iterator(adapter)) fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
    const std::string args = " --layer 1 --input " + good + " --output " + out;
    // adapter_config.json says r=16 but the tensors have rank 8
    {
      std::ifstream in(adapter + "/adapter_config.json");
      std::stringstream ss;
      ss << in.rdbuf();
      std::string cfg = ss.str();
      cfg.replace(cfg.find("\"r\": 8"), 6, "\"r\": 16");
      std::ofstream(adapter + "/adapter_config.json") << cfg;
      expect_failure("forward --model " + d + "/model --adapter " + adapter + args, "rank 8 but adapter_config.json says 16", out);
    }
    // a shard cut short
    {
      std::string shard = model + "/model-00002-of-00002.safetensors";
      fs::resize_file(shard, fs::file_size(shard) - 100);
      expect_failure("forward --model " + model + args, "model-00002-of-00002.safetensors", out);
    }
  }
}

namespace {
// The command's standard output and exit status.
std::pair<int, std::string> cli_stdout(const std::string& args) {
  std::string cmd = std::string(TILEMOE_CLI) + " " + args + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p);
  std::string text;
  char buf[4096];
  for (std::size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) text.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, text};
}

// How many times `key` occurs in `text`.
std::size_t count_of(const std::string& text, const std::string& key) {
  std::size_t n = 0;
  for (std::size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + 1)) ++n;
  return n;
}
}  // namespace

TEST_CASE("info and demo run and succeed", "[cli]") {
  auto info = run_cli("info");
  CHECK(info.status == 0);
  {  // --json: one object with the measured limits
    auto [status, text] = cli_stdout("info --json");
    CHECK(status == 0);
    auto j = nlohmann::json::parse(text);
    CHECK(j["chosen_isa"] == kernels::isa_name(kernels::resolve_isa({})));
    CHECK(j["cores"].get<int>() >= 1);
    CHECK(j["numa_nodes"].size() >= 1);
    CHECK(j["measured"]["read_bandwidth_gbps"].get<double>() > 0);
    CHECK(j["isa"]["portable"]["available"] == true);
    // The AMX kernel's form for experts of at most 16 rows, where AMX is chosen (null elsewhere).
    if (kernels::resolve_isa({}) == kernels::Isa::amx_bf16) {
      CHECK(j["one_row_tile_block"] == kernels::one_row_tile_block_name(kernels::resolve_one_row_tile_block({})));
    } else {
      CHECK(j["one_row_tile_block"].is_null());
    }
  }
  auto demo = run_cli("demo --shape qwen3-30b --tokens 3 --lora-rank 4");
  INFO(demo.err);
  CHECK(demo.status == 0);
  auto help = run_cli("bench --help");
  CHECK(help.status == 0);
  auto bad = run_cli("bench --tokens 1,x");
  CHECK(bad.status == 1);
  CHECK(bad.err.find("'x' is not a non-negative integer") != std::string::npos);
}

TEST_CASE("info --model says what tilemoe reads of a checkpoint, and which layers do not read", "[cli][info]") {
  const std::string ds = test::data_dir() + "/deepseek_tiny/model";
  auto [status, text] = cli_stdout("info --model " + ds);
  CHECK(status == 0);
  CHECK(text.find("model_type 'deepseek_v2'") != std::string::npos);
  CHECK(text.find("router: softmax scores, greedy top-2, not renormalised, scaled by 1") != std::string::npos);
  CHECK(text.find("gate   model.layers.{L}.mlp.experts.{E}.gate_proj.weight") != std::string::npos);
  CHECK(text.find("every MoE layer's experts and router read") != std::string::npos);
  auto [jstatus, jtext] = cli_stdout("info --json --model " + test::data_dir() + "/mixtral_tiny/model");
  CHECK(jstatus == 0);
  auto j = nlohmann::json::parse(jtext);
  CHECK(j["model_type"] == "mixtral");
  CHECK(j["router"]["computed"] == true);
  CHECK(j["router"]["norm_topk_prob"] == true);
  REQUIRE(j["stored"].size() == 1);
  CHECK(j["stored"][0]["up"] == "model.layers.{L}.block_sparse_moe.experts.{E}.w3.weight");
  CHECK(j["stored"][0]["layers"] == j["moe_layers"]);
  CHECK(j["errors"].empty());

  // A type whose router tilemoe has not checked, and a layer with an expert missing: reported, status 1.
  const std::string broken = test::temp_dir() + "/info_broken";
  fs::remove_all(broken);
  fs::create_directories(broken);
  {
    std::ifstream in(ds + "/config.json");
    std::stringstream ss;
    ss << in.rdbuf();
    auto config = nlohmann::json::parse(ss.str());
    config["model_type"] = "brand_new_moe";
    std::ofstream(broken + "/config.json") << config.dump();
    // the fixture's two shards as one file, less one expert tensor
    std::vector<io::SafetensorsFile> shards;
    for (const char* f : {"/model-00001-of-00002.safetensors", "/model-00002-of-00002.safetensors"})
      shards.push_back(io::SafetensorsFile::open(ds + f));
    io::SafetensorsWriter w;
    for (const auto& src : shards)
      for (const auto& t : src.tensors())
        if (t.name != "model.layers.2.mlp.experts.1.up_proj.weight") w.add(t.name, t.dtype, t.shape, src.data(t));
    w.write(broken + "/model.safetensors");
  }
  auto [bstatus, btext] = cli_stdout("info --model " + broken);
  CHECK(bstatus == 1);
  CHECK(btext.find("router: not computed by tilemoe (tilemoe has not checked this type's router") != std::string::npos);
  CHECK(btext.find("layers 1, stored as") != std::string::npos);
  CHECK(btext.find("layer 2: not readable: ") != std::string::npos);
  CHECK(btext.find("layer 2 expert 1 up weight is missing") != std::string::npos);
  CHECK(btext.find("1 of 2 MoE layers do not read") != std::string::npos);

  // A checkpoint that says its experts are MXFP4 (gpt-oss's hub files): info names the weight type that keeps them.
  const std::string mx = test::temp_dir() + "/info_mxfp4";
  fs::remove_all(mx);
  fs::create_directories(mx);
  {
    std::ifstream in(ds + "/config.json");
    std::stringstream ss;
    ss << in.rdbuf();
    auto config = nlohmann::json::parse(ss.str());
    config["quantization_config"] = {{"quant_method", "mxfp4"}};
    std::ofstream(mx + "/config.json") << config.dump();
    for (const char* f : {"/model-00001-of-00002.safetensors", "/model-00002-of-00002.safetensors", "/model.safetensors.index.json"})
      if (fs::exists(ds + f)) fs::copy_file(ds + f, mx + f);
  }
  auto [mstatus, mtext] = cli_stdout("info --model " + mx);
  INFO(mtext);
  CHECK(mtext.find("quant_method 'mxfp4' (read as bf16 by default; --weights mxfp4 keeps the experts' MXFP4 values exactly") !=
        std::string::npos);
}

TEST_CASE("train-demo's loss falls, on the portable kernels and the fastest", "[cli][train]") {
  for (const char* isa : {"portable", "auto"}) {
    auto r = run_cli(std::string("train-demo --steps 60 --isa ") + isa);
    INFO(isa << ": " << r.err);
    CHECK(r.status == 0);  // exit 0 only when the final loss is below the first
  }
  auto bad = run_cli("train-demo --isa reference");
  CHECK(bad.status == 1);
  CHECK(bad.err.find("--isa reference is not one") != std::string::npos);
}

TEST_CASE("bench --onednn times the oneDNN baseline on the same cases and prints tilemoe's ratio to it", "[cli][bench]") {
  auto [status, json] = cli_stdout("bench --onednn --json --shape mini --tokens 1,20 --lora-rank 0 --layers 2 --iter-scale 0.05");
  CHECK(status == 0);
  std::istringstream in(json);
  int baseline_lines = 0;
  // oneDNN 2.6's bf16 matmul needs AVX-512 (AVX512-BF16 or its emulation on AVX512F); without it
  // the baseline runs in f32 and says so.
  const bool bf16_matmul = kernels::isa_available(kernels::Isa::avx512_bf16);
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"baseline\":\"onednn\"") == std::string::npos) continue;
    ++baseline_lines;
    INFO(line);
    CHECK((line.find("\"dtype\":\"bf16\"") != std::string::npos || (!bf16_matmul && line.find("\"dtype\":\"f32\"") != std::string::npos)));
    const auto ratio_at = line.find("\"ratio\":");
    REQUIRE(ratio_at != std::string::npos);
    CHECK(std::stod(line.substr(ratio_at + 8)) > 0.0);
    const auto diff_at = line.find("\"rel_diff\":");
    REQUIRE(diff_at != std::string::npos);
    CHECK(std::stod(line.substr(diff_at + 11)) <= 1e-2);  // the baseline computes the same layer
  }
  CHECK(baseline_lines == 2);
  CHECK(run_cli("bench --onednn --weights int8 --shape mini --tokens 1 --layers 1").status == 1);
}

// A layer's weights must have left the last-level cache when the bench calls it again. At few tokens
// a call reads a few experts of a layer, so the bench takes as many more layers (the device's int4 at
// 1 token read 30 MB a call and, on 4 layers, ran from its 315 MB cache at time/floor 0.66).
TEST_CASE("bench takes enough layers that a layer is called again after 4 LLCs of weights", "[cli][bench]") {
  auto header = [](const std::string& args) {
    auto [status, text] = cli_stdout("bench " + args);
    REQUIRE(status == 0);
    std::istringstream in(text);
    struct Header {
      int layers = 0;
      double reuse_mb = 0, llc_mb = 0;
      bool warned = false;
    } h;
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("weights: ", 0) == 0) h.layers = std::stoi(line.substr(line.find(", ") + 2));
      const std::string again = "a layer is called again after ";
      if (line.rfind(again, 0) != 0) continue;
      h.reuse_mb = std::stod(line.substr(again.size()));
      h.llc_mb = std::stod(line.substr(line.find("(LLC ") + 5));
      h.warned = line.find("may still be in cache") != std::string::npos;
    }
    return h;
  };
  const auto one = header("--shape mini --tokens 1,20 --lora-rank 0 --iter-scale 0.05");
  INFO("1 token: " << one.layers << " layers, " << one.reuse_mb << " MB between calls of a layer, LLC " << one.llc_mb << " MB");
  REQUIRE(one.llc_mb > 0);
  if (!one.warned) CHECK(one.reuse_mb >= 4 * one.llc_mb);  // the warning: memory bounded the layers
  // 20 tokens read more of each layer than 1 does: they need no more layers.
  const auto twenty = header("--shape mini --tokens 20 --lora-rank 0 --iter-scale 0.05");
  CHECK(twenty.layers <= one.layers);
  CHECK(twenty.layers >= 2);
  // --layers still decides when given, and the header then says how far apart the calls are.
  const auto given = header("--shape mini --tokens 1 --lora-rank 0 --layers 2 --iter-scale 0.05");
  CHECK(given.layers == 2);
  CHECK(given.reuse_mb < one.reuse_mb);
}

// The bench allocates a bf16 source and at least 2 layers a case: a shape that cannot fit is refused
// up front, naming what it needs, instead of being killed by the OOM killer half-way.
TEST_CASE("bench refuses a run that cannot fit in the memory available, before allocating it", "[cli][bench]") {
  double available_kib = 0;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);)
    if (line.rfind("MemAvailable:", 0) == 0) available_kib = std::stod(line.substr(13));
  if (available_kib == 0 || available_kib * 1024 > 60e9) {
    WARN("not checked: this machine has the 68 GB that DeepSeek-V3 in bf16 needs with one case (or no /proc/meminfo)");
    return;
  }
  test::expect_failure("bench --shape v3 --tokens 1 --lora-rank 0", "needs about 68 GB", "");
  test::expect_failure("bench --shape v3 --tokens 1 --lora-rank 0", "--weights int4", "");
  test::expect_failure("bench --shape v3 --weights int4 --group-size 32,128 --tokens 1 --lora-rank 0,16", "2 layers for each of 4 cases", "");
}

TEST_CASE("bench times the fine-tuning step", "[cli][bench]") {
  auto r = run_cli("bench --backward --shape mini --tokens 1,20 --lora-rank 4 --layers 2 --iter-scale 0.05 --json");
  INFO(r.err);
  CHECK(r.status == 0);
  auto o = run_cli("bench --backward --grad-overwrite --shape mini --tokens 3 --lora-rank 0 --layers 2 --iter-scale 0.05");
  CHECK(o.status == 0);
  auto c = run_cli("bench --backward --backward-weight-copy --shape mini --tokens 40 --lora-rank 4 --layers 2 --iter-scale 0.05");
  CHECK(c.status == 0);
}

TEST_CASE("bench reads LoRA factors stored as f32, bf16 or both in turns (--lora-dtype)", "[cli][bench]") {
  auto [status, json] = cli_stdout("bench --lora-dtype f32,bf16 --shape mini --tokens 1,40 --lora-rank 0,4 --layers 2 --iter-scale 0.05 --json");
  CHECK(status == 0);
  INFO(json);
  auto count = [&json = json](const std::string& key) { return count_of(json, key); };
  // Rank 0 has no factors to store: one case; rank 4 one per type. Two token counts.
  CHECK(count("\"lora_dtype\":\"none\"") == 2);
  CHECK(count("\"lora_dtype\":\"f32\"") == 2);
  CHECK(count("\"lora_dtype\":\"bf16\"") == 2);
  // Each LoRA case's cost over the r=0 case, from call-by-call ratios; the r=0 case has none.
  CHECK(count("\"lora_cost\":") == 4);
  auto b = run_cli("bench --backward --lora-dtype bf16 --shape mini --tokens 20 --lora-rank 4 --layers 2 --iter-scale 0.05");
  CHECK(b.status == 0);
  test::expect_failure("bench --lora-dtype f16 --shape mini --tokens 1 --layers 1", "--lora-dtype f16", "");
}

TEST_CASE("bench runs the AMX one-row tile forms as cases taking turns (--one-row-block)", "[cli][bench]") {
  auto [status, json] =
      cli_stdout("bench --one-row-block pairs,quads --shape mini --tokens 1,12 --lora-rank 0,4 --layers 2 --iter-scale 0.05 --json");
  CHECK(status == 0);
  INFO(json);
  auto count = [&json = json](const std::string& key) { return count_of(json, key); };
  // Two ranks x two forms x two token counts; each r=4 case's LoRA cost against the r=0 case of its form.
  CHECK(count("\"one_row_block\":\"pairs\"") == 4);
  CHECK(count("\"one_row_block\":\"quads\"") == 4);
  CHECK(count("\"lora_cost\":") == 4);
  test::expect_failure("bench --one-row-block quad --shape mini --tokens 1 --layers 1", "'quad' is not auto, pairs or quads", "");
  // "auto" (the default) reads TILEMOE_ONE_ROW_BLOCK, on every ISA.
  const auto env_bad = [] {
    test::ScopedEnv env("TILEMOE_ONE_ROW_BLOCK", "triples");
    return run_cli("bench --shape mini --tokens 1 --layers 1 --iter-scale 0.05");
  }();
  CHECK(env_bad.status == 1);
  CHECK(env_bad.err.find("TILEMOE_ONE_ROW_BLOCK 'triples'") != std::string::npos);
}

TEST_CASE("bench takes several int4 group sizes, each with its own layers, in one run; and mxfp4 weights", "[cli][bench]") {
  // The rows (standard output) are what is checked.
  const auto [json_status, json] =
      cli_stdout("bench --weights int4 --group-size 64,128,32 --shape mini --tokens 1,40 --lora-rank 0,4 --layers 2 --iter-scale 0.05 --json");
  REQUIRE(json_status == 0);
  // One line per token count, rank and group size, the groups in the order given.
  std::vector<int> groups;
  std::istringstream lines(json);
  for (std::string line; std::getline(lines, line);) {
    const auto at = line.find("\"group_size\":");
    if (at != std::string::npos) groups.push_back(std::stoi(line.substr(at + 13)));
  }
  CHECK(groups == std::vector<int>{64, 128, 32, 64, 128, 32, 64, 128, 32, 64, 128, 32});
  const auto [table_status, table] =
      cli_stdout("bench --weights int4 --group-size 64,128 --shape mini --tokens 1 --lora-rank 0 --layers 2 --iter-scale 0.05");
  REQUIRE(table_status == 0);
  INFO(table);
  CHECK(table.find("(group 64)") != std::string::npos);
  CHECK(table.find("(group 128)") != std::string::npos);
  CHECK(table.find("node_GB/s lora group") != std::string::npos);
  test::expect_failure("bench --weights int8 --group-size 64,128 --shape mini --tokens 1 --layers 1",
                       "several group sizes apply to int4 only", "");
  test::expect_failure("bench --weights int4 --group-size 64,48 --shape mini --tokens 1 --layers 1", "48", "");
  // mxfp4: its own kernels, a layer of 4.25 bits a weight, a floor at the bf16 peak.
  const auto [mx_status, mx] = cli_stdout("bench --weights mxfp4 --shape mini --tokens 1,40 --lora-rank 0,4 --layers 2 --iter-scale 0.05 --json");
  REQUIRE(mx_status == 0);
  INFO(mx);
  CHECK(mx.find("\"weights\":\"mxfp4\"") != std::string::npos);
  std::istringstream mx_lines(mx);
  int mx_cases = 0;
  for (std::string line; std::getline(mx_lines, line);)
    if (line.find("\"weights\":\"mxfp4\"") != std::string::npos && line.find("\"ms\":") != std::string::npos) ++mx_cases;
  CHECK(mx_cases == 4);
}
