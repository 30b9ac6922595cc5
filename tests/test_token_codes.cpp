// TokenCodes (src/layer/token_codes.hpp): each token is quantized by exactly one caller a call,
// every caller sees that caller's codes, prepare starts a call afresh, and a quantization that
// throws reaches its own caller while the token's other callers get an Error instead of waiting
// forever. Threads race for the same tokens; Catch's assertions stay on the main thread.
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "catch.hpp"
#include "src/layer/token_codes.hpp"
#include "tilemoe/error.hpp"

using namespace tilemoe;

namespace {

// The codes a token's quantization writes: its number and the call's, so a stale row shows.
std::int8_t code_of(int token, int call, std::size_t k) { return static_cast<std::int8_t>((token * 7 + call * 13 + static_cast<int>(k)) % 127); }

}  // namespace

TEST_CASE("TokenCodes quantizes each token once and every caller reads its codes", "[token_codes]") {
  constexpr int kTokens = 37, kThreads = 8, kRowsPerThread = 300;
  constexpr std::size_t kLd = 96;
  TokenCodes tc;
  for (int call = 0; call < 3; ++call) {
    tc.prepare(kTokens, kLd);
    std::vector<std::atomic<int>> runs(kTokens);
    std::atomic<int> wrong{0};
    std::vector<std::thread> threads;
    for (int w = 0; w < kThreads; ++w)
      threads.emplace_back([&, w] {
        for (int i = 0; i < kRowsPerThread; ++i) {
          const int t = (i * 5 + w * 11) % kTokens;
          float scale = -1;
          const std::int8_t* row = tc.get(
              t,
              [&](std::int8_t* codes, float* s) {
                runs[static_cast<std::size_t>(t)].fetch_add(1);
                std::this_thread::sleep_for(std::chrono::microseconds(20));  // others arrive meanwhile
                for (std::size_t k = 0; k < kLd; ++k) codes[k] = code_of(t, call, k);
                *s = 0.5f * static_cast<float>(t + call);
              },
              scale);
          bool ok = scale == 0.5f * static_cast<float>(t + call);
          for (std::size_t k = 0; k < kLd; ++k) ok = ok && row[k] == code_of(t, call, k);
          if (!ok) wrong.fetch_add(1);
        }
      });
    for (auto& th : threads) th.join();
    CHECK(wrong.load() == 0);
    for (int t = 0; t < kTokens; ++t) CHECK(runs[static_cast<std::size_t>(t)].load() == 1);
  }
}

// Instant quantizations: a caller that found a token fresh may try to claim it after its claimer
// has already published it. Claiming must not overwrite "ready" (every later caller would wait
// forever): a hang fails the run here instead of stalling it.
TEST_CASE("TokenCodes: racing callers of quick quantizations never wait forever", "[token_codes]") {
  constexpr int kTokens = 64, kThreads = 4, kCalls = 3000;
  TokenCodes tc;
  tc.prepare(kTokens, 64);
  std::atomic<int> wrong{0};
  int call = 0;
  // The barrier's completion starts the next call while every thread waits at it.
  std::barrier sync(kThreads, [&]() noexcept {
    ++call;
    tc.prepare(kTokens, 64);
  });
  auto* body = new std::future<void>(std::async(std::launch::async, [&] {
    std::vector<std::thread> threads;
    for (int w = 0; w < kThreads; ++w)
      threads.emplace_back([&, w] {
        for (int c = 0; c < kCalls; ++c) {
          const int tag = call % 50;
          for (int i = 0; i < kTokens; ++i) {
            const int t = (i * (w + 1)) % kTokens;
            float s = -1;
            const std::int8_t* row =
                tc.get(t, [&](std::int8_t* codes, float* sc) { codes[0] = static_cast<std::int8_t>(t + tag), *sc = float(t); }, s);
            if (row[0] != static_cast<std::int8_t>(t + tag) || s != float(t)) wrong.fetch_add(1);
          }
          sync.arrive_and_wait();
        }
      });
    for (auto& th : threads) th.join();
  }));
  // On a hang the future is left behind (its destructor would wait for the stuck threads).
  REQUIRE(body->wait_for(std::chrono::seconds(120)) == std::future_status::ready);
  std::unique_ptr<std::future<void>> owner(body);
  owner->get();
  CHECK(wrong.load() == 0);
}

TEST_CASE("TokenCodes grows for a larger call and keeps rows apart", "[token_codes]") {
  TokenCodes tc;
  tc.prepare(2, 64);
  float s = 0;
  tc.get(1, [](std::int8_t* c, float* sc) { c[0] = 5, *sc = 1; }, s);
  tc.prepare(1000, 192);
  CHECK(tc.ld() == 192);
  for (int t : {0, 999, 500}) {
    const std::int8_t* row = tc.get(t, [t](std::int8_t* c, float* sc) {
      for (int k = 0; k < 192; ++k) c[k] = static_cast<std::int8_t>(t % 100);
      *sc = static_cast<float>(t);
    }, s);
    CHECK(s == static_cast<float>(t));
    CHECK(row[0] == static_cast<std::int8_t>(t % 100));
    CHECK(row[191] == static_cast<std::int8_t>(t % 100));
  }
  // Token 0 again: quantized already this call, so the second quantizer is not run.
  bool ran = false;
  const std::int8_t* again = tc.get(0, [&](std::int8_t*, float*) { ran = true; }, s);
  CHECK_FALSE(ran);
  CHECK(again[5] == 0);
  CHECK(s == 0.0f);
}

TEST_CASE("TokenCodes: a failed quantization stops the token's other callers", "[token_codes]") {
  TokenCodes tc;
  tc.prepare(4, 64);
  std::atomic<bool> entered{false}, release{false};
  auto failing = std::async(std::launch::async, [&] {
    float s;
    tc.get(2, [&](std::int8_t*, float*) {
      entered = true;
      while (!release) std::this_thread::yield();
      throw std::runtime_error("quantizer failed");
    }, s);
  });
  while (!entered) std::this_thread::yield();
  // A second caller for token 2 waits for the first, then gets an Error of kind state naming it.
  auto waiting = std::async(std::launch::async, [&] {
    float s;
    tc.get(2, [](std::int8_t*, float*) {}, s);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  release = true;
  CHECK_THROWS_AS(failing.get(), std::runtime_error);
  REQUIRE(waiting.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
  try {
    waiting.get();
    FAIL("the waiting caller returned codes that were never written");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::state);
    CHECK(std::string(e.what()).find("token 2") != std::string::npos);
  }
  // Other tokens are unaffected, and the next call starts afresh.
  float s = 0;
  tc.get(3, [](std::int8_t* c, float* sc) { c[0] = 9, *sc = 2; }, s);
  CHECK(s == 2.0f);
  tc.prepare(4, 64);
  const std::int8_t* row = tc.get(2, [](std::int8_t* c, float* sc) { c[0] = 4, *sc = 3; }, s);
  CHECK(row[0] == 4);
  CHECK(s == 3.0f);
}
