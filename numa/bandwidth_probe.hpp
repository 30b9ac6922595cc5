#pragma once
// Measures the read bandwidth the pool's workers get from memory: the decode floor.
#include <cstddef>

#include "numa/thread_pool.hpp"

namespace tilemoe::numa {

// Reads `bytes` (far larger than the last-level cache) with every worker, `repeats` times, and
// returns the best GB/s (1e9 bytes per second).
double measure_read_bandwidth(ThreadPool& pool, std::size_t bytes, int repeats = 5);

}  // namespace tilemoe::numa
