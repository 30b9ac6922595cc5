#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "catch.hpp"
#include "numa/node_memory.hpp"
#include "numa/topology.hpp"
#include "tilemoe/error.hpp"

using tilemoe::Error;
using tilemoe::ErrorKind;
using tilemoe::numa::NodeBuffer;
using tilemoe::numa::NumaNodeInfo;
using tilemoe::numa::Topology;
using tilemoe::numa::partition_nodes;
using tilemoe::numa::system_topology;

namespace {

std::vector<int> all_cpus(const std::vector<NumaNodeInfo>& nodes) {
  std::vector<int> cpus;
  for (const auto& n : nodes) cpus.insert(cpus.end(), n.cpus.begin(), n.cpus.end());
  return cpus;
}

void check_consistent(const Topology& topo) {
  REQUIRE(topo.nodes.size() >= 1);
  CHECK(topo.cores >= 1);
  CHECK(topo.pus >= topo.cores);
  const auto cpus = all_cpus(topo.nodes);
  CHECK(static_cast<int>(cpus.size()) == topo.cores);
  CHECK(std::set<int>(cpus.begin(), cpus.end()).size() == cpus.size());
  for (const auto& n : topo.nodes) {
    CHECK_FALSE(n.cpus.empty());
    CHECK(n.os_index >= 0);
  }
  CHECK(std::all_of(cpus.begin(), cpus.end(), [](int c) { return c >= 0; }));
}

int invalid_kind(const Topology& topo, int count) {
  try {
    partition_nodes(topo, count);
  } catch (const Error& e) {
    return static_cast<int>(e.kind());
  }
  return -1;
}

bool aligned64(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 64 == 0; }

// Two real nodes of 3 and 5 cores, with non-contiguous cpu ids, to check the arithmetic of the
// split without a NUMA machine.
Topology two_node_machine() {
  Topology t;
  t.nodes = {{0, {0, 1, 2}, 3000}, {1, {8, 9, 10, 11, 12}, 5000}};
  t.cores = 8;
  t.pus = 16;
  return t;
}

}  // namespace

TEST_CASE("the probe finds at least one node and one core", "[topology]") {
  const Topology& topo = system_topology();
  check_consistent(topo);
  std::printf("topology: %zu node(s), %d cores, %d PUs, L2 %zu B/core, LLC %zu B, \"%s\"\n",
              topo.nodes.size(), topo.cores, topo.pus, topo.l2_bytes_per_core, topo.llc_bytes,
              topo.cpu_model.c_str());
  // Probed once: every caller, on any thread, sees the same object.
  const Topology* seen = nullptr;
  std::thread([&] { seen = &system_topology(); }).join();
  CHECK(seen == &topo);
}

TEST_CASE("the CPU signature comes from the first processor's family, model and stepping", "[topology]") {
  using tilemoe::numa::detail::cpu_signature_from_cpuinfo;
  const std::string two =
      "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"
      "model name\t: Intel(R) Xeon(R) Processor\nstepping\t: 8\n\n"
      "processor\t: 1\ncpu family\t: 6\nmodel\t\t: 207\nstepping\t: 2\n";
  CHECK(cpu_signature_from_cpuinfo(two) == "family 6 model 143 stepping 8");
  // "model name" is not "model", wherever it comes.
  CHECK(cpu_signature_from_cpuinfo("cpu family\t: 25\nmodel\t\t: 17\nmodel name\t: 7\nstepping\t: 1\n") ==
        "family 25 model 17 stepping 1");
  // A missing or non-numeric field: no signature rather than a wrong one.
  CHECK(cpu_signature_from_cpuinfo("cpu family\t: 6\nmodel\t\t: 143\n").empty());
  CHECK(cpu_signature_from_cpuinfo("cpu family\t: 6\nmodel\t\t: x86\nstepping\t: 8\n").empty());
  CHECK(cpu_signature_from_cpuinfo("").empty());
  // The second processor's fields do not fill the first one's gaps.
  CHECK(cpu_signature_from_cpuinfo("cpu family\t: 6\nmodel\t\t: 143\n\nstepping\t: 8\n").empty());
}

TEST_CASE("the machine's CPU signature is read where /proc/cpuinfo has one", "[topology]") {
  const std::string signature = system_topology().cpu_signature;
  std::FILE* f = std::fopen("/proc/cpuinfo", "r");
  bool has_family = false;
  if (f != nullptr) {
    char line[512];
    while (!has_family && std::fgets(line, sizeof line, f) != nullptr) has_family = std::strncmp(line, "cpu family", 10) == 0;
    std::fclose(f);
  }
  std::printf("cpu signature: \"%s\"\n", signature.c_str());
  if (has_family) {
    CHECK(signature.rfind("family ", 0) == 0);
  } else {
    CHECK(signature.empty());
  }
}

TEST_CASE("the fallback probe describes one node", "[topology]") {
  const Topology topo = tilemoe::numa::detail::probe_without_hwloc();
  check_consistent(topo);
  CHECK(topo.nodes.size() == 1);
  CHECK(topo.nodes[0].memory_bytes > 0);
}

