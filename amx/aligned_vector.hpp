#pragma once
// std::vector whose storage starts on a cache line. Tile loads and stores move 64-byte rows: from
// a plain vector (glibc gives 16-byte alignment) every row of a tile spans two cache lines.
#include <cstddef>
#include <new>
#include <vector>

namespace tilemoe {

template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlignment{64};
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlignment)); }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, kAlignment); }
  template <typename U>
  bool operator==(const CacheLineAllocator<U>&) const noexcept { return true; }
};

template <typename T>
using AlignedVector = std::vector<T, CacheLineAllocator<T>>;

// At least n elements, never fewer: for a scratch buffer that serves calls of several sizes,
// whose contents each call writes before reading. A resize back up after a smaller call would
// zero the regrown part (a worker's forward scratch went from one LoRA projection's 24 KiB to the
// next item's 786 KiB at 4096 tokens) for nothing; on the device that did not show in the layer's
// time, within a few percent.
template <typename Vector>
void grow_to(Vector& v, std::size_t n) {
  if (v.size() < n) v.resize(n);
}

}  // namespace tilemoe
