#include "src/layer/work_split.hpp"

#include <algorithm>

namespace tilemoe {

namespace {
// 16-63 rows: 8 panels (128 columns). An item's weights stream from memory, and at 48 rows per
// expert (512 tokens of DeepSeek-V2-Lite) 4 panels instead of 2 took the forward's down phase from
// 6.0-6.3 to 5.1-5.6 ms and the backward (whose items gather one 1 KiB block from every panel of W
// per 32 columns) from 30.2 to 26.1 ms on the device; 8 instead of 4 then took the fine-tuning step
// 1.7 % faster and int8's forward 6-7 % (cases taking turns in one process).
// 4-15 rows: the kernel table's width (KernelTable::few_row_item_panels). 1-3 rows (decode): 1 panel,
// then at least the caller's decode_panels, as long as every core of a many-core machine still has
// items to stream (kMinDecodeItems).
int panels_per_item(int rows, int few_row_panels) { return rows >= 16 ? 8 : rows >= 4 ? few_row_panels : 1; }
constexpr int kDecodeRows = 4;  // experts of fewer rows are decode's
// A phase keeps at least this many items when its decode items widen (decode_panels), so that a
// machine of many cores still has an item for each.
constexpr std::size_t kMinDecodeItems = 64;
// The reduction length the chunk sizes above are for: a shorter one widens the items so that each
// streams about as many bytes. DeepSeek-V2-Lite's down projection (k = 1408) gets twice the
// columns of gate and up (k = 2048): on the device (cases taking turns) its phase went from
// 7.14 to 6.48 ms at 512 tokens (bf16, r=16), 4.09 to 3.71 (int8), and 31 to 29 ms at 4096 tokens,
// against 1024 here before.
constexpr int kItemReduction = 2048;
// From 16 rows items are 8 panels wide, and an int8 or int4 k-block (64 inputs) is twice a bf16
// one (32): integer items of twice bf16's panels are as much work, and int4 widened as its bytes
// (4x) had items of 32 panels of gate_up and 64 of down at 384 rows (4096 tokens of
// DeepSeek-V2-Lite): 3 and 2 items an expert. On the device (cases taking turns in one process,
// two calls) int4 sized as int8 took 4096 tokens from 36.80 / 38.89 to 35.57 / 36.40 ms (r=16:
// 48.54 to 47.01) and 1024 tokens from 10.89 / 11.52 to 10.59 / 11.02.
constexpr int kDensityCapRows = 16;
constexpr int kDensityCap = 2;
}  // namespace

std::vector<ExpertItem> split_expert_columns(const std::vector<int>& active, const TokenGroups& groups, int panels, int unit, int k,
                                             int denser, int few_row_panels, int decode_panels) {
  std::vector<ExpertItem> items;
  const int reduction_widen = k > 0 ? std::clamp((kItemReduction + k - 1) / k, 1, 4) : 1;
  auto step_for = [&](int rows, int decode) {
    const int density = std::clamp(rows >= kDensityCapRows ? std::min(denser, kDensityCap) : denser, 1, 4);
    const int step = std::max(unit, panels_per_item(rows, std::max(1, few_row_panels)) * reduction_widen * density / unit * unit);
    return rows < kDecodeRows ? std::max(step, (decode + unit - 1) / unit * unit) : step;
  };
  // Decode's width: decode_panels, halved while the phase would have fewer than kMinDecodeItems
  // items. It depends on the routing and the shape only, as every item boundary here.
  int decode = std::max(1, decode_panels);
  const bool any_decode = std::any_of(active.begin(), active.end(), [&](int e) { return groups.count(e) < kDecodeRows; });
  while (any_decode && decode > 1) {
    std::size_t count = 0;
    for (int e : active) {
      const int step = step_for(groups.count(e), decode);
      count += static_cast<std::size_t>((panels + step - 1) / step);
    }
    if (count >= kMinDecodeItems) break;
    decode /= 2;
  }
  for (int e : active) {
    const int step = step_for(groups.count(e), decode);
    for (int p0 = 0; p0 < panels; p0 += step) items.push_back({e, p0, std::min(panels, p0 + step)});
  }
  return items;
}

void split_last_items(std::vector<ExpertItem>& items, std::size_t count, int unit, const TokenGroups* groups, int min_rows) {
  const std::size_t first = items.size() > count ? items.size() - count : 0;
  std::vector<ExpertItem> tail;
  tail.reserve(2 * (items.size() - first));
  for (std::size_t i = first; i < items.size(); ++i) {
    const ExpertItem it = items[i];
    const int units = (it.p1 - it.p0) / unit;
    if (units < 2 || (groups && groups->count(it.expert) < min_rows)) {
      tail.push_back(it);
      continue;
    }
    const int mid = it.p0 + units / 2 * unit;
    tail.push_back({it.expert, it.p0, mid});
    tail.push_back({it.expert, mid, it.p1});
  }
  items.resize(first);
  items.insert(items.end(), tail.begin(), tail.end());
}

std::vector<std::uint32_t> lead_items(const std::vector<std::array<int, 2>>& prep, const std::vector<ExpertItem>& items,
                                      std::size_t lead) {
  return lead_items(prep, items, [lead](std::size_t) { return lead; });
}

std::vector<std::uint32_t> lead_items(const std::vector<std::array<int, 2>>& prep, const std::vector<ExpertItem>& items,
                                      const std::function<std::size_t(std::size_t j)>& lead_of) {
  // Each expert's first item, indexed by expert id (a flat table: this runs before two phases of
  // every decode step, where a hash map cost about 2 us a call).
  int max_expert = -1;
  for (const ExpertItem& it : items) max_expert = std::max(max_expert, it.expert);
  constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  std::vector<std::size_t> first(static_cast<std::size_t>(max_expert + 1), kNone);
  for (std::size_t i = items.size(); i-- > 0;) first[static_cast<std::size_t>(items[i].expert)] = i;
  // (before item, prep item): the place of each prep item.
  std::vector<std::pair<std::size_t, std::uint32_t>> at;
  at.reserve(prep.size());
  for (std::size_t j = 0; j < prep.size(); ++j) {
    const int e = prep[j][0];
    const std::size_t lead = lead_of(j);
    const bool has_items = e >= 0 && e <= max_expert && first[static_cast<std::size_t>(e)] != kNone;
    const std::size_t i = has_items ? first[static_cast<std::size_t>(e)] : items.size() + lead;
    at.push_back({i > lead ? i - lead : 0, static_cast<std::uint32_t>(j)});
  }
  const auto earlier = [](const auto& a, const auto& b) { return a.first < b.first; };
  if (!std::is_sorted(at.begin(), at.end(), earlier)) std::stable_sort(at.begin(), at.end(), earlier);
  std::vector<std::uint32_t> order;
  order.reserve(prep.size() + items.size());
  std::size_t next = 0;
  for (std::size_t i = 0; i <= items.size(); ++i) {
    for (; next < at.size() && at[next].first <= i; ++next) order.push_back(at[next].second);
    if (i < items.size()) order.push_back(static_cast<std::uint32_t>(prep.size() + i));
  }
  return order;
}

void combine_rows(numa::ThreadPool& pool, const float* rows, std::size_t ld, const int* row_of_slot, std::size_t width, int tokens,
                  int top_k, const std::int64_t* ids, const float* weights, float* out) {
  pool.parallel_for(static_cast<std::size_t>(tokens), [&](std::size_t t, int) {
    float* o = out + t * width;
    std::fill(o, o + width, 0.0f);
    for (int j = 0; j < top_k; ++j) {
      const std::size_t slot = t * top_k + j;
      if (ids[slot] < 0) continue;
      const std::size_t row = row_of_slot ? static_cast<std::size_t>(row_of_slot[slot]) : slot;
      const float* y = rows + row * ld;
      if (weights) {
        const float wt = weights[slot];
        for (std::size_t c = 0; c < width; ++c) o[c] += wt * y[c];
      } else {
        for (std::size_t c = 0; c < width; ++c) o[c] += y[c];
      }
    }
  }, 4);
}

void combine_bf16_rows(kernels::CombineBf16RowsFn combine, numa::ThreadPool& pool, const bf16* rows, std::size_t ld,
                       const int* row_of_slot, std::size_t width, int tokens, int top_k, const std::int64_t* ids, const float* weights,
                       float* out) {
  pool.parallel_for(static_cast<std::size_t>(tokens), [&](std::size_t t, int) {
    thread_local std::vector<const bf16*> slot_rows;
    thread_local std::vector<float> slot_weights;
    slot_rows.clear();
    slot_weights.clear();
    for (int j = 0; j < top_k; ++j) {
      const std::size_t slot = t * top_k + j;
      if (ids[slot] < 0) continue;
      const std::size_t row = row_of_slot ? static_cast<std::size_t>(row_of_slot[slot]) : slot;
      slot_rows.push_back(rows + row * ld);
      slot_weights.push_back(weights ? weights[slot] : 1.0f);
    }
    combine(slot_rows.data(), weights ? slot_weights.data() : nullptr, static_cast<int>(slot_rows.size()), width, out + t * width);
  }, 4, numa::ThreadPool::Guests::welcome);
}

}  // namespace tilemoe
