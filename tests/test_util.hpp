#pragma once
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

#include "tilemoe/error.hpp"

namespace tilemoe::test {

template <typename A, typename B>
double rel_error(const A& got, const B& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    double d = static_cast<double>(got[i]) - static_cast<double>(ref[i]);
    num += d * d;
    den += static_cast<double>(ref[i]) * static_cast<double>(ref[i]);
  }
  return std::sqrt(num / (den > 0 ? den : 1.0));
}

// The message of the tilemoe::Error that f throws, or "(no error)".
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

inline std::string data_dir() { return TILEMOE_TEST_DATA; }

// A fresh directory per test process, removed at exit.
inline std::string temp_dir() {
  static std::string dir = [] {
    auto p = std::filesystem::temp_directory_path() / ("tilemoe_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(p);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(std::filesystem::temp_directory_path() / ("tilemoe_test_" + std::to_string(::getpid())), ec);
    });
    return p.string();
  }();
  return dir;
}

// Sets an environment variable (value nullptr: unsets it) for one scope and restores what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) saved_ = old, had_ = true;
    if (value) setenv(name, value, 1); else unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_, saved_.c_str(), 1); else unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::string saved_;
  bool had_ = false;
};

}  // namespace tilemoe::test
