#pragma once
// Runs the `tilemoe` command as a user would, for the test_cli* executables (TILEMOE_CLI is the
// built binary's path).
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "catch.hpp"
#include "test_util.hpp"

namespace tilemoe::test {

struct RunResult {
  int status;
  std::string err;
};

inline RunResult run_cli(const std::string& args) {
  std::string err_file = temp_dir() + "/stderr.txt";
  std::string cmd = std::string(TILEMOE_CLI) + " " + args + " > /dev/null 2> " + err_file;
  int raw = std::system(cmd.c_str());
  std::ifstream in(err_file);
  std::stringstream ss;
  ss << in.rdbuf();
  return {WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw), ss.str()};
}

// A failing command exits 1 with one line on stderr that names the problem, and writes nothing.
inline void expect_failure(const std::string& args, const std::string& must_mention, const std::string& output) {
  INFO("tilemoe " << args);
  auto r = run_cli(args);
  INFO("stderr: " << r.err);
  CHECK(r.status == 1);
  CHECK(r.err.find("tilemoe: error: ") == 0);
  CHECK(r.err.find(must_mention) != std::string::npos);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK_FALSE(std::filesystem::exists(output));
}

}  // namespace tilemoe::test
