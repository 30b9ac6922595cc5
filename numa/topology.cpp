#include "numa/topology.hpp"

#include <hwloc.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <optional>

#include "tilemoe/error.hpp"

namespace tilemoe::numa {
namespace {

std::size_t sysconf_bytes(int name) {
  const long v = sysconf(name);
  return v > 0 ? static_cast<std::size_t>(v) : 0;
}

std::string model_from_proc_cpuinfo() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const auto start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? std::string() : line.substr(start);
  }
  return {};
}

std::string cpu_signature_from_proc_cpuinfo() {
  std::ifstream in("/proc/cpuinfo");
  std::string text, line;
  // The first processor's block is enough: it ends at the first empty line.
  while (std::getline(in, line) && !line.empty()) text += line + '\n';
  return detail::cpu_signature_from_cpuinfo(text);
}

// The cpus this process may run on; the ids need not be contiguous under taskset or cgroups.
std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  const long configured = sysconf(_SC_NPROCESSORS_CONF);
  const int max_cpus = static_cast<int>(std::max<long>(configured, 1024));
  cpu_set_t* set = CPU_ALLOC(max_cpus);
  if (set != nullptr) {
    const std::size_t size = CPU_ALLOC_SIZE(max_cpus);
    CPU_ZERO_S(size, set);
    if (sched_getaffinity(0, size, set) == 0) {
      for (int cpu = 0; cpu < max_cpus; ++cpu) {
        if (CPU_ISSET_S(cpu, size, set)) cpus.push_back(cpu);
      }
    }
    CPU_FREE(set);
  }
  if (cpus.empty()) {
    const long online = std::max<long>(sysconf(_SC_NPROCESSORS_ONLN), 1);
    for (int cpu = 0; cpu < online; ++cpu) cpus.push_back(cpu);
  }
  return cpus;
}

struct HwlocDeleter {
  void operator()(hwloc_topology* t) const { hwloc_topology_destroy(t); }
  void operator()(hwloc_bitmap_s* b) const { hwloc_bitmap_free(b); }
};
using HwlocTopology = std::unique_ptr<hwloc_topology, HwlocDeleter>;
using HwlocBitmap = std::unique_ptr<hwloc_bitmap_s, HwlocDeleter>;

// The PUs the process may run on. hwloc itself drops only what cgroups forbid; taskset and
// numactl --cpunodebind show up only in the process's binding, which on Linux is the union over
// its threads, so a thread pinned before the first probe does not shrink the machine.
HwlocBitmap usable_pus(hwloc_topology_t topo) {
  HwlocBitmap set(hwloc_bitmap_dup(hwloc_topology_get_allowed_cpuset(topo)));
  HwlocBitmap bound(hwloc_bitmap_alloc());
  if (set == nullptr || bound == nullptr) return nullptr;
  if (hwloc_get_cpubind(topo, bound.get(), HWLOC_CPUBIND_PROCESS) == 0 &&
      hwloc_bitmap_intersects(bound.get(), set.get())) {
    hwloc_bitmap_and(set.get(), set.get(), bound.get());
  }
  return set;
}

