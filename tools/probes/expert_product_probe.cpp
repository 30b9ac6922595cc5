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
// --threads T runs T such threads at once, on CPUs cpu .. cpu + T - 1, each with buffers of its own,
// every round started together: the device's 16 vCPUs each ran bf16 at about half their lone rate
// when all 16 ran it, and their sum was what the forward reaches at 4096 tokens (session 63, where
// separate processes measured it; one process starts the rounds together). Session 64 then saw one
// vCPU's lone rate itself move between about 1.0 and 0.42 TFLOP/s within seconds, so a lone figure
// compares only with figures of the same minute.
//
// Usage: tilemoe_expert_product_probe [--weights bf16|int8] [--rows M] [--columns N] [--k K]
//          [--experts E] [--a-buffers A] [--calls-per-a C] [--rounds R] [--cpu N] [--threads T]
//          [--lora-rank R]
// --experts: weight matrices taken in turn (enough to exceed the last-level cache for "from
// memory"); --a-buffers: distinct A taken in turn, each for --calls-per-a calls in a row (2: gate
// then up on one A, as a gate_up item); --lora-rank R adds the fused second product of a LoRA of
// rank R (an xa of R columns times a B' of R rows a panel, as the forward's held adapters give it),
// so that its cost in the kernel's own loop is measured apart from the forward's other work (the
// rates count the base product's operations only). Session 68, int8, m = 48, n = 256, K = 2048, 4
// experts' weights (in L2/L3): r=16 ran 8-12 % under r=0; left out one part at a time (a temporary
// switch), its tile products and their zeroing cost about nothing, the four extra tile stores of
// each 32 x 32 block nearly all of it. On a device vCPU (Emerald Rapids, session 68) m = 384 ran
// 10 % under r=0 as well (2.13-2.16 -> 1.93-1.94), where tile stores cost nothing in
// tilemoe_tile_store_probe; 16 threads with the weights from memory at m = 48 were level.
#include <sched.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <thread>
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
  int threads = 1;
  int lora_rank = 0;
};

// A LoRA's second product for the kernels: xa (rows x rank, padded to whole k-steps) and B'
// (rank x columns in panels). Values are small and finite; the timing does not depend on them.
struct SecondProduct {
  int k2_padded = 0;
  AlignedVector<tilemoe::bf16> xa, b2;

  SecondProduct(int rank, int rows, int panels) {
    if (rank == 0) return;
    k2_padded = (rank + tilemoe::kernels::kBlockK - 1) / tilemoe::kernels::kBlockK * tilemoe::kernels::kBlockK;
    xa.assign(static_cast<std::size_t>(rows) * k2_padded, static_cast<tilemoe::bf16>(0x3c00));  // 2^-7
    b2.assign(static_cast<std::size_t>(panels) * k2_padded * tilemoe::kernels::kPanelColumns, static_cast<tilemoe::bf16>(0x3c00));
  }
  template <typename Args>
  void set(Args& g) const {
    if (k2_padded == 0) return;
    g.a2 = xa.data();
    g.lda2 = static_cast<std::size_t>(k2_padded);
    g.k2_padded = k2_padded;
    g.packed_b2 = b2.data();
  }
};

int usage(const char* why) {
  if (why) std::fprintf(stderr, "tilemoe_expert_product_probe: %s\n", why);
  std::fprintf(stderr,
               "usage: tilemoe_expert_product_probe [--weights bf16|int8] [--rows M] [--columns N] [--k K] [--experts E]\n"
               "         [--a-buffers A] [--calls-per-a C] [--rounds R] [--cpu N] [--threads T] [--lora-rank R]\n");
  return why ? 2 : 0;
}

