#pragma once
// The order in which the bf16 and integer tile kernels run experts of 33-128 rows (int4: up to
// 128): panel pairs outside, row blocks inside. A pair's first row block streams its weights from
// memory, the others re-read them from L1/L2, and the last one sends the next pair's first blocks
// to L2, so that the core's memory stream goes on while it computes from cache. Why each kernel
// runs this order, and what it gained on the device, is told in gemm_bf16_amx.cpp and
// gemm_int_amx.cpp.
#include <cstddef>

#include "amx/prefetch.hpp"

namespace tilemoe::kernels {

// Experts of up to this many rows run pair by pair (A of 128 rows is 512 KiB of bf16 at K = 2048,
// which stays in L2 beside a pair's weights only up to about there).
inline constexpr int kPairsOutsideMaxRows = 128;
// How many 1 KiB blocks of each panel of the next pair the current pair's last row block asks for.
inline constexpr int kNextPairBlocks = 16;

// The next panel pair's weights, sent to L2 a 1 KiB block a panel at each of the first `blocks`
// k-steps: the first panel's from `first`, the second's `stride` bytes on (null: no next pair).
// A prefetch past the matrix (a last pair of one panel) never faults.
struct NextPair {
  const char* first = nullptr;
  std::size_t stride = 0;
  int blocks = 0;

  NextPair() = default;
  NextPair(const void* first_panel, std::size_t stride_bytes, int block_count)
      : first(static_cast<const char*>(first_panel)), stride(stride_bytes), blocks(block_count) {}

  // At k-step kb of the block that asks for it.
  void ask(int kb) const {
    if (kb >= blocks) return;
    const std::size_t at = static_cast<std::size_t>(kb) * kTileBlockBytes;
    prefetch_tile_block_l2(first + at);
    prefetch_tile_block_l2(first + stride + at);
  }
};

// Runs every row block of every panel pair [p, p + 2) of [p_begin, p_end), pair by pair, the odd
// pairs' row blocks backwards (snake order), so that a tail block of its own tile configuration
// costs one change a pair, not two. start_pair(p) runs first at each pair (int4 unpacks it there)
// and returns the NextPair that the pair's last block asks for; then block(row_block, p, two,
// first, next) for each row block (two: p + 1 is a panel too; first: the pair's first block, the
// one that streams its weights; next: empty but for the last block).
template <typename StartPair, typename Block>
inline void for_each_pair_block(int row_blocks, int p_begin, int p_end, StartPair start_pair, Block block) {
  for (int p = p_begin, pair = 0; p < p_end; p += 2, ++pair) {
    const NextPair next = start_pair(p);
    for (int j = 0; j < row_blocks; ++j) {
      const int b = pair % 2 == 0 ? j : row_blocks - 1 - j;
      block(b, p, p + 1 < p_end, j == 0, j == row_blocks - 1 ? next : NextPair{});
    }
  }
}

}  // namespace tilemoe::kernels