std::optional<Topology> probe_with_hwloc() {
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0) return std::nullopt;
  HwlocTopology topo(raw);
  if (hwloc_topology_load(raw) != 0) return std::nullopt;

  const int node_count = hwloc_get_nbobjs_by_type(raw, HWLOC_OBJ_NUMANODE);
  if (node_count <= 0) return std::nullopt;
  std::vector<hwloc_obj_t> node_objs;
  Topology result;
  for (int i = 0; i < node_count; ++i) {
    hwloc_obj_t node = hwloc_get_obj_by_type(raw, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
    node_objs.push_back(node);
    NumaNodeInfo info;
    info.os_index = static_cast<int>(node->os_index);
    info.memory_bytes = node->attr != nullptr ? node->attr->numanode.local_memory : 0;
    result.nodes.push_back(std::move(info));
  }

  const HwlocBitmap usable = usable_pus(raw);
  const HwlocBitmap usable_in_core(hwloc_bitmap_alloc());
  if (usable == nullptr || usable_in_core == nullptr) return std::nullopt;
  // Some virtual machines report PUs without Core objects; each PU is a core there.
  const hwloc_obj_type_t core_type =
      hwloc_get_nbobjs_by_type(raw, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
  hwloc_obj_t first_core = nullptr;
  for (hwloc_obj_t core = hwloc_get_next_obj_by_type(raw, core_type, nullptr); core != nullptr;
       core = hwloc_get_next_obj_by_type(raw, core_type, core)) {
    hwloc_bitmap_and(usable_in_core.get(), core->cpuset, usable.get());
    const int pu = hwloc_bitmap_first(usable_in_core.get());
    if (pu < 0) continue;
    // A core can be local to several nodes (DRAM and HBM of one socket); the first node in
    // hwloc's order is the ordinary DRAM one, and the others end up empty and are dropped.
    for (int i = 0; i < node_count; ++i) {
      if (hwloc_bitmap_isset(node_objs[static_cast<std::size_t>(i)]->cpuset,
                             static_cast<unsigned>(pu))) {
        result.nodes[static_cast<std::size_t>(i)].cpus.push_back(pu);
        if (first_core == nullptr) first_core = core;
        break;
      }
    }
  }
  std::erase_if(result.nodes, [](const NumaNodeInfo& n) { return n.cpus.empty(); });
  if (result.nodes.empty() || first_core == nullptr) return std::nullopt;
  for (const auto& n : result.nodes) result.cores += static_cast<int>(n.cpus.size());
  result.pus = std::max(hwloc_bitmap_weight(usable.get()), result.cores);

  // Caches seen from the first core; production machines are homogeneous enough that one core
  // speaks for all (hybrid client chips are not a target).
  for (hwloc_obj_t obj = first_core->parent; obj != nullptr; obj = obj->parent) {
    if (!hwloc_obj_type_is_dcache(obj->type) || obj->attr == nullptr) continue;
    const std::size_t size = obj->attr->cache.size;
    if (obj->attr->cache.depth == 2 && result.l2_bytes_per_core == 0) {
      const int sharing = hwloc_get_nbobjs_inside_cpuset_by_type(raw, obj->cpuset, core_type);
      result.l2_bytes_per_core = size / static_cast<std::size_t>(std::max(sharing, 1));
    }
    result.llc_bytes = size;  // walking outwards, the last cache seen is the last level
  }
  if (result.l2_bytes_per_core == 0) result.l2_bytes_per_core = sysconf_bytes(_SC_LEVEL2_CACHE_SIZE);
  if (result.llc_bytes == 0) {
    result.llc_bytes = std::max(sysconf_bytes(_SC_LEVEL3_CACHE_SIZE), result.l2_bytes_per_core);
  }

  hwloc_obj_t package = hwloc_get_obj_by_type(raw, HWLOC_OBJ_PACKAGE, 0);
  const char* model = package != nullptr ? hwloc_obj_get_info_by_name(package, "CPUModel") : nullptr;
  if (model == nullptr) model = hwloc_obj_get_info_by_name(hwloc_get_root_obj(raw), "CPUModel");
  result.cpu_model = model != nullptr ? model : model_from_proc_cpuinfo();
  result.cpu_signature = cpu_signature_from_proc_cpuinfo();
  return result;
}

}  // namespace

