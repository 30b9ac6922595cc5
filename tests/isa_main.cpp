// Main of the tests that need one ISA: on a CPU without it they report SKIPPED (exit 77, which
// CTest shows as "Skipped") instead of passing without having run.
#include <cstdio>

#include "amx/isa.hpp"
#include "catch_runner.hpp"

int main(int argc, char** argv) {
  using namespace tilemoe::kernels;
  auto isa = parse_isa(TILEMOE_REQUIRED_ISA);
  if (!isa || !isa_available(*isa)) {
    std::printf("SKIPPED: this CPU cannot run %s (%s)\n", TILEMOE_REQUIRED_ISA,
                isa ? isa_unavailable_reason(*isa).c_str() : "unknown ISA name");
    return 77;
  }
#if defined(TILEMOE_REQUIRE_REAL_TILES)
  if (cpu_features().amx_emulated) {
    std::printf("SKIPPED: this build emulates the AMX tiles (TILEMOE_AMX_EMULATION); the test needs the real ones\n");
    return 77;
  }
#endif
#if defined(TILEMOE_REQUIRE_EMULATED_TILES)
  if (!cpu_features().amx_emulated) {
    std::printf("SKIPPED: the test counts tile instructions, which only the emulated tiles of a TILEMOE_AMX_EMULATION build can\n");
    return 77;
  }
#endif
  return run_catch_session(argc, argv);
}
