#pragma once
// What the machine looks like to the runtime: which cores belong to which NUMA node and how big
// the caches are. Probed once with hwloc; everything that sizes tiles or places threads and
// memory reads it from here so that the whole runtime agrees on one picture of the machine.
#include <cstddef>
#include <string>
#include <vector>

namespace tilemoe::numa {

struct NumaNodeInfo {
  int os_index = 0;       // the kernel's node number: what libnuma and allocate_on_node take
  std::vector<int> cpus;  // OS cpu ids, one per physical core (the first PU of each core)
  std::size_t memory_bytes = 0;
};

struct Topology {
  // Only nodes that have cores: every entry is meant to host workers. Memory-only nodes (CXL,
  // HBM in flat mode) are left out. Cores the process may not run on (taskset, cgroups) are
  // left out too, so a pinned thread never lands on a cpu the kernel would refuse.
  std::vector<NumaNodeInfo> nodes;
  int cores = 0;  // == the total of nodes[i].cpus.size()
  int pus = 0;    // hardware threads the process may use; > cores with SMT
  std::size_t l2_bytes_per_core = 0;  // an L2 shared by k cores counts as size / k
  std::size_t llc_bytes = 0;  // one instance of the last-level cache (per socket or per CCX)
  std::string cpu_model;      // empty when unknown
  // "family 6 model 143 stepping 8" from /proc/cpuinfo, or empty: virtual machines often report
  // a model name of "Intel(R) Xeon(R) Processor" for every generation, and these numbers tell
  // them apart (a bench figure depends on which one it ran on).
  std::string cpu_signature;
};

// Probed once (hwloc) on first call; thread-safe. Falls back to probe_without_hwloc() if hwloc
// fails. Never throws.
const Topology& system_topology();

// Splits the machine's cores into `count` virtual nodes, so that the NUMA split of the runtime
// can be exercised on one-node machines. When count equals the number of real nodes these are
// returned unchanged. Otherwise all cores, in node order, are cut into `count` contiguous groups
// whose sizes differ by at most one; each group takes the os_index of the real node holding most
// of its cores (so memory allocated for it stays local) and a share of that memory proportional
// to its cores. Throws tilemoe::Error(invalid_argument) when count < 1 or count > cores.
std::vector<NumaNodeInfo> partition_nodes(const Topology& topo, int count);

namespace detail {
// The fallback of system_topology(): one node holding every cpu the process may run on, each
// counted as a core, with sizes from sysconf and /proc/cpuinfo. Exposed so tests can run it.
Topology probe_without_hwloc();
// The signature of a /proc/cpuinfo text (its first processor's "cpu family", "model" and
// "stepping"), or empty where one of them is missing.
std::string cpu_signature_from_cpuinfo(const std::string& cpuinfo);
}  // namespace detail

}  // namespace tilemoe::numa
