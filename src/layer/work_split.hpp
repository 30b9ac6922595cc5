#pragma once
// How the layer's GEMM phases split into items, and the deterministic combine of per-slot rows.
// Item boundaries depend on the routing only, never on the thread count, which is what makes
// the output bit-identical for any number of threads.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "amx/combine_rows.hpp"
#include "numa/thread_pool.hpp"
#include "src/routing/token_groups.hpp"

namespace tilemoe {

struct ExpertItem {
  int expert;
  int p0, p1;  // panels [p0, p1) of the expert's output columns
};

// Items (expert, column chunk) over `panels` output panels of every active expert, chunks being
// whole multiples of `unit` panels. With many rows an item covers more columns so that its block
// of rows (re-read for every column chunk) is reused across several tiles; with few rows, small
// chunks keep decode spread over every core. Given the reduction length k, a short one (a NUMA
// node's slice of the intermediate size) widens the chunks so that an item's work stays about
// the same as at k = 2048. `denser` widens them again for weights of fewer bytes than bf16 (2 for
// int8, 4 for int4), so that an item streams as many bytes as a bf16 one: at decode an item is
// mostly the fixed cost of one call and a stream that the prefetchers must pick up. From 16 rows,
// where items are 8 panels, it widens by 2 at most: an integer k-block is twice a bf16 one. (Any
// other reason to widen, 1 to 4, may be passed the same way.) `few_row_panels` is the chunk,
// before widening, for experts of 4-15 rows (KernelTable::few_row_item_panels: 1 where small chunks
// are best, more where the kernel blocks several panels per pass); 1-3 rows (decode) get 1 panel,
// widened as above, and then at least `decode_panels` (fewer, halving, where the phase would have
// fewer than 64 items).
std::vector<ExpertItem> split_expert_columns(const std::vector<int>& active, const TokenGroups& groups, int panels, int unit = 1,
                                             int k = 0, int denser = 1, int few_row_panels = 1, int decode_panels = 1);

// The last `count` items (or all, if fewer) split in two where they are at least 2 `unit`s wide,
// in place and in order; with `groups`, only items of experts of at least `min_rows` rows. A phase
// ends when its last item does, and the workers that finish earlier wait meanwhile: halving the
// items they last take halves that wait. `count` is a constant, not the thread count, so that
// item boundaries still depend on the routing only.
void split_last_items(std::vector<ExpertItem>& items, std::size_t count, int unit = 1, const TokenGroups* groups = nullptr,
                      int min_rows = 0);

// The order of a phase whose `items` wait for prep items (prep[j][0] is the expert prep item j is
// for): indices into a joint list, j for prep item j and prep.size() + i for items[i]. A prep item
// comes `lead` items before the first item of its expert (at the start if there are fewer), so
// that it is taken, and mostly done, before the items that wait for it (a prep item of an expert
// without items goes last). Prep items come before every item of their expert: a phase run in
// this order cannot deadlock (item_countdowns.hpp).
std::vector<std::uint32_t> lead_items(const std::vector<std::array<int, 2>>& prep, const std::vector<ExpertItem>& items,
                                      std::size_t lead);
// The same with a lead of its own for each prep item j. Prep items whose places tie keep their
// order; one placed earlier may pass another, so no prep item may wait for another.
std::vector<std::uint32_t> lead_items(const std::vector<std::array<int, 2>>& prep, const std::vector<ExpertItem>& items,
                                      const std::function<std::size_t(std::size_t j)>& lead_of);

// out[t] = sum_j w[t,j] * row(t*k + j) over slots with ids >= 0, in slot order (the same sum
// whatever the thread count); weights == nullptr sums the rows unweighted. Slot s's row starts at
// rows + r * ld with r = row_of_slot[s] (TokenGroups::row_of_slot: rows grouped by expert), or
// r = s when row_of_slot is null (one row per slot).
void combine_rows(numa::ThreadPool& pool, const float* rows, std::size_t ld, const int* row_of_slot, std::size_t width, int tokens,
                  int top_k, const std::int64_t* ids, const float* weights, float* out);

// The same over bf16 rows (the forward's down outputs), each token's slots summed in registers by
// `combine` (a kernel table's combine_bf16_rows), in slot order. Idle workers of the pool's
// siblings may join (ThreadPool::Guests::welcome): a token's sum does not depend on who makes it.
void combine_bf16_rows(kernels::CombineBf16RowsFn combine, numa::ThreadPool& pool, const bf16* rows, std::size_t ld,
                       const int* row_of_slot, std::size_t width, int tokens, int top_k, const std::int64_t* ids, const float* weights,
                       float* out);

// The row stride of rows of `Element`, `width` columns rounded up to a multiple of `columns` (what
// the kernels write) plus one cache line: f32 rows exactly 8 KiB apart (width 2048) would put all
// 16 rows of a C tile store in one L1 set, and a token's bf16 rows read together would share sets.
template <typename Element = float>
inline std::size_t padded_row_stride(std::size_t width, std::size_t columns) {
  return (width + columns - 1) / columns * columns + 64 / sizeof(Element);
}

// Adds the time since the previous lap to one phase's total: where the bench's --phases figures
// come from.
template <std::size_t N>
class PhaseClock {
 public:
  explicit PhaseClock(std::array<double, N>& seconds) : seconds_(seconds) {}
  void lap(int phase) { lap_at(phase, std::chrono::steady_clock::now()); }
  // The same with the phase ending at `end` (not before the previous lap).
  void lap_at(int phase, std::chrono::steady_clock::time_point end) {
    end = std::max(end, mark_);
    seconds_[static_cast<std::size_t>(phase)] += std::chrono::duration<double>(end - mark_).count();
    mark_ = end;
  }

 private:
  std::array<double, N>& seconds_;
  std::chrono::steady_clock::time_point mark_ = std::chrono::steady_clock::now();
};

}  // namespace tilemoe
