#include "tilemoe/adamw.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "amx/adamw.hpp"
#include "amx/kernel_table.hpp"
#include "src/api/runtime_impl.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe {
namespace {

// Elements per work item: 64 KiB of each of the four arrays, enough that an item's fixed cost
// vanishes next to its memory time, small enough that uneven segments balance over the cores.
constexpr std::size_t kChunk = 16384;

void check_options(const AdamWOptions& o) {
  auto check = [](bool ok, const char* what, double value, const char* rule) {
    if (!ok) fail(ErrorKind::invalid_argument, std::string("adamw_step: ") + what + " = " + std::to_string(value) + ": " + rule);
  };
  check(std::isfinite(o.lr) && o.lr >= 0, "lr", o.lr, "must be finite and >= 0");
  check(o.beta1 >= 0 && o.beta1 < 1, "beta1", o.beta1, "must be in [0, 1)");
  check(o.beta2 >= 0 && o.beta2 < 1, "beta2", o.beta2, "must be in [0, 1)");
  check(std::isfinite(o.eps) && o.eps >= 0, "eps", o.eps, "must be finite and >= 0");
  check(std::isfinite(o.weight_decay) && o.weight_decay >= 0, "weight_decay", o.weight_decay, "must be finite and >= 0");
}

}  // namespace

void adamw_step(Runtime& rt, const AdamWOptions& options, const AdamWSegment* segments, std::size_t count) {
  check_options(options);
  if (count > 0 && segments == nullptr) fail(ErrorKind::invalid_argument, "adamw_step: segments is null with count > 0");
  for (std::size_t i = 0; i < count; ++i) {
    const AdamWSegment& s = segments[i];
    if (s.count == 0) continue;
    auto where = [i] { return "adamw_step: segment " + std::to_string(i) + ": "; };
    if (!s.param || !s.grad || !s.exp_avg || !s.exp_avg_sq) fail(ErrorKind::invalid_argument, where() + "an array is null");
    if (s.step < 1) fail(ErrorKind::invalid_argument, where() + "step " + std::to_string(s.step) + " (the first update is step 1)");
  }
  // Work items of different segments run at once: two segments updating the same parameters or
  // moments would race (and each would apply its own step), so they must not overlap.
  struct Span {
    std::uintptr_t begin, end;
    std::size_t segment;
  };
  std::vector<Span> spans;
  for (std::size_t i = 0; i < count; ++i) {
    const AdamWSegment& s = segments[i];
    if (s.count == 0) continue;
    const std::size_t bytes = s.count * sizeof(float);
    for (const float* a : {static_cast<const float*>(s.param), static_cast<const float*>(s.exp_avg), static_cast<const float*>(s.exp_avg_sq)})
      spans.push_back({reinterpret_cast<std::uintptr_t>(a), reinterpret_cast<std::uintptr_t>(a) + bytes, i});
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  for (std::size_t k = 1; k < spans.size(); ++k) {
    if (spans[k].begin >= spans[k - 1].end) continue;
    const std::size_t a = std::min(spans[k - 1].segment, spans[k].segment), b = std::max(spans[k - 1].segment, spans[k].segment);
    fail(ErrorKind::invalid_argument, a == b ? "adamw_step: segment " + std::to_string(a) + ": its param, exp_avg and exp_avg_sq overlap"
                                             : "adamw_step: segments " + std::to_string(a) + " and " + std::to_string(b) +
                                                   " write overlapping memory (param, exp_avg or exp_avg_sq)");
  }
  struct Item {
    const AdamWSegment* segment;
    std::size_t begin, end;
    kernels::AdamWCoefficients c;
  };
  std::vector<Item> items;
  for (std::size_t i = 0; i < count; ++i) {
    const AdamWSegment& s = segments[i];
    const kernels::AdamWCoefficients c =
        kernels::adamw_coefficients(options.lr, options.beta1, options.beta2, options.eps, options.weight_decay, s.step);
    for (std::size_t b = 0; b < s.count; b += kChunk) items.push_back({&s, b, std::min(s.count, b + kChunk), c});
  }
  Runtime::Impl& r = rt.impl();
  const kernels::AdamWUpdateFn update = kernels::kernel_table(r.isa).adamw_update;
  r.queue.run_now([&] {
    r.pool->parallel_for(items.size(), [&](std::size_t k, int) {
      const Item& it = items[k];
      const AdamWSegment& s = *it.segment;
      update(it.c, s.param + it.begin, s.grad + it.begin, s.exp_avg + it.begin, s.exp_avg_sq + it.begin, it.end - it.begin);
    });
  }, nullptr);
}

}  // namespace tilemoe
