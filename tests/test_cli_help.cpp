// Every subcommand answers --help with exit status 0 and nothing on stderr, and an unknown
// subcommand or option exits 1 with one line.
#include "catch.hpp"
#include "cli_runner.hpp"

using tilemoe::test::run_cli;

TEST_CASE("--help works on every command", "[cli]") {
  for (const char* cmd : {"", "forward", "backward", "convert-lora", "export-peft", "demo", "train-demo", "bench", "info"}) {
    INFO("tilemoe " << cmd << " --help");
    auto r = run_cli(std::string(cmd) + " --help");
    CHECK(r.status == 0);
    CHECK(r.err.empty());
  }
  for (const char* bad : {"no-such-command", "info --no-such-option"}) {
    INFO("tilemoe " << bad);
    auto r = run_cli(bad);
    CHECK(r.status == 1);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }
}
