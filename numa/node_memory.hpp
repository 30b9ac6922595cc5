#pragma once
// Memory placed on one NUMA node, so that the weights and scratch a group of workers reads live
// next to those workers. Meant for large buffers: with libnuma every allocation is whole pages.
#include <cstddef>
#include <memory>
#include <new>
#include <span>
#include <type_traits>
#include <utility>

namespace tilemoe::numa {

// At least 64-byte aligned (page-aligned when libnuma is in use). bytes == 0 returns nullptr.
// Throws std::bad_alloc when the memory cannot be had and tilemoe::Error(invalid_argument) for a
// node the kernel does not know. When libnuma is unavailable (a kernel without NUMA) there is
// one node, 0, and plain aligned memory is returned. Contents are indeterminate.
void* allocate_on_node(std::size_t bytes, int node);
// `bytes` must be what was passed to allocate_on_node. nullptr is ignored.
void free_on_node(void* p, std::size_t bytes) noexcept;

// Owns `size` elements of T on one node. The elements are left uninitialised, which is why T
// must be trivial: touching the pages here would cost time for buffers that are about to be
// filled anyway.
template <class T>
class NodeBuffer {
  static_assert(std::is_trivially_default_constructible_v<T> && std::is_trivially_destructible_v<T>,
                "NodeBuffer holds plain data only");
  static_assert(alignof(T) <= 64, "allocate_on_node guarantees 64-byte alignment only");

 public:
  NodeBuffer() noexcept = default;
  NodeBuffer(std::size_t size, int node) : size_(size), node_(node) {
    if (size > static_cast<std::size_t>(-1) / sizeof(T)) throw std::bad_alloc();
    data_ = static_cast<T*>(allocate_on_node(size * sizeof(T), node));
    // Starts the elements' lifetimes formally; for trivial T it compiles to nothing.
    if (data_ != nullptr) std::uninitialized_default_construct_n(data_, size);
  }
  ~NodeBuffer() { free_on_node(data_, size_ * sizeof(T)); }

  NodeBuffer(const NodeBuffer&) = delete;
  NodeBuffer& operator=(const NodeBuffer&) = delete;
  NodeBuffer(NodeBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        node_(other.node_) {}
  NodeBuffer& operator=(NodeBuffer&& other) noexcept {
    if (this != &other) {
      free_on_node(data_, size_ * sizeof(T));
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      node_ = other.node_;
    }
    return *this;
  }

  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  int node() const noexcept { return node_; }
  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  T& operator[](std::size_t i) noexcept { return data_[i]; }
  const T& operator[](std::size_t i) const noexcept { return data_[i]; }
  std::span<T> span() noexcept { return {data_, size_}; }
  std::span<const T> span() const noexcept { return {data_, size_}; }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
  int node_ = 0;
};

}  // namespace tilemoe::numa
