// tilemoe::adamw_step, the optimizer step over the caller's arrays: segments of different step
// numbers in one call against a per-element float64 reference, the runtime's queue order, every
// ISA the machine has, and bad arguments that name the option or segment and update nothing.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "adamw_grid.hpp"
#include "amx/isa.hpp"
#include "catch.hpp"
#include "test_util.hpp"
#include "tilemoe/adamw.hpp"
#include "tilemoe/error.hpp"

using namespace tilemoe;

namespace {

struct Arrays {
  std::vector<float> p, g, m, v;
  explicit Arrays(std::size_t n, std::uint64_t seed) : p(n), g(n), m(n), v(n) {
    std::mt19937 rng(static_cast<std::mt19937::result_type>(seed));
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (std::size_t i = 0; i < n; ++i) p[i] = dist(rng), g[i] = dist(rng) * 1e-2f, m[i] = dist(rng) * 1e-3f, v[i] = std::abs(dist(rng)) * 1e-5f;
  }
  AdamWSegment segment(std::size_t begin, std::size_t count, std::int64_t step) {
    return {p.data() + begin, g.data() + begin, m.data() + begin, v.data() + begin, count, step};
  }
};

std::vector<std::string> runnable_isas() {
  std::vector<std::string> isas{"portable"};
  if (kernels::isa_available(kernels::Isa::avx512_bf16)) isas.push_back("avx512");
  if (kernels::isa_available(kernels::Isa::amx_bf16)) isas.push_back("amx");
  return isas;
}

}  // namespace

TEST_CASE("adamw_step updates each segment with its own step number, on every ISA", "[adamw][api]") {
  const test::AdamWHyper h{2e-3, 0.9, 0.999, 1e-8, 0.05};
  const AdamWOptions options{h.lr, h.beta1, h.beta2, h.eps, h.weight_decay};
  for (const std::string& isa : runnable_isas()) {
    for (int threads : {1, 3}) {
      INFO("isa " << isa << ", " << threads << " threads");
      Runtime rt({isa, threads});
      // 70,000 elements: several work items per segment; the segments are uneven and one is empty.
      const std::size_t n = 70001;
      Arrays a(n, 3);
      std::vector<double> p(a.p.begin(), a.p.end()), m(a.m.begin(), a.m.end()), v(a.v.begin(), a.v.end());
      std::vector<AdamWSegment> segs{a.segment(0, 17, 1), a.segment(17, 40000, 3), a.segment(40017, 0, 9), a.segment(40017, 29984, 250)};
      adamw_step(rt, options, segs.data(), segs.size());
      for (const AdamWSegment& s : segs)
        for (std::size_t i = static_cast<std::size_t>(s.param - a.p.data()), e = i + s.count; i < e; ++i) {
          const test::AdamWTerms terms = test::adamw_reference(h, s.step, a.g[i], p[i], m[i], v[i]);
          REQUIRE(std::abs(a.p[i] - p[i]) <= 1e-6 * terms.p);
          REQUIRE(std::abs(a.m[i] - m[i]) <= 1e-6 * terms.m);
          REQUIRE(std::abs(a.v[i] - v[i]) <= 1e-6 * v[i]);
        }
      // Bit-identical whatever the thread count: each element is updated alone.
      Arrays b(n, 3);
      Runtime one({isa, 1});
      std::vector<AdamWSegment> segs_b{b.segment(0, 17, 1), b.segment(17, 40000, 3), b.segment(40017, 0, 9), b.segment(40017, 29984, 250)};
      adamw_step(one, options, segs_b.data(), segs_b.size());
      REQUIRE(std::memcmp(a.p.data(), b.p.data(), n * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("adamw_step runs after the tasks already submitted to the runtime", "[adamw][api]") {
  Runtime rt({"auto", 2});
  Arrays a(1000, 5), b(1000, 5);
  // The submitted task writes the gradients the step then reads.
  rt.submit([&] { std::fill(a.g.begin(), a.g.end(), 0.25f); });
  AdamWSegment sa = a.segment(0, 1000, 1);
  adamw_step(rt, {}, &sa, 1);
  std::fill(b.g.begin(), b.g.end(), 0.25f);
  AdamWSegment sb = b.segment(0, 1000, 1);
  adamw_step(rt, {}, &sb, 1);
  REQUIRE(std::memcmp(a.p.data(), b.p.data(), a.p.size() * sizeof(float)) == 0);
  rt.sync();
}

TEST_CASE("adamw_step refuses bad options and segments, naming them, and updates nothing", "[adamw][api][errors]") {
  Runtime rt({"auto", 2});
  Arrays a(64, 7);
  const Arrays before = a;
  std::vector<AdamWSegment> good{a.segment(0, 32, 1), a.segment(32, 32, 2)};
  auto expect_refused = [&](const AdamWOptions& o, std::vector<AdamWSegment> segs, const std::string& says) {
    const std::string message = test::error_of([&] { adamw_step(rt, o, segs.data(), segs.size()); });
    INFO(message);
    CHECK(message.find(says) != std::string::npos);
    REQUIRE(a.p == before.p);
    REQUIRE(a.m == before.m);
    REQUIRE(a.v == before.v);
  };
  expect_refused({.lr = -1e-3}, good, "lr");
  expect_refused({.lr = NAN}, good, "lr");
  expect_refused({.beta1 = 1.0}, good, "beta1");
  expect_refused({.beta2 = -0.1}, good, "beta2");
  expect_refused({.eps = INFINITY}, good, "eps");
  expect_refused({.weight_decay = -0.01}, good, "weight_decay");
  std::vector<AdamWSegment> null_grad = good;
  null_grad[1].grad = nullptr;
  expect_refused({}, null_grad, "segment 1: an array is null");
  std::vector<AdamWSegment> step0 = good;
  step0[0].step = 0;
  expect_refused({}, step0, "segment 0: step 0");
  std::vector<AdamWSegment> overlapping = good;
  overlapping[1].param = a.p.data() + 31;  // one element of segment 0's parameters
  expect_refused({}, overlapping, "segments 0 and 1 write overlapping memory");
  std::vector<AdamWSegment> aliased = good;
  aliased[0].exp_avg = aliased[0].param;
  expect_refused({}, aliased, "segment 0: its param, exp_avg and exp_avg_sq overlap");
  expect_refused({}, {}, "(no error)");  // no segments: nothing to do
  const std::string null_list = test::error_of([&] { adamw_step(rt, {}, nullptr, 2); });
  CHECK(null_list.find("segments is null") != std::string::npos);
  // An empty segment may have null arrays.
  std::vector<AdamWSegment> empty{{nullptr, nullptr, nullptr, nullptr, 0, 0}};
  CHECK(test::error_of([&] { adamw_step(rt, {}, empty.data(), 1); }) == "(no error)");
}
