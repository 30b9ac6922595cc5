// `tilemoe forward|backward --tokens N`: random hidden states routed by the checkpoint's own
// router, written out so that --input replays the run.
#include <filesystem>

#include "catch.hpp"
#include "cli_runner.hpp"
#include "fixture_cases.hpp"
#include "src/io/safetensors.hpp"
#include "src/model/checkpoint.hpp"
#include "src/routing/router.hpp"
#include "test_util.hpp"

using namespace tilemoe;
namespace fs = std::filesystem;
using tilemoe::test::expect_failure;
using tilemoe::test::rel_error;
using tilemoe::test::run_cli;

TEST_CASE("--tokens routes random inputs with the layer's router, and --input replays them", "[cli][router]") {
  for (const auto& c : test::fixture_cases()) {
    SECTION(c.name) {
      auto ck = Checkpoint::open(c.dir + "/model");
      const int layer = c.layers.back(), T = 9, H = ck.config().shape.hidden, k = ck.config().shape.top_k;
      const std::string tmp = test::temp_dir(), model = " --model " + c.dir + "/model --layer " + std::to_string(layer);
      for (const char* command : {"forward", "backward"}) {
        const bool backward = std::string(command) == "backward";
        INFO(c.name << " " << command);
        std::string first = tmp + "/random.safetensors", again = tmp + "/replay.safetensors";
        auto r = run_cli(std::string(command) + model + " --adapter " + c.dir + "/adapter --tokens " + std::to_string(T) + " --seed 5 --output " + first);
        INFO(r.err);
        REQUIRE(r.status == 0);
        auto got = io::SafetensorsFile::open(first);
        CHECK(got.get("input").dtype == io::Dtype::BF16);
        auto x = io::read_as_bf16(got, "input", std::vector<std::int64_t>{T, H});
        auto ids = io::read_as_i64(got, "expert_ids", std::vector<std::int64_t>{T, k});
        auto w = io::read_as_f32(got, "weights", std::vector<std::int64_t>{T, k});
        CHECK(io::read_as_f32(got, "output").size() == static_cast<std::size_t>(T) * H);
        CHECK((got.find("grad_output") != nullptr) == backward);
        CHECK((got.find("grad_input") != nullptr) == backward);

        // The routing written is the router's on the input written.
        Routing want = route_tokens(ck.config(), ck.load_router(layer), layer, x.data(), T);
        CHECK(ids == want.expert_ids);
        CHECK(w == want.weights);
        // Normal with std 1: the sample's spread says so (9 x H draws).
        double sq = 0;
        for (bf16 v : x) sq += static_cast<double>(bf16_to_float(v)) * bf16_to_float(v);
        CHECK(std::sqrt(sq / x.size()) == Approx(1.0).margin(0.05));

        // Replaying the file as --input gives the same results.
        auto replay = run_cli(std::string(command) + model + " --adapter " + c.dir + "/adapter --input " + first + " --output " + again);
        INFO(replay.err);
        REQUIRE(replay.status == 0);
        auto re = io::SafetensorsFile::open(again);
        CHECK(re.find("input") == nullptr);  // an --input run does not copy its inputs
        for (const auto& t : got.tensors()) {
          if (t.name == "input" || t.name == "expert_ids" || t.name == "weights" || t.name == "grad_output") continue;
          INFO(t.name);
          REQUIRE(re.find(t.name) != nullptr);
          CHECK(rel_error(io::read_as_f32(re, t.name), io::read_as_f32(got, t.name)) <= 1e-6);
        }

        // The same seed gives the same inputs; another seed others.
        std::string same = tmp + "/same.safetensors", other = tmp + "/other.safetensors";
        REQUIRE(run_cli(std::string(command) + model + " --tokens " + std::to_string(T) + " --seed 5 --output " + same).status == 0);
        REQUIRE(run_cli(std::string(command) + model + " --tokens " + std::to_string(T) + " --output " + other).status == 0);
        CHECK(io::read_as_bf16(io::SafetensorsFile::open(same), "input") == x);
        CHECK(io::read_as_bf16(io::SafetensorsFile::open(other), "input") != x);
        for (const auto& f : {first, again, same, other}) fs::remove(f);
      }
    }
  }
}

TEST_CASE("forward and backward need exactly one of --input and --tokens", "[cli][router][errors]") {
  const std::string d = test::data_dir() + "/deepseek_tiny";
  const std::string tmp = test::temp_dir(), out = tmp + "/never.safetensors";
  std::string in = tmp + "/in.safetensors";
  REQUIRE(run_cli("forward --model " + d + "/model --layer 1 --tokens 2 --output " + in).status == 0);
  for (const char* command : {"forward", "backward"}) {
    const std::string base = std::string(command) + " --model " + d + "/model --layer 1 --output " + out;
    expect_failure(std::string(command) + " --model " + d + "/model --layer 0 --output " + out + " --tokens 2", "layer 0 is not a MoE layer",
                   out);
    expect_failure(base, "give --input FILE (inputs and routing) or --tokens N", out);
    expect_failure(base + " --input " + in + " --tokens 4", "give --input FILE or --tokens N, not both", out);
    expect_failure(base + " --tokens 0", "--tokens must be in [1, 1048576], got 0", out);
    expect_failure(base + " --tokens -3", "--tokens must be in [1, 1048576], got -3", out);
    expect_failure(base + " --tokens 2000000", "--tokens must be in [1, 1048576], got 2000000", out);
    expect_failure(base + " --input " + in + " --seed 3", "--seed goes with --tokens", out);
  }
}
