#include "tools/machine_limits.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "amx/peak_probe.hpp"
#include "numa/bandwidth_probe.hpp"
#include "numa/topology.hpp"

namespace tilemoe::cli {

double measure_peak_flops(numa::ThreadPool& pool, kernels::Isa isa) {
  if (isa != kernels::Isa::amx_bf16 && isa != kernels::Isa::avx512_bf16 && isa != kernels::Isa::avx2) return 0;  // no probe for portable
  auto probe = isa == kernels::Isa::amx_bf16      ? kernels::peak_flops_amx
               : isa == kernels::Isa::avx512_bf16 ? kernels::peak_flops_avx512
                                                  : kernels::peak_flops_avx2;
  std::int64_t iters = isa == kernels::Isa::amx_bf16 ? 200000 : 2000000;
  // The software tiles of an emulated build are ~10^4 times slower: their peak, measured briefly.
  if (isa == kernels::Isa::amx_bf16 && kernels::cpu_features().amx_emulated) iters = 200;
  pool.parallel_for(static_cast<std::size_t>(pool.size()), [&](std::size_t, int) { probe(iters / 10); });  // warm up clocks
  std::vector<double> flops(static_cast<std::size_t>(pool.size()));
  auto t0 = std::chrono::steady_clock::now();
  pool.parallel_for(static_cast<std::size_t>(pool.size()), [&](std::size_t i, int) { flops[i] = probe(iters); });
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double total = 0;
  for (double f : flops) total += f;
  return total / s;
}

double measure_read_bytes_per_s(numa::ThreadPool& pool, std::size_t bytes, int repeats, std::vector<numa::ReadPatternFigures>* each) {
  return numa::measure_read_bandwidth(pool, bytes, repeats, each) * 1e9;
}

std::size_t quick_bandwidth_bytes() {
  const std::size_t mib = std::size_t(1) << 20;
  return std::clamp<std::size_t>(4 * numa::system_topology().llc_bytes, 64 * mib, 2048 * mib);
}

void pin_caller_to_first_core() {
  const auto& topo = numa::system_topology();
  if (!topo.nodes.empty() && !topo.nodes[0].cpus.empty()) numa::pin_current_thread(topo.nodes[0].cpus[0]);
}

}  // namespace tilemoe::cli
