#pragma once
// Measures the read bandwidth the pool's workers get from memory: the decode floor.
#include <cstddef>
#include <vector>

#include "numa/thread_pool.hpp"

namespace tilemoe::numa {

// One read pattern's figures over the repeats, GB/s.
struct ReadPatternFigures {
  const char* name;
  double best;
  double median;
};

// Reads `bytes` (far larger than the last-level cache) with every worker, `repeats` times in each
// read pattern, and returns the best GB/s (1e9 bytes per second) of any pattern; `each`, if
// given, gets every pattern's best and median, so that a floor can be read against them.
double measure_read_bandwidth(ThreadPool& pool, std::size_t bytes, int repeats = 5, std::vector<ReadPatternFigures>* each = nullptr);

}  // namespace tilemoe::numa
