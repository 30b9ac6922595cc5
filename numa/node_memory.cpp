#include "numa/node_memory.hpp"

#include <numa.h>

#include <cstdlib>
#include <string>

#include "tilemoe/error.hpp"

namespace tilemoe::numa {
namespace {

// Asked once: free_on_node must take the same path as the allocation did, and libnuma requires
// numa_available() before any other call.
bool have_libnuma() {
  static const bool available = numa_available() >= 0;
  return available;
}

void check_node(int node) {
  const bool known = have_libnuma()
                         ? node >= 0 && node <= numa_max_node() &&
                               numa_bitmask_isbitset(numa_all_nodes_ptr, static_cast<unsigned>(node))
                         : node == 0;
  if (!known) {
    fail(ErrorKind::invalid_argument,
         "allocate_on_node: node " + std::to_string(node) + " is not a memory node of this process");
  }
}

constexpr std::size_t kAlignment = 64;

}  // namespace

void* allocate_on_node(std::size_t bytes, int node) {
  if (bytes == 0) return nullptr;
  check_node(node);
  void* p = nullptr;
  if (have_libnuma()) {
    p = numa_alloc_onnode(bytes, node);
  } else {
    // aligned_alloc wants a multiple of the alignment.
    if (bytes > static_cast<std::size_t>(-1) - kAlignment) throw std::bad_alloc();
    p = std::aligned_alloc(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
  }
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void free_on_node(void* p, std::size_t bytes) noexcept {
  if (p == nullptr) return;
  if (have_libnuma()) {
    numa_free(p, bytes);
  } else {
    std::free(p);
  }
}

}  // namespace tilemoe::numa
