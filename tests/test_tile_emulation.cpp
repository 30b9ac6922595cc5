// The software model of the AMX tiles (amx/tile_emulation.hpp) against straightforward
// arithmetic. Every build runs it: it is what CI's AMX tests stand on. The model against the
// real instructions is tests/isa/test_tile_emulation_amx.cpp, on AMX machines.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "amx/tile_config.hpp"
#include "amx/tile_emulation.hpp"
#include "catch.hpp"

using namespace tilemoe::kernels;
namespace emu = tilemoe::kernels::tile_emulation;

namespace {

struct Config {
  alignas(64) std::uint8_t bytes[64] = {};
  Config() { bytes[0] = 1; }
  Config& tile(int t, int rows, int colsb) {
    bytes[16 + 2 * t] = static_cast<std::uint8_t>(colsb & 0xff);
    bytes[17 + 2 * t] = static_cast<std::uint8_t>(colsb >> 8);
    bytes[48 + t] = static_cast<std::uint8_t>(rows);
    return *this;
  }
};

std::uint16_t bf16_bits(float f) {  // truncation is enough: the inputs only need to be bf16 values
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<std::uint16_t>(u >> 16);
}

float bf16_value(std::uint16_t b) {
  std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float float_at(const std::uint8_t* row, int n) {
  float f;
  std::memcpy(&f, row + 4 * n, 4);
  return f;
}

// Runs f in a child process: whether it ended by SIGABRT, as the model's faults do.
template <typename F>
bool aborts(F f) {
  const pid_t pid = fork();
  if (pid == 0) {
    std::fclose(stderr);  // the fault's message is expected; keep the test log clean
    f();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
}

}  // namespace

TEST_CASE("the model validates configurations as LDTILECFG does") {
  CHECK(emu::config_error(Config().tile(0, 16, 64).bytes).empty());
  CHECK(emu::config_error(Config().bytes).empty());  // palette 1, no tile used
  Config palette0;
  palette0.bytes[0] = 0;
  CHECK(emu::config_error(palette0.bytes).empty());
  Config palette2;
  palette2.bytes[0] = 2;
  CHECK(emu::config_error(palette2.bytes).find("palette 2") != std::string::npos);
  Config reserved = Config().tile(0, 16, 64);
  reserved.bytes[7] = 1;
  CHECK(emu::config_error(reserved.bytes).find("reserved byte 7") != std::string::npos);
  CHECK(emu::config_error(Config().tile(3, 17, 64).bytes).find("tmm3 has 17 rows") != std::string::npos);
  CHECK(emu::config_error(Config().tile(5, 16, 66).bytes).find("tmm5 has 66 bytes") != std::string::npos);
  CHECK(emu::config_error(Config().tile(9, 1, 4).bytes).find("tile 9") != std::string::npos);
  CHECK(emu::config_error(Config().tile(2, 0, 64).bytes).find("tmm2") != std::string::npos);
  // The kernels' own configurations are valid for every row split they use.
  for (int rows0 = 1; rows0 <= 16; ++rows0) {
    for (int rows1 : {rows0, 16}) {
      TileConfig cfg = make_tile_config(rows0, rows1);
      INFO(rows0 << "/" << rows1);
      CHECK(emu::config_error(&cfg).empty());
    }
  }
}

TEST_CASE("configurations are per thread, read back, and cleared by release") {
  Config cfg = Config().tile(0, 3, 12).tile(7, 16, 64);
  alignas(64) std::uint8_t back[64];
  emu::release();
  emu::store_config(back);
  CHECK(std::all_of(back, back + 64, [](std::uint8_t b) { return b == 0; }));
  emu::load_config(cfg.bytes);
  emu::store_config(back);
  CHECK(std::memcmp(back, cfg.bytes, 64) == 0);
  bool other_thread_unconfigured = false;
  std::thread([&] {
    alignas(64) std::uint8_t theirs[64];
    std::memset(theirs, 0xff, 64);
    emu::store_config(theirs);
    other_thread_unconfigured = std::all_of(theirs, theirs + 64, [](std::uint8_t b) { return b == 0; });
  }).join();
  CHECK(other_thread_unconfigured);
  emu::release();
  emu::store_config(back);
  CHECK(back[0] == 0);
}

TEST_CASE("loads read exactly the configured bytes and zero the rest; stores write only them") {
  const int rows = 5, colsb = 24;
  const long stride = 40;
  emu::load_config(Config().tile(1, rows, colsb).bytes);
  // Exactly the bytes the load may read: AddressSanitizer catches a read past the last row.
  std::vector<std::uint8_t> src(static_cast<std::size_t>((rows - 1) * stride + colsb));
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::uint8_t>(i * 7 + 1);
  emu::load(1, src.data(), stride);
  const std::uint8_t* t = emu::tile_bytes(1);
  for (int r = 0; r < emu::kMaxRows; ++r) {
    for (int b = 0; b < emu::kMaxRowBytes; ++b) {
      const std::uint8_t want = (r < rows && b < colsb) ? src[static_cast<std::size_t>(r * stride + b)] : 0;
      INFO("row " << r << " byte " << b);
      REQUIRE(t[r * emu::kMaxRowBytes + b] == want);
    }
  }
  std::vector<std::uint8_t> dst(static_cast<std::size_t>(rows * stride), 0xee);
  emu::store(1, dst.data(), stride);
  for (int r = 0; r < rows; ++r) {
    for (int b = 0; b < stride; ++b) {
      const std::uint8_t want = b < colsb ? src[static_cast<std::size_t>(r * stride + b)] : 0xee;
      REQUIRE(dst[static_cast<std::size_t>(r * stride + b)] == want);
    }
  }
  emu::zero(1);
  CHECK(std::all_of(t, t + emu::kMaxRows * emu::kMaxRowBytes, [](std::uint8_t b) { return b == 0; }));
  emu::release();
}

TEST_CASE("TDPBF16PS adds pairs of bf16 products to f32, on partial shapes") {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  struct Shape { int m, pairs, n; };
  for (Shape s : {Shape{16, 16, 16}, Shape{5, 3, 7}, Shape{1, 16, 1}, Shape{13, 11, 16}}) {
    INFO("m " << s.m << ", k pairs " << s.pairs << ", n " << s.n);
    emu::load_config(Config().tile(0, s.m, 4 * s.n).tile(4, s.m, 4 * s.pairs).tile(6, s.pairs, 4 * s.n).bytes);
    std::vector<float> c(static_cast<std::size_t>(s.m * s.n));
    std::vector<std::uint16_t> a(static_cast<std::size_t>(s.m * 2 * s.pairs)), b(static_cast<std::size_t>(s.pairs * 2 * s.n));
    for (float& v : c) v = normal(rng);
    for (auto& v : a) v = bf16_bits(normal(rng));
    for (auto& v : b) v = bf16_bits(normal(rng));
    emu::load(0, c.data(), 4L * s.n);
    emu::load(4, a.data(), 4L * s.pairs);
    emu::load(6, b.data(), 4L * s.n);
    emu::dot_bf16(0, 4, 6);
    emu::dot_bf16(0, 4, 6);  // twice: the accumulator is kept
    std::vector<float> got(c.size(), -1.0f);
    emu::store(0, got.data(), 4L * s.n);
    for (int m = 0; m < s.m; ++m) {
      for (int n = 0; n < s.n; ++n) {
        double want = c[m * s.n + n], scale = std::fabs(want);
        for (int rep = 0; rep < 2; ++rep) {
          for (int k = 0; k < 2 * s.pairs; ++k) {
            const double p = static_cast<double>(bf16_value(a[m * 2 * s.pairs + k])) *
                             bf16_value(b[(k / 2) * 2 * s.n + 2 * n + k % 2]);
            want += p;
            scale += std::fabs(p);
          }
        }
        REQUIRE(std::fabs(got[m * s.n + n] - want) <= 1e-6 * scale);
      }
    }
    // Columns of the C tile beyond its configured bytes read zero.
    if (s.n < 16) CHECK(float_at(emu::tile_bytes(0), s.n) == 0.0f);
  }
  emu::release();
}

TEST_CASE("TDPBF16PS reads denormal inputs as zero and flushes denormal results") {
  emu::load_config(Config().tile(0, 1, 4).tile(4, 1, 4).tile(6, 1, 4).bytes);
  const float tiny = std::numeric_limits<float>::min();  // the smallest normal f32
  std::uint16_t a[2] = {0x0001, bf16_bits(1.0f)};         // a denormal bf16, then 1
  std::uint16_t b[2] = {bf16_bits(1e30f), bf16_bits(tiny)};
  float c = 0;
  emu::load(0, &c, 4);
  emu::load(4, a, 4);
  emu::load(6, b, 4);
  emu::dot_bf16(0, 4, 6);
  float got = -1;
  emu::store(0, &got, 4);
  CHECK(got == tiny);  // the denormal x 1e30 (about 1e-10 if it counted) added nothing
  c = -tiny;           // -tiny + tiny / 2 is denormal: flushed to zero
  std::uint16_t half[2] = {0, bf16_bits(0.5f)};
  emu::load(0, &c, 4);
  emu::load(4, half, 4);
  emu::dot_bf16(0, 4, 6);
  emu::store(0, &got, 4);
  CHECK(got == 0.0f);
  CHECK(std::signbit(got));
  emu::release();
}

TEST_CASE("TDPBSSD adds signed byte quads to int32 that wraps") {
  std::mt19937 rng(9);
  std::uniform_int_distribution<int> byte(-128, 127);
  const int m = 7, quads = 9, n = 5;
  emu::load_config(Config().tile(2, m, 4 * n).tile(5, m, 4 * quads).tile(7, quads, 4 * n).bytes);
  std::vector<std::int32_t> c(m * n);
  std::vector<std::int8_t> a(m * 4 * quads), b(quads * 4 * n);
  for (auto& v : c) v = byte(rng) * 1000;
  c[0] = std::numeric_limits<std::int32_t>::max();
  for (auto& v : a) v = static_cast<std::int8_t>(byte(rng));
  for (auto& v : b) v = static_cast<std::int8_t>(byte(rng));
  a[0] = a[1] = a[2] = a[3] = 127;
  b[0] = b[1] = b[2] = b[3] = 127;  // C[0][0] overflows
  emu::load(2, c.data(), 4L * n);
  emu::load(5, a.data(), 4L * quads);
  emu::load(7, b.data(), 4L * n);
  emu::dot_s8(2, 5, 7);
  std::vector<std::int32_t> got(c.size());
  emu::store(2, got.data(), 4L * n);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      std::int64_t want = c[i * n + j];
      for (int k = 0; k < 4 * quads; ++k) want += a[i * 4 * quads + k] * b[(k / 4) * 4 * n + 4 * j + k % 4];
      const auto wrapped = static_cast<std::int32_t>(static_cast<std::uint32_t>(static_cast<std::uint64_t>(want)));
      INFO(i << "," << j);
      REQUIRE(got[i * n + j] == wrapped);
    }
  }
  CHECK(got[0] < 0);
  emu::release();
}

TEST_CASE("what the hardware faults on ends the process") {
  emu::release();
  std::uint8_t buf[1024] = {};
  CHECK(aborts([&] { emu::load(0, buf, 64); }));  // no configuration
  CHECK(aborts([&] {
    Config bad;
    bad.bytes[0] = 3;
    emu::load_config(bad.bytes);
  }));
  CHECK(aborts([&] {
    emu::load_config(Config().tile(0, 4, 64).bytes);
    emu::load(1, buf, 64);  // tmm1 is not configured
  }));
  CHECK(aborts([&] {
    emu::load_config(Config().tile(0, 4, 64).tile(4, 5, 64).tile(6, 16, 64).bytes);
    emu::dot_bf16(0, 4, 6);  // C has 4 rows, A 5
  }));
  CHECK(aborts([&] {
    emu::load_config(Config().tile(0, 4, 64).tile(4, 4, 32).tile(6, 16, 64).bytes);
    emu::dot_s8(0, 4, 6);  // A's 8 quads against B's 16 rows
  }));
  CHECK_FALSE(aborts([&] {
    emu::load_config(Config().tile(0, 4, 64).tile(4, 4, 64).tile(6, 16, 64).bytes);
    emu::dot_s8(0, 4, 6);
  }));
}
