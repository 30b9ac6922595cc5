#pragma once
// Runs the Catch2 session. Its definition (tests/catch_runner.cpp) is the one object that compiles
// Catch2 v2's implementation, which the test mains would otherwise compile once each.
int run_catch_session(int argc, char** argv);
