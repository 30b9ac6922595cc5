#pragma once
// Software prefetch of a byte range, for data a loop will reach later than its own loads run
// ahead: rows some KiB apart (a stride the hardware prefetchers do not follow) and the few KiB
// of LoRA factors or gradients an item is about to touch. A read prefetch also serves stores: it
// brings a line that no other core holds in exclusive state, so the store needs no second trip.
#include <cstddef>

namespace tilemoe::kernels {

// Asks for every cache line of [p, p + bytes). Only a hint: it never faults.
inline void prefetch_range(const void* p, std::size_t bytes) {
  if (bytes == 0) return;
  const char* first = static_cast<const char*>(p);
  const char* last = first + bytes - 1;
  for (const char* q = first; q < last; q += 64) __builtin_prefetch(q);
  __builtin_prefetch(last);
}

// The same into L2 only: for what the next call of a kernel reads, not this one.
inline void prefetch_range_l2(const void* p, std::size_t bytes) {
  if (bytes == 0) return;
  const char* first = static_cast<const char*>(p);
  const char* last = first + bytes - 1;
  for (const char* q = first; q < last; q += 64) __builtin_prefetch(q, 0, 2);
  __builtin_prefetch(last, 0, 2);
}

// Asks for the 16 lines of one tile-sized block (16 rows of 64 bytes: a packed B block of the
// tile kernels), into L1 or only into L2.
inline constexpr int kTileBlockBytes = 1024;
inline void prefetch_tile_block_l1(const void* block) {
  for (int line = 0; line < kTileBlockBytes; line += 64) __builtin_prefetch(static_cast<const char*>(block) + line, 0, 3);
}
inline void prefetch_tile_block_l2(const void* block) {
  for (int line = 0; line < kTileBlockBytes; line += 64) __builtin_prefetch(static_cast<const char*>(block) + line, 0, 2);
}

// How many rows ahead the row loops that use this (convert_rows_to_bf16, silu_mul_backward_avx512)
// ask for the rows they will read or write: far enough that 4 rows' misses are in flight together,
// near enough that the lines are still in L1.
inline constexpr int kPrefetchRowsAhead = 4;

}  // namespace tilemoe::kernels
