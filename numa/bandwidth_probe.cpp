#include "numa/bandwidth_probe.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "numa/node_memory.hpp"

namespace tilemoe::numa {

double measure_read_bandwidth(ThreadPool& pool, std::size_t bytes, int repeats) {
  const std::size_t chunk = std::size_t(1) << 20;  // 1 MiB per item: dynamic scheduling evens out cores
  std::size_t words = bytes / sizeof(std::uint64_t);
  NodeBuffer<std::uint64_t> buf(words, 0);
  std::size_t items = words * sizeof(std::uint64_t) / chunk;
  pool.parallel_for(items, [&](std::size_t i, int) {
    std::uint64_t* p = buf.data() + i * (chunk / sizeof(std::uint64_t));
    for (std::size_t j = 0; j < chunk / sizeof(std::uint64_t); ++j) p[j] = j;
  });
  std::vector<std::uint64_t> sinks(static_cast<std::size_t>(pool.size()) * 8, 0);
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(items, [&](std::size_t i, int worker) {
      const std::uint64_t* p = buf.data() + i * (chunk / sizeof(std::uint64_t));
      std::uint64_t a = 0, b = 0, c = 0, d = 0;
      for (std::size_t j = 0; j < chunk / sizeof(std::uint64_t); j += 4) {
        a ^= p[j];
        b ^= p[j + 1];
        c ^= p[j + 2];
        d ^= p[j + 3];
      }
      sinks[static_cast<std::size_t>(worker) * 8] ^= a ^ b ^ c ^ d;
    });
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(items * chunk) / s / 1e9);
  }
  return best;
}

}  // namespace tilemoe::numa
