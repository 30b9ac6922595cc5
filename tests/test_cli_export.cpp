// `tilemoe export-peft` driven as a user drives it: PEFT -> convert-lora -> export-peft gives the
// adapter back unchanged; bad input exits 1 with one line naming the file and writes nothing.
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "adapter_compare.hpp"
#include "catch.hpp"
#include "cli_runner.hpp"
#include "fixture_cases.hpp"
#include "src/model/model_config.hpp"
#include "test_util.hpp"

using namespace tilemoe;
namespace fs = std::filesystem;
using test::expect_failure;
using test::file_text;
using test::run_cli;

TEST_CASE("export-peft gives every fixture adapter back unchanged", "[cli][fixtures][export]") {
  for (const auto& c : test::fixture_cases()) {
    SECTION(c.name) {
      std::string converted = test::temp_dir() + "/" + c.name + ".lora";
      auto conv = run_cli("convert-lora --adapter " + c.dir + "/adapter --model " + c.dir + "/model --output " + converted);
      REQUIRE(conv.status == 0);
      for (const char* dtype : {"", " --dtype same", " --dtype bf16"}) {  // the fixtures are bf16: all three are exact
        std::string out = test::temp_dir() + "/" + c.name + ".peft";
        fs::remove_all(out);
        auto r = run_cli("export-peft --adapter " + converted + " --output " + out + dtype);
        INFO(dtype << ": " << r.err);
        REQUIRE(r.status == 0);
        CHECK(r.err.empty());  // no warnings, and no progress bar when stderr is not a terminal
        test::check_same_adapter(c.dir + "/adapter", out);
        test::check_same_loaded_lora(c.dir + "/adapter", out, read_model_config(c.dir + "/model"), c.layers);
      }
      // An existing directory is exported into; its other files stay.
      std::string out = test::temp_dir() + "/" + c.name + ".existing";
      fs::remove_all(out);
      fs::create_directories(out);
      std::ofstream(out + "/README.md") << "mine";
      REQUIRE(run_cli("export-peft --adapter " + converted + " --output " + out).status == 0);
      test::check_same_adapter(c.dir + "/adapter", out);
      CHECK(file_text(out + "/README.md") == "mine");
    }
  }
}

TEST_CASE("export-peft --dtype f32 widens every tensor exactly", "[cli][export]") {
  auto c = test::fixture_cases().front();
  std::string converted = test::temp_dir() + "/f32.lora";
  REQUIRE(run_cli("convert-lora --adapter " + c.dir + "/adapter --model " + c.dir + "/model --output " + converted).status == 0);
  std::string out = test::temp_dir() + "/f32.peft";
  fs::remove_all(out);
  REQUIRE(run_cli("export-peft --adapter " + converted + " --output " + out + " --dtype f32").status == 0);
  auto want = io::SafetensorsFile::open(c.dir + "/adapter/adapter_model.safetensors");
  auto got = io::SafetensorsFile::open(out + "/adapter_model.safetensors");
  REQUIRE(got.tensors().size() == want.tensors().size());
  for (const auto& t : want.tensors()) {
    INFO(t.name);
    CHECK(got.get(t.name).dtype == io::Dtype::F32);
    CHECK(io::read_as_f32(got, t.name) == io::read_as_f32(want, t.name));
  }
  expect_failure("export-peft --adapter " + converted + " --output " + out + ".f16 --dtype f16", "--dtype", out + ".f16");
}

TEST_CASE("export-peft errors: one line naming the file, exit 1, nothing written", "[cli][export][errors]") {
  auto c = test::fixture_cases().front();
  std::string converted = test::temp_dir() + "/errors.lora";
  REQUIRE(run_cli("convert-lora --adapter " + c.dir + "/adapter --model " + c.dir + "/model --output " + converted).status == 0);
  std::string out = test::temp_dir() + "/errors.out";

  std::string missing = test::temp_dir() + "/no_such.lora";
  expect_failure("export-peft --adapter " + missing + " --output " + out, missing + ": no such file", out);
  expect_failure("export-peft --adapter " + c.dir + "/adapter --output " + out,
                 c.dir + "/adapter: is a PEFT adapter directory already; export-peft takes a file written by `tilemoe convert-lora`", out);
  expect_failure("export-peft --adapter " + c.dir + "/reference.safetensors --output " + out,
                 c.dir + "/reference.safetensors: not a tilemoe LoRA file", out);
  std::string text = test::temp_dir() + "/not_safetensors.lora";
  std::ofstream(text) << "hello";
  expect_failure("export-peft --adapter " + text + " --output " + out, text, out);
  expect_failure("export-peft --output " + out, "--adapter is required", out);

  // The output is an existing file: refused, the file untouched.
  std::string file = test::temp_dir() + "/a_file";
  std::ofstream(file) << "keep me";
  expect_failure("export-peft --adapter " + converted + " --output " + file, file + ": exists and is not a directory",
                 file + "/adapter_config.json");
  CHECK(file_text(file) == "keep me");
  // A directory that cannot be made.
  expect_failure("export-peft --adapter " + converted + " --output " + file + "/sub", file + "/sub: cannot create the directory",
                 file + "/sub");
}

TEST_CASE("export-peft --help names its options", "[cli][export]") {
  std::string out = test::temp_dir() + "/help.txt";
  int raw = std::system((std::string(TILEMOE_CLI) + " export-peft --help > " + out + " 2>&1").c_str());
  REQUIRE(WIFEXITED(raw));
  CHECK(WEXITSTATUS(raw) == 0);
  std::string help = file_text(out);
  for (const char* opt : {"--adapter", "--output", "--dtype", "convert-lora", "same", "bf16", "f32"}) {
    INFO(opt);
    CHECK(help.find(opt) != std::string::npos);
  }
}
