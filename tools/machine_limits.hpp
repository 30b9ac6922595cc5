#pragma once
// This machine's measured limits, which `bench` times the layer against and `info` reports:
// the read bandwidth from memory (the floor of decode) and the ISA's bf16 dot-product peak (the
// floor of large batches). Measured rather than looked up, since clocks, memory channels and
// VMs make a datasheet's figures a poor guide.
#include <cstddef>

#include "amx/isa.hpp"
#include "numa/bandwidth_probe.hpp"
#include "numa/thread_pool.hpp"

namespace tilemoe::cli {

// Every worker at once, each on its own core; FLOP/s. 0 for the portable kernels, which have no
// peak worth the name.
double measure_peak_flops(numa::ThreadPool& pool, kernels::Isa isa);

// Bytes per second every worker together reads from a buffer of `bytes`, best of `repeats` in
// any read pattern; `each` (if given) gets each pattern's best and median GB/s.
double measure_read_bytes_per_s(numa::ThreadPool& pool, std::size_t bytes, int repeats,
                              std::vector<numa::ReadPatternFigures>* each = nullptr);

// A buffer for a short bandwidth measurement: 4x the last-level cache, so that reads come
// from memory, within [64 MiB, 2 GiB]. First touching the pages costs more than reading them
// (about 5 s per GiB on a 2-core VM), so machines with small caches get a small buffer and
// `info` stays quick there; a 300 MB cache needs 1.2 GB to measure memory rather than cache.
std::size_t quick_bandwidth_bytes();

// The calling thread is the pool's worker 0: pin it to the core the pool leaves for it, as the
// measurements assume one worker per core.
void pin_caller_to_first_core();

}  // namespace tilemoe::cli
