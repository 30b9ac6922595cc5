// tilemoe_expert_product_probe: one expert's product as the forward's items run it
// (gemm_bf16_amx or gemm_int_amx over one item's columns, A in tile order), on one pinned thread,
// with the weights of many experts taken in turn so that they come from memory, and A either
// kept (in cache) or cycling over several experts' (from L3). It says where one thread's product
// loses its rate: the kernels' loop (weights and A in cache), the weights' stream, or A's reads.
//
// On the repository's AMX machine (2 vCPUs, KVM; session 62), int8, m = 384, n = 256, K = 2048,
// median TOP/s: weights and A in cache 2.39-2.40; weights of 1200 experts from memory 1.96-2.05;
// and A cycling over 64 experts' as well 1.67-1.72 (docs/perf.md, session 62).
//
// Usage: tilemoe_expert_product_probe [--weights bf16|int8] [--rows M] [--columns N] [--k K]
//          [--experts E] [--a-buffers A] [--calls-per-a C] [--rounds R] [--cpu N]
// --experts: weight matrices taken in turn (enough to exceed the last-level cache for "from
// memory"); --a-buffers: distinct A taken in turn, each for --calls-per-a calls in a row (2: gate
// then up on one A, as a gate_up item).
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "amx/aligned_vector.hpp"
#include "amx/gemm_bf16.hpp"
#include "amx/gemm_int.hpp"
#include "amx/isa.hpp"
#include "amx/pack_bf16.hpp"
#include "amx/pack_int.hpp"