TEST_CASE("partition_nodes on this machine", "[topology]") {
  const Topology& topo = system_topology();
  const auto cpus = all_cpus(topo.nodes);

  const auto one = partition_nodes(topo, 1);
  REQUIRE(one.size() == 1);
  CHECK(one[0].cpus == cpus);
  CHECK(one[0].memory_bytes > 0);

  if (topo.cores >= 2) {
    const auto two = partition_nodes(topo, 2);
    REQUIRE(two.size() == 2);
    CHECK(all_cpus(two) == cpus);
    const auto a = two[0].cpus.size();
    const auto b = two[1].cpus.size();
    CHECK(std::max(a, b) - std::min(a, b) <= 1);
    CHECK(std::min(a, b) >= 1);
  }

  const auto same = partition_nodes(topo, static_cast<int>(topo.nodes.size()));
  REQUIRE(same.size() == topo.nodes.size());
  for (std::size_t i = 0; i < same.size(); ++i) {
    CHECK(same[i].os_index == topo.nodes[i].os_index);
    CHECK(same[i].cpus == topo.nodes[i].cpus);
  }

  const int invalid = static_cast<int>(ErrorKind::invalid_argument);
  CHECK(invalid_kind(topo, 0) == invalid);
  CHECK(invalid_kind(topo, -3) == invalid);
  CHECK(invalid_kind(topo, topo.cores + 1) == invalid);
}

TEST_CASE("partition_nodes splits evenly and maps groups back to real nodes", "[topology]") {
  const Topology t = two_node_machine();

  SECTION("the real count returns the real nodes") {
    const auto nodes = partition_nodes(t, 2);
    REQUIRE(nodes.size() == 2);
    CHECK(nodes[1].os_index == 1);
    CHECK(nodes[1].cpus == std::vector<int>{8, 9, 10, 11, 12});
    CHECK(nodes[1].memory_bytes == 5000);
  }
  SECTION("three groups of 3, 3, 2") {
    const auto nodes = partition_nodes(t, 3);
    REQUIRE(nodes.size() == 3);
    CHECK(nodes[0].cpus == std::vector<int>{0, 1, 2});
    CHECK(nodes[1].cpus == std::vector<int>{8, 9, 10});
    CHECK(nodes[2].cpus == std::vector<int>{11, 12});
    CHECK(nodes[0].os_index == 0);
    CHECK(nodes[1].os_index == 1);
    CHECK(nodes[2].os_index == 1);
    CHECK(nodes[0].memory_bytes == 3000);
    CHECK(nodes[1].memory_bytes == 3000);
    CHECK(nodes[2].memory_bytes == 2000);
  }
  SECTION("four groups of 2; a group straddling two nodes goes to the first on a tie") {
    const auto nodes = partition_nodes(t, 4);
    REQUIRE(nodes.size() == 4);
    CHECK(nodes[1].cpus == std::vector<int>{2, 8});
    CHECK(nodes[1].os_index == 0);
    CHECK(nodes[1].memory_bytes == 2000);
    CHECK(nodes[3].os_index == 1);
  }
  SECTION("one core per group, and no more groups than cores") {
    CHECK(partition_nodes(t, 8).size() == 8);
    CHECK(invalid_kind(t, 9) == static_cast<int>(ErrorKind::invalid_argument));
  }
}

TEST_CASE("allocate_on_node and free_on_node", "[node_memory]") {
  using tilemoe::numa::allocate_on_node;
  using tilemoe::numa::free_on_node;
  for (const auto& node : system_topology().nodes) {
    CAPTURE(node.os_index);
    CHECK(allocate_on_node(0, node.os_index) == nullptr);
    for (std::size_t bytes : {std::size_t{1}, std::size_t{63}, std::size_t{64}, std::size_t{4097},
                              std::size_t{1} << 20}) {
      CAPTURE(bytes);
      void* p = allocate_on_node(bytes, node.os_index);
      REQUIRE(p != nullptr);
      CHECK(aligned64(p));
      std::memset(p, 0xA5, bytes);
      CHECK(static_cast<unsigned char*>(p)[bytes - 1] == 0xA5);
      free_on_node(p, bytes);
    }
  }
  free_on_node(nullptr, 0);
  for (int bad : {-1, 1 << 20}) {
    CAPTURE(bad);
    try {
      void* p = allocate_on_node(64, bad);
      free_on_node(p, 64);
      FAIL("node " << bad << " was accepted");
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::invalid_argument);
    }
  }
}

TEST_CASE("NodeBuffer owns its memory and moves", "[node_memory]") {
  static_assert(!std::is_copy_constructible_v<NodeBuffer<float>>);
  static_assert(!std::is_copy_assignable_v<NodeBuffer<float>>);
  static_assert(std::is_nothrow_move_constructible_v<NodeBuffer<float>>);
  const int node = system_topology().nodes.front().os_index;

  NodeBuffer<float> empty;
  CHECK(empty.empty());
  CHECK(empty.data() == nullptr);
  NodeBuffer<float> zero(0, node);
  CHECK(zero.empty());
  CHECK(zero.data() == nullptr);

  NodeBuffer<float> a(1000, node);
  REQUIRE(a.size() == 1000);
  CHECK(a.node() == node);
  CHECK(aligned64(a.data()));
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i);
  const float* storage = a.data();

  NodeBuffer<float> b(std::move(a));
  CHECK(a.empty());
  CHECK(a.data() == nullptr);
  CHECK(b.data() == storage);
  CHECK(b.span().size() == 1000);
  CHECK(b[999] == 999.0f);

  NodeBuffer<float> c(16, node);
  c = std::move(b);  // c's own 16 floats are freed here; ASan would see a leak otherwise
  CHECK(c.data() == storage);
  CHECK(b.empty());

  try {
    NodeBuffer<double> huge(static_cast<std::size_t>(-1) / 4, node);
    FAIL("an overflowing size was accepted");
  } catch (const std::bad_alloc&) {
  }
}