namespace detail {

std::string cpu_signature_from_cpuinfo(const std::string& cpuinfo) {
  std::string family, model, stepping;
  std::size_t at = 0;
  while (at < cpuinfo.size()) {
    std::size_t end = cpuinfo.find('\n', at);
    if (end == std::string::npos) end = cpuinfo.size();
    const std::string line = cpuinfo.substr(at, end - at);
    at = end + 1;
    if (line.empty()) break;  // the first processor's block only
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    const auto start = line.find_first_not_of(" \t", colon + 1);
    const std::string value = start == std::string::npos ? std::string() : line.substr(start);
    // Numbers only: "model name" is another key, and a value with anything else is not one of these.
    if (value.empty() || value.find_first_not_of("0123456789") != std::string::npos) continue;
    if (key == "cpu family") family = value;
    if (key == "model") model = value;
    if (key == "stepping") stepping = value;
  }
  if (family.empty() || model.empty() || stepping.empty()) return {};
  return "family " + family + " model " + model + " stepping " + stepping;
}

Topology probe_without_hwloc() {
  Topology result;
  NumaNodeInfo node;
  node.os_index = 0;
  node.cpus = allowed_cpus();
  node.memory_bytes = sysconf_bytes(_SC_PHYS_PAGES) * sysconf_bytes(_SC_PAGESIZE);
  result.cores = static_cast<int>(node.cpus.size());
  result.pus = result.cores;
  result.nodes.push_back(std::move(node));
  result.l2_bytes_per_core = sysconf_bytes(_SC_LEVEL2_CACHE_SIZE);
  result.llc_bytes = std::max(sysconf_bytes(_SC_LEVEL3_CACHE_SIZE), result.l2_bytes_per_core);
  result.cpu_model = model_from_proc_cpuinfo();
  result.cpu_signature = cpu_signature_from_proc_cpuinfo();
  return result;
}

}  // namespace detail

const Topology& system_topology() {
  // A function-local static gives thread-safe one-time probing; the catch keeps the promise
  // that this never throws, short of the fallback itself running out of memory.
  static const Topology topology = [] {
    try {
      if (auto probed = probe_with_hwloc()) return std::move(*probed);
    } catch (...) {
    }
    return detail::probe_without_hwloc();
  }();
  return topology;
}

std::vector<NumaNodeInfo> partition_nodes(const Topology& topo, int count) {
  std::size_t total = 0;
  for (const auto& n : topo.nodes) total += n.cpus.size();
  if (count < 1 || static_cast<std::size_t>(count) > total) {
    fail(ErrorKind::invalid_argument, "partition_nodes: cannot split " + std::to_string(total) +
                                          " cores into " + std::to_string(count) + " nodes");
  }
  if (static_cast<std::size_t>(count) == topo.nodes.size()) return topo.nodes;

  // For every core, the real node it sits on, so each group can be mapped back.
  struct Core {
    int cpu;
    std::size_t node;
  };
  std::vector<Core> cores;
  cores.reserve(total);
  for (std::size_t i = 0; i < topo.nodes.size(); ++i) {
    for (int cpu : topo.nodes[i].cpus) cores.push_back({cpu, i});
  }

  std::vector<NumaNodeInfo> result;
  result.reserve(static_cast<std::size_t>(count));
  const std::size_t groups = static_cast<std::size_t>(count);
  const std::size_t base = total / groups;
  const std::size_t extra = total % groups;
  std::size_t begin = 0;
  for (std::size_t g = 0; g < groups; ++g) {
    const std::size_t end = begin + base + (g < extra ? 1 : 0);
    std::vector<std::size_t> per_node(topo.nodes.size(), 0);
    NumaNodeInfo info;
    for (std::size_t c = begin; c < end; ++c) {
      info.cpus.push_back(cores[c].cpu);
      ++per_node[cores[c].node];
    }
    // max_element returns the first maximum: ties go to the lower node, deterministically.
    const std::size_t home = static_cast<std::size_t>(
        std::max_element(per_node.begin(), per_node.end()) - per_node.begin());
    info.os_index = topo.nodes[home].os_index;
    for (std::size_t n = 0; n < topo.nodes.size(); ++n) {
      if (per_node[n] == 0) continue;
      // Dividing first cannot overflow, whatever the node's size; the rounding is bytes.
      info.memory_bytes += topo.nodes[n].memory_bytes / topo.nodes[n].cpus.size() * per_node[n];
    }
    result.push_back(std::move(info));
    begin = end;
  }
  return result;
}

}  // namespace tilemoe::numa