// Seconds of each round (the first, a warm-up, dropped) of one call per expert; every thread
// starts each round at the barrier, so that the threads' rounds overlap.
template <typename Call>
std::vector<double> time_rounds(const Options& o, std::barrier<>& start, Call call) {
  std::vector<double> seconds;
  for (int r = 0; r <= o.rounds; ++r) {
    start.arrive_and_wait();
    const auto t0 = std::chrono::steady_clock::now();
    for (int e = 0; e < o.experts; ++e) call(e, (e / o.calls_per_a) % o.a_buffers);
    if (r > 0) seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return seconds;
}

std::vector<double> run_int8(const Options& o, std::barrier<>& start, std::size_t& weight_bytes) {
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
  const SecondProduct second(o.lora_rank, o.rows, s.panels);
  return time_rounds(o, start, [&](int e, int ai) {
    GemmIntArgs g{};
    second.set(g);
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

std::vector<double> run_bf16(const Options& o, std::barrier<>& start, std::size_t& weight_bytes) {
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
  const SecondProduct second(o.lora_rank, o.rows, panels);
  return time_rounds(o, start, [&](int e, int ai) {
    GemmBf16Args g{};
    second.set(g);
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
                                   {"--rounds", &o.rounds, 1, 1000},          {"--cpu", &o.cpu, 0, 1 << 16},
                                   {"--threads", &o.threads, 1, 1024},        {"--lora-rank", &o.lora_rank, 0, 1024}};
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

  struct ThreadResult {
    bool pinned = false;
    std::size_t weight_bytes = 0;
    std::vector<double> seconds;
    std::string error;
  };
  std::vector<ThreadResult> results(static_cast<std::size_t>(o.threads));
  std::barrier<> start(o.threads);
  auto run_thread = [&](int t) {
    ThreadResult& r = results[static_cast<std::size_t>(t)];
    if (o.cpu + t < CPU_SETSIZE) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(o.cpu + t, &set);
      r.pinned = sched_setaffinity(0, sizeof set, &set) == 0;
    }
    try {
      r.seconds = o.int8 ? run_int8(o, start, r.weight_bytes) : run_bf16(o, start, r.weight_bytes);
    } catch (const std::exception& e) {
      r.error = e.what();
      r.seconds.clear();
      start.arrive_and_drop();  // the others' rounds go on without this thread
    }
    tilemoe::kernels::release_amx_tiles();
  };
  std::vector<std::thread> workers;
  for (int t = 1; t < o.threads; ++t) workers.emplace_back(run_thread, t);
  run_thread(0);
  for (std::thread& w : workers) w.join();

  const double ops = 2.0 * o.rows * o.columns * o.k * o.experts;  // one thread's round
  std::printf("%s, CPUs %d..%d, m = %d, n = %d, K = %d, LoRA rank %d, %d experts' weights (%.1f MB) a thread, %d A buffer(s) x %d call(s), %d rounds\n",
              o.int8 ? "int8" : "bf16", o.cpu, o.cpu + o.threads - 1, o.rows, o.columns, o.k, o.lora_rank, o.experts,
              static_cast<double>(one_expert) * o.experts * 1e-6, o.a_buffers, o.calls_per_a, o.rounds);
  int failed = 0;
  double sum_of_medians = 0;
  std::vector<double> slowest(static_cast<std::size_t>(o.rounds), 0.0);  // each round's slowest thread
  for (int t = 0; t < o.threads; ++t) {
    ThreadResult& r = results[static_cast<std::size_t>(t)];
    if (!r.error.empty()) {
      std::fprintf(stderr, "tilemoe_expert_product_probe: thread %d: %s\n", t, r.error.c_str());
      ++failed;
      continue;
    }
    if (!r.pinned) std::fprintf(stderr, "tilemoe_expert_product_probe: thread %d not pinned to CPU %d\n", t, o.cpu + t);
    for (std::size_t i = 0; i < r.seconds.size(); ++i) slowest[i] = std::max(slowest[i], r.seconds[i]);
    std::vector<double> sorted = r.seconds;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[sorted.size() / 2], best = sorted.front();
    sum_of_medians += ops / median * 1e-12;
    std::printf("CPU %d: T(FL)OP/s median %.2f best %.2f; weights streamed at %.1f GB/s (median)\n", o.cpu + t, ops / median * 1e-12,
                ops / best * 1e-12, static_cast<double>(r.weight_bytes) * o.experts / median * 1e-9);
  }
  if (failed == o.threads) return 1;
  if (o.threads > 1) {
    std::sort(slowest.begin(), slowest.end());
    const int ran = o.threads - failed;
    std::printf("%d threads: sum of their medians %.2f T(FL)OP/s; together (each round's slowest thread) %.2f\n", ran, sum_of_medians,
                ran * ops / slowest[slowest.size() / 2] * 1e-12);
  }
  return failed ? 1 : 0;
}
