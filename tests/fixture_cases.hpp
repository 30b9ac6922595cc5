#pragma once
// The PyTorch + PEFT reference cases in tests/data (copied from shared/fixtures).
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace tilemoe::test {

struct FixtureCase {
  std::string name, dir;
  std::vector<int> layers;
  int rank = 0;
};

inline std::vector<FixtureCase> fixture_cases() {
  std::vector<FixtureCase> out;
  for (const char* name : {"deepseek_tiny", "mixtral_tiny", "original_moe_tiny"}) {
    FixtureCase c;
    c.name = name;
    c.dir = data_dir() + "/" + name;
    std::ifstream in(c.dir + "/case.json");
    auto j = nlohmann::json::parse(in);
    c.layers = j["spec"]["layers"].get<std::vector<int>>();
    c.rank = j["spec"]["rank"].get<int>();
    out.push_back(c);
  }
  return out;
}

}  // namespace tilemoe::test