namespace {

using tilemoe::bf16;
using tilemoe::AlignedVector;

struct Options {
  bool int8 = true;
  int rows = 384, columns = 256, k = 2048;
  int experts = 0;  // 0: enough for 1 GiB of weights
  int a_buffers = 1, calls_per_a = 1;
  int rounds = 5, cpu = 0;
};

int usage(const char* why) {
  if (why) std::fprintf(stderr, "tilemoe_expert_product_probe: %s\n", why);
  std::fprintf(stderr,
               "usage: tilemoe_expert_product_probe [--weights bf16|int8] [--rows M] [--columns N] [--k K] [--experts E]\n"
               "         [--a-buffers A] [--calls-per-a C] [--rounds R] [--cpu N]\n");
  return why ? 2 : 0;
}

// Seconds of each round (the first, a warm-up, dropped) of one call per expert.
template <typename Call>
std::vector<double> time_rounds(const Options& o, Call call) {
  std::vector<double> seconds;
  for (int r = 0; r <= o.rounds; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int e = 0; e < o.experts; ++e) call(e, (e / o.calls_per_a) % o.a_buffers);
    if (r > 0) seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return seconds;
}

std::vector<double> run_int8(const Options& o, std::size_t& weight_bytes) {
  using namespace tilemoe::kernels;
  const PackedIntShape s = packed_int_shape(8, o.columns, o.k, 0);
  weight_bytes = s.code_bytes();
  // Small codes: the timing does not depend on the values, and no sum comes near int32's range.
  AlignedVector<std::uint8_t> codes(s.code_bytes() * static_cast<std::size_t>(o.experts));
  for (std::size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<std::uint8_t>(i * 13 % 9);
  const std::vector<float> scales(s.scale_count(), 1.0f);
  const std::size_t a_bytes = int8_tiled_rows_bytes(o.rows, s.k_padded);
  AlignedVector<std::int8_t> a(a_bytes * static_cast<std::size_t>(o.a_buffers));
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<std::int8_t>(i * 7 % 11);
  const std::vector<float> a_scale(static_cast<std::size_t>(o.rows), 1.0f);
  AlignedVector<float> c(static_cast<std::size_t>(o.rows) * s.panels * kPanelColumns);
  return time_rounds(o, [&](int e, int ai) {
    GemmIntArgs g{};
    g.a = a.data() + a_bytes * static_cast<std::size_t>(ai);
    g.lda = static_cast<std::size_t>(s.k_padded);
    g.a_tiles = true;
    g.m = o.rows;
    g.a_scale = a_scale.data();
    g.shape = s;
    g.b.codes = codes.data() + s.code_bytes() * static_cast<std::size_t>(e);
    g.b.scales = scales.data();
    g.panel_begin = 0;
    g.panel_end = s.panels;
    g.c = c.data();
    g.ldc = static_cast<std::size_t>(s.panels) * kPanelColumns;
    gemm_int_amx(g);
  });
}

std::vector<double> run_bf16(const Options& o, std::size_t& weight_bytes) {
  using namespace tilemoe::kernels;
  const std::size_t per_expert = packed_bf16_elements(o.columns, o.k);
  const int k_padded = (o.k + kBlockK - 1) / kBlockK * kBlockK;
  const int panels = (o.columns + kPanelColumns - 1) / kPanelColumns;
  weight_bytes = per_expert * sizeof(bf16);
  // 1.0 and 0.0 alternating: finite products whatever the row count.
  AlignedVector<bf16> w(per_expert * static_cast<std::size_t>(o.experts));
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<bf16>(i % 2 ? 0x3f80 : 0);
  const std::size_t a_elements = tiled_rows_elements(o.rows, k_padded);
  AlignedVector<bf16> a(a_elements * static_cast<std::size_t>(o.a_buffers), static_cast<bf16>(0x3f80));
  AlignedVector<float> c(static_cast<std::size_t>(o.rows) * panels * kPanelColumns);
  return time_rounds(o, [&](int e, int ai) {
    GemmBf16Args g{};
    g.a = a.data() + a_elements * static_cast<std::size_t>(ai);
    g.lda = static_cast<std::size_t>(k_padded);
    g.a_tiles = true;
    g.m = o.rows;
    g.k_padded = k_padded;
    g.packed_b = w.data() + per_expert * static_cast<std::size_t>(e);
    g.panel_begin = 0;
    g.panel_end = panels;
    g.c = c.data();
    g.ldc = static_cast<std::size_t>(panels) * kPanelColumns;
    gemm_bf16_amx(g);
  });
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  struct IntOption {
    const char* name;
    int* value;
    int lo, hi;
  };
  const IntOption int_options[] = {{"--rows", &o.rows, 1, 1 << 16},           {"--columns", &o.columns, 1, 1 << 16},
                                   {"--k", &o.k, 1, 1 << 16},                 {"--experts", &o.experts, 1, 1 << 20},
                                   {"--a-buffers", &o.a_buffers, 1, 1 << 12}, {"--calls-per-a", &o.calls_per_a, 1, 1 << 12},
                                   {"--rounds", &o.rounds, 1, 1000},          {"--cpu", &o.cpu, 0, 1 << 16}};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") return usage(nullptr);
    const char* v = i + 1 < argc ? argv[++i] : nullptr;
    if (!v) return usage(("missing value after " + arg).c_str());
    if (arg == "--weights") {
      const std::string w = v;
      if (w != "int8" && w != "bf16") return usage("--weights: int8 or bf16");
      o.int8 = w == "int8";
      continue;
    }
    const IntOption* opt = nullptr;
    for (const IntOption& io : int_options)
      if (arg == io.name) opt = &io;
    if (!opt) return usage(("unknown option " + arg).c_str());
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || n < opt->lo || n > opt->hi) return usage((arg + ": out of range or not a number").c_str());
    *opt->value = static_cast<int>(n);
  }
  if (!tilemoe::kernels::tile_instructions_usable()) {
    std::fprintf(stderr, "tilemoe_expert_product_probe: no usable AMX tiles here: %s\n",
                 tilemoe::kernels::isa_unavailable_reason(tilemoe::kernels::Isa::amx_bf16).c_str());
    return 1;
  }
  const std::size_t one_expert = static_cast<std::size_t>(o.columns) * o.k * (o.int8 ? 1 : 2);
  if (o.experts == 0) o.experts = static_cast<int>(std::max<std::size_t>(1, (std::size_t{1} << 30) / std::max<std::size_t>(one_expert, 1)));
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(o.cpu, &set);
  const bool pinned = sched_setaffinity(0, sizeof set, &set) == 0;
  if (!pinned) std::fprintf(stderr, "tilemoe_expert_product_probe: not pinned to CPU %d\n", o.cpu);

  std::size_t weight_bytes = 0;
  std::vector<double> seconds;
  try {
    seconds = o.int8 ? run_int8(o, weight_bytes) : run_bf16(o, weight_bytes);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tilemoe_expert_product_probe: %s\n", e.what());
    return 1;
  }
  tilemoe::kernels::release_amx_tiles();
  std::sort(seconds.begin(), seconds.end());
  const double ops = 2.0 * o.rows * o.columns * o.k * o.experts;
  const double median = seconds[seconds.size() / 2], best = seconds.front();
  std::printf("%s, %s, m = %d, n = %d, K = %d, %d experts' weights (%.1f MB), %d A buffer(s) x %d call(s), %d rounds\n",
              o.int8 ? "int8" : "bf16", pinned ? ("CPU " + std::to_string(o.cpu)).c_str() : "not pinned", o.rows, o.columns, o.k,
              o.experts, static_cast<double>(weight_bytes) * o.experts * 1e-6, o.a_buffers, o.calls_per_a, o.rounds);
  std::printf("T(FL)OP/s median %.2f best %.2f; weights streamed at %.1f GB/s (median)\n", ops / median * 1e-12, ops / best * 1e-12,
              static_cast<double>(weight_bytes) * o.experts / median * 1e-9);
  return 0;
}
