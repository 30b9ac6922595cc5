// Catch2's implementation, compiled once for every test executable (tests/CMakeLists.txt): v2 is a
// single header whose implementation comes with CATCH_CONFIG_RUNNER, about half a minute of compile
// each time a main included it.
#include "catch_runner.hpp"

#if defined(TILEMOE_CATCH_V3)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

int run_catch_session(int argc, char** argv) { return Catch::Session().run(argc, argv); }
