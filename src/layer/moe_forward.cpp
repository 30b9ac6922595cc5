#include "src/layer/moe_forward.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>

#include "amx/pack_bf16.hpp"
#include "amx/pack_int.hpp"
#include "src/layer/column_bias.hpp"
#include "src/layer/swiglu_form.hpp"
#include "src/layer/work_split.hpp"

namespace tilemoe {
namespace {

// Experts with at least this many rows get x and h in tile order on AMX. From 16 rows (a whole
// A tile) the contiguous tile loads pay for writing x and h in that order.
constexpr int kTileOrderMinRows = 16;
int tile_order_min_rows(const kernels::KernelTable& kt) { return std::max(kt.amx_min_rows, kTileOrderMinRows); }

// h = silu(g) * u (in the shape's SwiGLU form, swiglu_form.hpp) for m rows × columns [col0, col0 + n) of an expert's h
// held in tile order (row length k_padded); g and u have their column col0 at index 0, row stride ldgu.
void silu_mul_into_tiles(const kernels::KernelTable& kt, const float* g, const float* u, std::size_t ldgu, int m, int col0, int n,
                         bf16* tiles, int k_padded, kernels::SwigluForm form) {
  for (int c = col0; c < col0 + n;) {
    const int kb = c / kernels::kBlockK;
    const int end = std::min(col0 + n, (kb + 1) * kernels::kBlockK);
    for (int r = 0; r < m; r += kernels::kATileRows) {
      const std::size_t at = static_cast<std::size_t>(r) * ldgu + static_cast<std::size_t>(c - col0);
      kt.silu_mul_bf16(g + at, ldgu, u + at, ldgu, std::min(kernels::kATileRows, m - r), end - c,
                       kernels::tile_row(tiles, k_padded, r, kb) + c % kernels::kBlockK, kernels::kBlockK, form);
    }
    c = end;
  }
}

// Forward reads the caller's factors as they are: A [rank][in], B [out][rank]; each GEMM item packs
// its own panels of the caller's B (b_by_item), a held set is packed whole once.
void prepare_forward_term(const kernels::KernelTable& kt, const LoraProjectionView& lp, int e, bool packed, std::uint64_t held_generation,
                          LoraTerm& term, bool pack_a = true) {
  if (!lp.active(e)) return term.deactivate();
  term.prepare(kt, lora_a_factor(lp, e), lora_b_factor(lp, e), lp.rank, lp.in,
               lp.out, lp.scale_of(e), packed, held_generation, /*b_by_item=*/true, pack_a);
}

int lora_pack_rows(const kernels::KernelTable& kt) { return kt.amx_min_rows > 0 ? kLoraPackRowsAmx : kLoraPackRows; }

// Integer weights' x Aᵀ of gate and up reads the caller's rows this many at a time: two row tiles,
// the AMX kernel's row block.
constexpr int kXaBlockRows = 2 * kernels::kATileRows;

// Decode's items (experts of 1-3 rows) cover at least 4 panels, the AVX-512 kernel's block, so that
// a core streams four panels of weights at once: one stream a core drew 6-8 GB/s on the AMX device,
// where the memory gives about 145 GB/s to 16 cores with more lines in flight (docs/perf.md, session
// 35). On the device (cases taking turns in one process, two processes) bf16 at 1 token went from
// 1.24 to 1.02-1.13 ms and at 16 tokens from 10.6 to 8.7-9.2 ms (held LoRA r=16); int8 2 % faster,
// int4 (already 4 panels) unchanged; on this repository's Zen 4 machine bf16 at 1 token 3.3 -> 2.3 ms.
// With the kernel's prefetch (session 36) 4 is still the best: bf16 at 1 token 0.816 ms, against
// 0.831 with 8 panels, 0.858 with 2 and 0.919 with 1.
constexpr int kDecodeItemPanels = 4;
// Integer weights' decode items are twice as wide (int8: as many bytes as bf16's; int4: half as many,
// split_expert_columns keeping enough items for every core): their per-item work (waits, the LoRA's
// add, silu_mul, a fresh start of four streams) weighed on items of a half or a quarter of bf16's
// bytes. On the device (held LoRA r = 16, 4 and 8 panels as cases taking turns, three processes on
// one instance, every pair in favour) 8 panels took int4 at 1 token 1.6-1.8 % less time and at 16
// tokens 1.2 %, int8 1.1 % and 2.5 %. int4 at 16 panels was not tried.
int decode_item_panels(int denser) { return kDecodeItemPanels * std::min(denser, 2); }

// The forward's one parallel_for ends with down items, and the workers that run out first wait
// for the last: its last 32 items are halved and the last 16 of those halved again. Session 37's
// clocks had workers idle 1.7-2.4 % of the time after their last item at int8 (512 and 4096 tokens,
// a last item of 0.44 and 1.1 ms). On the device (cases taking turns in one process, three
// processes, held LoRA r = 16) int8 ran 0.3-1.2 % faster at 512 tokens and 1.2-2.6 % at 4096; bf16
// at 512 and 4096 tokens within the noise either way. Experts of fewer than 16 rows keep their
// items: theirs are short already, and decode's stream kDecodeItemPanels panels each for a reason
// (split too, bf16 at 1 token ran as before; int8 and int4 were not measured that way).
constexpr int kTailSplitMinRows = 16;
void split_phase_tail(std::vector<ExpertItem>& items, const TokenGroups& groups) {
  split_last_items(items, 32, 1, &groups, kTailSplitMinRows);
  split_last_items(items, 16, 1, &groups, kTailSplitMinRows);
}

}  // namespace

bool MoeForward::project_columns(Projection p, int e, int m, std::size_t row0, int p0, int p1, ExpertRows a, const LoraTerm* term,
                                 float* c, std::size_t ldc, int n, ItemCountdowns* ready, std::size_t ready_counter, std::size_t ready_slot,
                                 bf16* y, std::size_t ldy) {
  const bool f32_form = term != nullptr && term->active() && !term->packed();
  if (!is_integer_weight_type(w_.weight_type())) {
    const bool mx = w_.weight_type() == WeightType::mxfp4;
    const kernels::Mxfp4Operand mxfp4 = mx ? w_.packed_mxfp4(p, e) : kernels::Mxfp4Operand{};
    kernels::GemmBf16Args g = kernels::gemm_args(a.p, a.ld, m, static_cast<int>(a.ld), mx ? nullptr : w_.packed(p, e), p0, p1, c, ldc);
    g.a_tiles = a.tiles;
    if (f32_form && ready) {
      // The product first: its x Aᵀ is computed by another item meanwhile.
      gemm_main_weights(kt_, g, mx ? &mxfp4 : nullptr);
      ready->wait(ready_counter, ready_slot);
      term->add_f32(kt_, m, p0 * kernels::kPanelColumns, n, c, ldc);
      return false;
    }
    gemm_with_lora_terms(kt_, g, &term, 1, 0, n, mx ? &mxfp4 : nullptr);
    return false;
  }
  const bool down = p == Projection::down;
  const kernels::PackedIntShape& is = w_.int_shape(p);
  const std::size_t ldq = static_cast<std::size_t>(is.k_padded);
  kernels::GemmIntArgs gi{};
  gi.a = (down ? hq_.data() : xq_data_) + qblock_row_[e] * ldq;
  gi.a_tiles = qtiled_[e] != 0;
  gi.lda = ldq;
  gi.m = m;
  gi.a_scale = (down ? hq_scale_.data() : xq_scale_data_) + row0;
  gi.shape = is;
  gi.b = w_.packed_int(p, e);
  gi.panel_begin = p0;
  gi.panel_end = p1;
  gi.c = c;
  gi.ldc = ldc;
  // LoRA stays bf16 on every weight type. Packed (16 rows and more), it is the integer kernel's
  // second product, added as each block of C is written (fused on AMX); from f32, it is added after.
  const bool fused = term != nullptr && term->fuse_into(gi, 0);
  const bool complete = term == nullptr || !term->active() || fused;
  if (complete && y != nullptr) {
    gi.y = y;
    gi.ldy = ldy;
  }
  kt_.gemm_int(gi);
  if (complete) return gi.y != nullptr;
  // Not fused: the f32 form (a packed term always fuses), whose x Aᵀ another item computes.
  if (ready) ready->wait(ready_counter, ready_slot);
  term->add_f32(kt_, m, p0 * kernels::kPanelColumns, n, c, ldc);
  return false;
}

void MoeForward::quantize_rows(const bf16* src, std::size_t ld, int rows, Projection p, std::int8_t* codes, float* scales) {
  const kernels::PackedIntShape& is = w_.int_shape(p);
  kt_.quantize_rows(src, ld, rows, is.k, is.k_padded, codes, static_cast<std::size_t>(is.k_padded), scales);
}

void MoeForward::quantize_rows_as_tiles(const bf16* src, std::size_t ld, int row0, int rows, Projection p, std::int8_t* tiles,
                                        float* scales) {
  // A row tile at a time through a per-thread buffer: the quantizer writes rows.
  const kernels::PackedIntShape& is = w_.int_shape(p);
  thread_local std::vector<std::int8_t> by_rows;
  by_rows.resize(static_cast<std::size_t>(kernels::kIntATileRows) * is.k_padded);
  for (int r = 0; r < rows; r += kernels::kIntATileRows) {
    const int count = std::min(kernels::kIntATileRows, rows - r);
    quantize_rows(src + static_cast<std::size_t>(r) * ld, ld, count, p, by_rows.data(), scales + r);
    kernels::pack_int8_rows_as_tiles(by_rows.data(), static_cast<std::size_t>(is.k_padded), count, is.k_padded, tiles, row0 + r);
  }
}

const char* MoeForward::phase_name(int i) {
  static const char* names[kPhases] = {"gate_up", "down", "combine"};
  return names[i];
}

MoeForward::MoeForward(const PackedExpertWeights& weights, kernels::Isa isa, numa::ThreadPool& pool)
    : w_(weights), isa_(isa), kt_(kernels::kernel_table(isa)), pool_(pool), ws_(pool_workspace<ForwardWorkspace>(pool)) {}

void MoeForward::forward(const LayerLoraView& lora, int tokens, int top_k, const bf16* x, const std::int64_t* ids, const float* weights,
                         float* out, const ForwardSave* save, const ForwardNodes& nodes) {
  SharedGather* const shared = nodes.gather;
  ExpertPartialSums* const down_sums = nodes.down_lora;
  const MoeShape& s = w_.shape();
  TokenGroups groups = group_tokens_by_expert(ids, tokens, top_k, s.num_experts);
  // From here to the end the pool's shared buffers are this call's.
  std::lock_guard<std::mutex> buffers(ws_->in_use);
  const int rows = groups.total();
  const std::size_t hk = static_cast<std::size_t>(w_.up_shape().k_padded);    // x row stride
  const std::size_t ik = static_cast<std::size_t>(w_.down_shape().k_padded);  // h row stride
  const std::size_t hidden = static_cast<std::size_t>(s.hidden);
  const std::size_t inter = static_cast<std::size_t>(s.intermediate);
  // y: one bf16 row per routed row, in TokenGroups order (rows one cache line longer than whole
  // k-blocks, so that a token's rows at one column do not share an L1 set). Each down item
  // converts its C, which stays in its worker's scratch, into its rows of y (integer weights' tile
  // kernel writes them from its flush instead: GemmIntArgs::y); the combine then reads half the
  // bytes of f32 rows (at 4096 tokens of DeepSeek-V2-Lite 100 MB instead of 201).
  const std::size_t y_ld = padded_row_stride<bf16>(hidden, kernels::kBlockK);
  grow_to(y_, static_cast<std::size_t>(rows) * y_ld);
  const bool quantized = is_integer_weight_type(w_.weight_type());
  const std::size_t xq_ld = quantized ? static_cast<std::size_t>(w_.int_shape(Projection::gate).k_padded) : 0;
  const std::size_t hq_ld = quantized ? static_cast<std::size_t>(w_.int_shape(Projection::down).k_padded) : 0;
  if (quantized) {
    if (!shared) grow_to(xq_scale_, static_cast<std::size_t>(rows));
    grow_to(hq_scale_, static_cast<std::size_t>(rows));
  }
  active_.clear();
  for (int e = 0; e < s.num_experts; ++e)
    if (groups.count(e) > 0) active_.push_back(e);
  block_row_.assign(static_cast<std::size_t>(s.num_experts) + 1, 0);
  tiled_.assign(static_cast<std::size_t>(s.num_experts), 0);
  int tile_min_rows = kt_.amx_min_rows == 0 ? 0 : tile_order_min_rows(kt_);
  // Integer codes: where the AMX-INT8 kernel runs (int4 at group 32 only with its scales in
  // column form: otherwise it stays on AVX512-VNNI, which reads rows).
  const bool any_group = quantized && w_.int_shape(Projection::gate).group % kernels::kIntBlockK == 0;
  int qtile_min_rows = quantized ? tile_min_rows : 0;
  if (tile_order_override_ >= 0) tile_min_rows = qtile_min_rows = tile_order_override_;
  if (quantized) tile_min_rows = 0;  // their bf16 x and h only feed the LoRA terms
  if (quantized) {
    qblock_row_.assign(static_cast<std::size_t>(s.num_experts) + 1, 0);
    qtiled_.assign(static_cast<std::size_t>(s.num_experts), 0);
  }
  for (int e = 0; e < s.num_experts; ++e) {
    const int m = groups.count(e);
    tiled_[e] = tile_min_rows > 0 && m >= tile_min_rows;
    const int block_rows = tiled_[e] ? (m + kernels::kATileRows - 1) / kernels::kATileRows * kernels::kATileRows : m;
    block_row_[e + 1] = block_row_[e] + static_cast<std::size_t>(block_rows);
    if (!quantized) continue;
    qtiled_[e] = qtile_min_rows > 0 && m >= qtile_min_rows && (any_group || w_.int4_column_form(e) || tile_order_override_ >= 0);
    const int qrows = qtiled_[e] ? (m + kernels::kIntATileRows - 1) / kernels::kIntATileRows * kernels::kIntATileRows : m;
    qblock_row_[e + 1] = qblock_row_[e] + static_cast<std::size_t>(qrows);
  }
  // Tile order pads each tiled expert to whole row tiles, so the rows held vary with the routing.
  // Buffers grow straight to the most this row count can need: growing by what each call needed
  // reallocated (copying and faulting in tens of MB) on most calls of a new batch size, and
  // doubled the median time of a 4096-token int4 call on the device.
  auto padded_bound = [&](int min_rows) {
    const std::size_t tiled = min_rows > 0 ? static_cast<std::size_t>(std::min(s.num_experts, rows / min_rows)) : 0;
    return static_cast<std::size_t>(rows) + tiled * (kernels::kATileRows - 1);
  };
  auto grow = [](auto& v, std::size_t need, std::size_t bound) {
    if (v.size() < need) v.resize(std::max(need, bound));
  };
  if (quantized) {
    const std::size_t qrows = qblock_row_[s.num_experts], bound = padded_bound(qtile_min_rows);
    if (!shared) grow(xq_, qrows * xq_ld, bound * xq_ld);
    grow(hq_, qrows * hq_ld, bound * hq_ld);
  }
  const bool any_lora = !lora.empty();
  // Integer weights read x as int8 codes, quantized straight from the caller's rows, each token
  // once (token_codes.hpp) and copied into each of its experts' rows; the LoRA's
  // x Aᵀ copies the caller's rows a block at a time into a per-thread buffer (project_xa). No
  // bf16 copy of the gathered x (100 MB at 4096 tokens of DeepSeek-V2-Lite) is written, nor read
  // back from the other cores that wrote it.
  const bool x_rows = !quantized;
  const std::size_t block_rows = block_row_[s.num_experts], bound = padded_bound(tile_min_rows);
  if (x_rows && !shared) grow(xs_, block_rows * hk, bound * hk);
  grow(h_, block_rows * ik, bound * ik);
  bf16* const xs = shared ? shared->x.data() : xs_.data();
  xq_data_ = shared ? shared->codes.data() : xq_.data();
  xq_scale_data_ = shared ? shared->code_scales.data() : xq_scale_.data();
  TokenCodes* const token_codes = shared ? &shared->token_codes : &ws_->token_codes;
  if (quantized && !shared) token_codes->prepare(tokens, xq_ld);
  if (shared) {
    // Where each expert's rows go and in which order: the other nodes must agree.
    std::uint64_t key = 1469598103934665603ull;
    auto mix = [&key](std::uint64_t v) { key = (key ^ v) * 1099511628211ull; };
    for (int e = 0; e < s.num_experts; ++e) {
      if (x_rows) mix(block_row_[e + 1] * 2 + static_cast<std::uint64_t>(tiled_[e]));
      if (quantized) mix(qblock_row_[e + 1] * 2 + static_cast<std::uint64_t>(qtiled_[e]));
    }
    mix(x_rows ? hk : 0);
    mix(quantized ? xq_ld : 0);
    shared->agree_on_layout(key);
  }
  grow_to(lora_, static_cast<std::size_t>(s.num_experts));
  auto saved_xa = [&](Projection p, int e) -> float* {
    float* base = save ? save->xa[static_cast<int>(p)] : nullptr;
    return base ? base + static_cast<std::size_t>(groups.offsets[e]) * lora[p].rank : nullptr;
  };

  PhaseClock clock(phase_seconds_);
  auto lap = [&](int phase) { clock.lap(phase); };

  // The gate_up phase's prep items, each expert's in a row: its gather units (rows grouped by
  // expert, 16 at a time: one row tile for an expert in tile order; zero K padding so the kernels
  // may read whole k-blocks), then its LoRA's. Experts with few rows (decode) take the LoRA form
  // that reads the f32 factors as they are, prepared here (nothing is packed), and project the
  // caller's x rows; experts with more rows pack their factors and project the gathered x, which
  // their prep items do. ready_ counts them per expert (see the gate_up phase).
  const std::size_t experts = static_cast<std::size_t>(s.num_experts);
  prep_.clear();
  down_prep_.clear();
  // ready_'s counters, per expert e: [e] everything a gate_up item waits for, [E + e] the gather
  // units alone, [2E + e] e's h complete (what its down items and down prep items wait for),
  // [3E + e] its down prep items.
  ready_.reset(4 * experts);
  const std::size_t h_done = 2 * experts, down_ready = 3 * experts;
  xa_inputs_left_.assign(experts, 0);
  auto packed_form = [&](int e) { return any_lora && groups.count(e) >= lora_pack_rows(kt_); };
  // Across nodes, down's term of the packed form is added once, by the expert's owner, from the
  // sum of the nodes' s h A_downᵀ (expert_partial_sums.hpp); each node's own goes to its saved
  // values, or to down_partial_, for the owner to read. Every node decides alike.
  const std::size_t down_rank = static_cast<std::size_t>(lora[Projection::down].rank);
  auto summed_down = [&](int e) { return down_sums != nullptr && packed_form(e) && lora[Projection::down].active(e); };
  float* down_partials = nullptr;
  if (down_sums && any_lora && down_rank > 0) {
    down_partials = save ? save->xa[static_cast<int>(Projection::down)] : nullptr;
    if (!down_partials) {
      grow_to(down_partial_, static_cast<std::size_t>(rows) * down_rank);
      down_partials = down_partial_.data();
    }
    down_sums->set_rows(nodes.node, down_partials, down_rank);
  }
  for (int e : active_) {
    const std::size_t ei = static_cast<std::size_t>(e);
    for (int r = 0; r < groups.count(e); r += kernels::kATileRows) {
      prep_.push_back({e, -1 - r});
      ready_.expect(ei);
      ready_.expect(experts + ei);
      ++xa_inputs_left_[ei];
    }
    if (!any_lora) continue;
    if (packed_form(e)) {
      for (int p = 0; p < 3; ++p) {
        prep_.push_back({e, p});
        ready_.expect(ei);
        ++xa_inputs_left_[ei];
      }
      ready_.expect(ei);  // the x Aᵀ of gate and up, once the gather and the packing are done
      continue;
    }
    for (Projection p : kProjections) {
      LoraTerm& term = lora_[e][static_cast<int>(p)];
      prepare_forward_term(kt_, lora[p], e, /*packed=*/false, lora_held_generation_, term);
      if (!term.active()) continue;
      if (p == Projection::down) {
        down_prep_.push_back({e, static_cast<int>(Projection::down)});
      } else {
        prep_.push_back({e, static_cast<int>(p)});
        ready_.expect(ei);
      }
    }
  }
  // Rows [row, row + count) of expert e, from the caller's x, to dst at stride ld (>= hidden), zero
  // from hidden to ld.
  auto copy_x_rows = [&](int e, int row, int count, bf16* dst, std::size_t ld) {
    for (int r = 0; r < count; ++r, dst += ld) {
      std::memcpy(dst, x + static_cast<std::size_t>(groups.token[static_cast<std::size_t>(groups.offsets[e] + row + r)]) * hidden,
                  hidden * sizeof(bf16));
      std::fill(dst + hidden, dst + ld, bf16(0));
    }
  };
  // The rows of x of one gather unit: up to 16 rows of expert e from `row` on.
  static_assert(SharedGather::kUnitRows == kernels::kATileRows && SharedGather::kUnitRows == kernels::kIntATileRows,
                "a gather unit is one A row tile");
  auto copy_unit = [&](int e, int row) {
    const int count = std::min(kernels::kATileRows, groups.count(e) - row);
    const int pos0 = groups.offsets[e] + row;
    try {
      if (quantized) {
        std::int8_t* codes = xq_data_ + qblock_row_[e] * xq_ld;
        const int k_padded = static_cast<int>(xq_ld);
        for (int r = 0; r < count; ++r) {
          const std::size_t t = static_cast<std::size_t>(groups.token[static_cast<std::size_t>(pos0 + r)]);
          auto quantize_token = [&](std::int8_t* dst, float* scale) { quantize_rows(x + t * hidden, hidden, 1, Projection::gate, dst, scale); };
          const std::int8_t* token_row = token_codes->get(static_cast<int>(t), quantize_token, xq_scale_data_[pos0 + r]);
          if (qtiled_[e]) {
            kernels::pack_int8_rows_as_tiles(token_row, xq_ld, 1, k_padded, codes, row + r);
          } else {
            std::memcpy(codes + static_cast<std::size_t>(row + r) * xq_ld, token_row, xq_ld);
          }
        }
      } else if (tiled_[e]) {
        const bf16* src[kernels::kATileRows];
        for (int r = 0; r < count; ++r) src[r] = x + static_cast<std::size_t>(groups.token[pos0 + r]) * hidden;
        kernels::store_row_tile(src, count, s.hidden, static_cast<int>(hk), xs + (block_row_[e] + row) * hk);
      } else {
        copy_x_rows(e, row, count, xs + (block_row_[e] + row) * hk, hk);
      }
    } catch (...) {
      // The other nodes wait for this unit: they must stop, and the layer reports this error.
      if (shared) shared->fail(std::current_exception());
      throw;
    }
    if (shared) shared->done(e);
  };
  // One gather unit as a prep item: this node's h padding, and the rows of x (with a
  // SharedGather, only of a unit this node owns and claims first).
  auto gather_unit = [&](int e, int row) {
    const int count = std::min(kernels::kATileRows, groups.count(e) - row);
    if (tiled_[e]) {
      if (inter % kernels::kBlockK != 0) {
        for (int r = row; r < row + count; ++r) {
          bf16* tail = kernels::tile_row(h_.data() + block_row_[e] * ik, static_cast<int>(ik), r, static_cast<int>(inter / kernels::kBlockK));
          std::fill(tail + inter % kernels::kBlockK, tail + kernels::kBlockK, bf16(0));
        }
      }
    } else {
      for (int r = 0; r < count; ++r) {
        bf16* hrow = h_.data() + (block_row_[e] + row + r) * ik;
        std::fill(hrow + s.intermediate, hrow + ik, bf16(0));
      }
    }
    if (shared && (!shared->owns(nodes.node, e, row) || !shared->claim(e, row))) return;
    copy_unit(e, row);
  };
  // Every row of expert e gathered, before this node reads them: the units still unclaimed (this
  // node's own are claimed by its prep items, which come first) are copied here, the others waited
  // for. A claimed unit is copied by a running worker that waits for nothing in between, so no
  // order of the nodes' items can deadlock.
  auto gathered = [&](int e) {
    if (!shared) return;
    for (int row = 0; row < groups.count(e); row += SharedGather::kUnitRows)
      if (shared->claim(e, row)) copy_unit(e, row);
    shared->wait(e);
  };

  // The caller's B rows that an item's LoRA terms read (the f32 form's add, or a packed term's
  // per-item packing), asked for as the item starts: from the view, not the term, which a prep
  // item may still be preparing. A held packed set does not read them. On the device (per-item
  // clocks, 16 workers) the packing of B's panels took 3.0-3.4 ms of worker time a call instead
  // of 4.5-5.2 at 128 and 512 tokens, r = 16: each item's 1-4 KiB had been a memory miss.
  auto prefetch_lora_b = [&](Projection p, int e, int col0, int n) {
    const LoraProjectionView& lp = lora[p];
    if (!lp.active(e) || (lora_held_generation_ != 0 && packed_form(e))) return;
    const int rows = std::min(n, lp.out - col0);
    if (rows > 0)
      prefetch_range(lora_b_factor(lp, e).offset(col0, 0).data, static_cast<std::size_t>(rows) * lp.rank * lp.element_bytes());
  };

  // gate_up
  const int up_panels = w_.up_shape().panels;
  // Integer and MXFP4 weights are 2x (int8) or 4x (int4, mxfp4) denser than bf16: items of as many bytes.
  const int denser = w_.weight_type() == WeightType::int8 ? 2 : is_four_bit_weight_type(w_.weight_type()) ? 4 : 1;
  const std::vector<ExpertItem> items =
      split_expert_columns(active_, groups, up_panels, 1, s.hidden, denser, kt_.few_row_item_panels, decode_item_panels(denser));
  // Each expert's prep items (above) run in this phase, some items ahead of its first GEMM item.
  // The GEMM items wait for them (item_countdowns.hpp) while other cores stream weights: ready_[e]
  // counts everything an item of e waits for, ready_[E + e] the gather units alone (what the
  // product, and a packed term's x Aᵀ, read). With a phase of its own the gather took 1.0-1.5 ms
  // of a 12-15 ms forward at 512 tokens on the device (each 16-row unit 75-100 us, whatever the
  // copy's form), and the lora_prep phase 0.4-0.6.
  // The LoRA's prep items (the factors read from memory, 90-130 KiB an expert and projection: about
  // 20 us on one core) go twice as far ahead as the gather units: at a lead of two items a worker,
  // the GEMM items of 128 tokens (a few us each) caught up with them and spun. On the device
  // (builds taking turns, three rounds) the LoRA's cost at 128 tokens went from 9.8 to 8.4 %;
  // 1 and 512 tokens did not change beyond the noise.
  const std::size_t lead = 2 * static_cast<std::size_t>(pool_.size());
  const std::size_t lora_lead = 2 * lead;
  const std::vector<std::uint32_t> order =
      lead_items(prep_, items, [&](std::size_t j) { return prep_[j][1] >= 0 ? lora_lead : lead; });
  const std::size_t prep_count = prep_.size();
  // Nodes on one memory node also share the packed form's A of gate and up and its x Aᵀ
  // (shared_gather.hpp), for the caller's arrays: a held set packs A once anyway.
  const bool share_lora = shared != nullptr && any_lora && lora_held_generation_ == 0;
  auto run_prep = [&](const std::array<int, 2>& lora_item, int worker) {
    const auto [e, pi] = lora_item;
    const Projection p = static_cast<Projection>(pi);
    LoraTerm& term = lora_[e][pi];
    const int m = groups.count(e);
    const std::size_t rank = static_cast<std::size_t>(lora[p].rank);
    if (m >= lora_pack_rows(kt_)) {
      // Packing reads only the factors; the x Aᵀ that needs the gathered x is project_xa's.
      const bool shared_a = share_lora && p != Projection::down;
      const bool mine = !shared_a || shared->claim_packed_a(e, pi);
      try {
        prepare_forward_term(kt_, lora[p], e, /*packed=*/true, lora_held_generation_, term, /*pack_a=*/mine);
      } catch (...) {
        if (shared_a && mine) shared->fail(std::current_exception());
        throw;
      }
      if (shared_a && mine) shared->publish_packed_a(e, pi, &term);
      return;
    }
    // The expert's few x rows into a per-thread block, so that A is read once for all of them
    // (the f32 form reads `in` elements a row: no padding needed).
    thread_local std::vector<bf16> rows_of_x;
    grow_to(rows_of_x, static_cast<std::size_t>(m) * hidden);
    copy_x_rows(e, 0, m, rows_of_x.data(), hidden);
    term.project(kt_, rows_of_x.data(), hidden, m, static_cast<int>(hk), scratch_[worker], saved_xa(p, e), rank);
  };
  // The packed form's s x Aᵀ of gate and up, run by the prep item that completes the expert's
  // gather and factor packing, so that no prep item waits for another: in the LoRA's prep items
  // they spun on the gather first. On the device (512 tokens, r = 16, builds taking turns) the
  // LoRA's cost over r = 0 went from 7.3 to 6.0 % (gate_up from +0.76 to +0.59 ms); 128 tokens
  // did not change.
  auto project_xa_here = [&](int e, int worker) {
    if (x_rows) {
      gathered(e);
      const ExpertRows xe = expert_rows(xs, e, hk);
      for (Projection p : {Projection::gate, Projection::up})
        lora_[e][static_cast<int>(p)].project(kt_, xe.p, hk, groups.count(e), static_cast<int>(hk), scratch_[worker], saved_xa(p, e),
                                              static_cast<std::size_t>(lora[p].rank), xe.tiles);
      return;
    }
    // Integer weights: kXaBlockRows of the caller's rows at a time (128 KiB at hidden 2048), which
    // stay in this core's cache for both projections. The rows lie one cache line more than whole
    // k-blocks apart (padded_row_stride): 4 KiB apart, a tile load's 16 lines fell in one L1 set
    // (4.0 worker-ms a call at 512 tokens, r = 16, against 2.3 for the bf16 weights' tiles). Copied
    // whole, each a sequential 4 KiB, they also beat rows copied into tile order: on the device
    // (cases taking turns, three processes) int8's held LoRA at 512 tokens cost 8.0 % over r = 0
    // instead of 9.5 %; at 4096, +10.7 / +12.3 % against +11.5 / +10.3 %, within that noise.
    // Gate's and up's projections of a block are one product (LoraTerm::project_rows_pair): on the
    // device (held r = 16, cases taking turns, four processes) int8 at 4096 tokens took 0.6-3.5 %
    // less time than with one product each, 512 tokens the same. bf16's x (above) projects whole
    // experts in tile order, where one product for both was 0.8-3.0 % slower at 4096 tokens.
    const int m = groups.count(e);
    const std::size_t ld_block = padded_row_stride<bf16>(hk, kernels::kBlockK);
    thread_local AlignedVector<bf16> block;
    block.resize(static_cast<std::size_t>(kXaBlockRows) * ld_block);
    LoraTerm& gate = lora_[e][static_cast<int>(Projection::gate)];
    LoraTerm& up = lora_[e][static_cast<int>(Projection::up)];
    gate.start_rows(m);
    up.start_rows(m);
    for (int r0 = 0; r0 < m; r0 += kXaBlockRows) {
      const int count = std::min(kXaBlockRows, m - r0);
      copy_x_rows(e, r0, count, block.data(), ld_block);
      LoraTerm::project_rows_pair(kt_, gate, up, block.data(), ld_block, r0, count, static_cast<int>(hk), scratch_[worker],
                                  saved_xa(Projection::gate, e), static_cast<std::size_t>(lora[Projection::gate].rank),
                                  saved_xa(Projection::up, e), static_cast<std::size_t>(lora[Projection::up].rank));
    }
  };
  // With share_lora, one node computes each expert's x Aᵀ of gate and up (from A packed here or by
  // another node) and the others read it, and copy its saved values into their own cache entries.
  auto project_xa = [&](int e, int worker) {
    if (!share_lora) return project_xa_here(e, worker);
    const std::array<Projection, 2> gate_up{Projection::gate, Projection::up};
    if (!shared->claim_xa(e)) {
      const SharedGather::Projected& got = shared->wait_xa(e);
      for (int i = 0; i < 2; ++i) {
        LoraTerm& term = lora_[e][static_cast<int>(gate_up[i])];
        if (!term.active()) continue;
        term.read_xa_of(*got.term[i]);
        if (float* keep = saved_xa(gate_up[i], e); keep && got.saved[i])
          std::copy_n(got.saved[i], static_cast<std::size_t>(groups.count(e)) * static_cast<std::size_t>(term.rank()), keep);
      }
      return;
    }
    try {
      for (int i = 0; i < 2; ++i) {
        LoraTerm& term = lora_[e][static_cast<int>(gate_up[i])];
        if (term.active() && !term.has_own_packed_a())
          term.read_packed_a_of(shared->wait_packed_a(e, static_cast<int>(gate_up[i])));
      }
      project_xa_here(e, worker);
    } catch (const SharedGather::Stopped&) {
      throw;
    } catch (...) {
      shared->fail(std::current_exception());
      throw;
    }
    shared->publish_xa(e, {{&lora_[e][0], &lora_[e][1]}, {saved_xa(Projection::gate, e), saved_xa(Projection::up, e)}});
  };
  // Once all of an expert's h is written, integer weights need h's int8 codes, and a packed down
  // LoRA needs s h A_down^T before the down items can fuse it. The gate_up item that finishes the
  // expert's last columns does that, so no phase (and no barrier) waits for it: which worker does
  // it varies, what it computes does not. (The f32 form's h A_down^T has items of the down phase.)
  const bool finish_h = any_lora || quantized;
  auto finish_expert = [&](int e, int worker) {
    const ExpertRows he = expert_rows(h_, e, ik);
    if (quantized) {
      std::int8_t* codes = hq_.data() + qblock_row_[e] * hq_ld;
      float* scales = hq_scale_.data() + groups.offsets[e];
      if (qtiled_[e]) {
        quantize_rows_as_tiles(he.p, ik, 0, groups.count(e), Projection::down, codes, scales);
      } else {
        quantize_rows(he.p, ik, groups.count(e), Projection::down, codes, scales);
      }
    }
    LoraTerm& down = lora_[e][static_cast<int>(Projection::down)];
    if (!any_lora || groups.count(e) < lora_pack_rows(kt_) || !down.active()) return;
    const bool summed = summed_down(e);
    float* keep = summed ? down_partials + static_cast<std::size_t>(groups.offsets[e]) * down_rank : saved_xa(Projection::down, e);
    down.project(kt_, he.p, ik, groups.count(e), static_cast<int>(ik), scratch_[worker], keep, down_rank, he.tiles);
    if (summed) down_sums->publish(e);
  };
  h_items_left_.assign(static_cast<std::size_t>(s.num_experts), 0);
  for (const ExpertItem& it : items) ++h_items_left_[static_cast<std::size_t>(it.expert)];
  for (int e : active_) ready_.expect(h_done + static_cast<std::size_t>(e));
  auto run_gate_up = [&](std::size_t slot, int worker) {
    const std::size_t item = order[slot];
    if (item < prep_count) {
      const auto [e, code] = prep_[item];
      if (code < 0) {
        gather_unit(e, -1 - code);
        ready_.count_down(experts + static_cast<std::size_t>(e));
      } else {
        run_prep(prep_[item], worker);
      }
      ready_.count_down(static_cast<std::size_t>(e));
      // acq_rel: the item that takes the count to zero sees the other items' rows and factors.
      if (packed_form(e) &&
          std::atomic_ref<int>(xa_inputs_left_[static_cast<std::size_t>(e)]).fetch_sub(1, std::memory_order_acq_rel) == 1) {
        project_xa(e, worker);
        ready_.count_down(static_cast<std::size_t>(e));
      }
      return;
    }
    auto [e, p0, p1] = items[item - prep_count];
    int m = groups.count(e);
    int cols = (p1 - p0) * kernels::kPanelColumns;
    int col0 = p0 * kernels::kPanelColumns;
    int n = std::min(cols, s.intermediate - col0);
    for (Projection p : {Projection::gate, Projection::up}) prefetch_lora_b(p, e, col0, n);
    // The product reads the gathered rows, and a packed term whole: those prep items first. An f32
    // term's x Aᵀ is waited for only where it is added, after the product.
    ready_.wait((any_lora && m >= lora_pack_rows(kt_) ? 0 : experts) + static_cast<std::size_t>(e), slot);
    gathered(e);
    auto& scratch = scratch_[worker];
    grow_to(scratch, static_cast<std::size_t>(2) * m * cols);
    float* cg = scratch.data();
    float* cu = cg + static_cast<std::size_t>(m) * cols;
    const std::size_t row0 = static_cast<std::size_t>(groups.offsets[e]);
    for (Projection p : {Projection::gate, Projection::up}) {
      const LoraTerm* term = any_lora ? &lora_[e][static_cast<int>(p)] : nullptr;
      const ExpertRows xe = x_rows ? expert_rows(xs, e, hk) : ExpertRows{nullptr, hk, false};
      project_columns(p, e, m, row0, p0, p1, xe, term, p == Projection::gate ? cg : cu, static_cast<std::size_t>(cols), n, &ready_,
                      static_cast<std::size_t>(e), slot);
    }
    // The experts' biases (gpt-oss) before anything reads gate and up: the saved values hold them.
    if (const float* b = w_.biases().of(Projection::gate, e)) add_column_bias(cg, static_cast<std::size_t>(cols), m, n, b + col0);
    if (const float* b = w_.biases().of(Projection::up, e)) add_column_bias(cu, static_cast<std::size_t>(cols), m, n, b + col0);
    if (save) {
      kernels::convert_rows_to_bf16(kt_.convert_to_bf16, cg, static_cast<std::size_t>(cols), m, static_cast<std::size_t>(n), 1.0f,
                                    save->gate + row0 * inter + col0, inter);
      kernels::convert_rows_to_bf16(kt_.convert_to_bf16, cu, static_cast<std::size_t>(cols), m, static_cast<std::size_t>(n), 1.0f,
                                    save->up + row0 * inter + col0, inter);
      // The backward's clamp masks then read what these f32 values decided.
      if (s.swiglu_limit > 0) {
        kt_.keep_clamp_sides(cg, static_cast<std::size_t>(cols), m, n, save->gate + row0 * inter + col0, inter, s.swiglu_limit, false);
        kt_.keep_clamp_sides(cu, static_cast<std::size_t>(cols), m, n, save->up + row0 * inter + col0, inter, s.swiglu_limit, true);
      }
    }
    const ExpertRows he = expert_rows(h_, e, ik);
    if (he.tiles) {
      silu_mul_into_tiles(kt_, cg, cu, static_cast<std::size_t>(cols), m, col0, n, he.p, static_cast<int>(ik), swiglu_form(s));
    } else {
      kt_.silu_mul_bf16(cg, static_cast<std::size_t>(cols), cu, static_cast<std::size_t>(cols), m, n, he.p + col0, ik, swiglu_form(s));
    }
    // acq_rel: the item that takes the count to zero sees every other item's h, and hands it on to
    // the down items with h_done.
    if (std::atomic_ref<int>(h_items_left_[static_cast<std::size_t>(e)]).fetch_sub(1, std::memory_order_acq_rel) == 1) {
      if (finish_h) finish_expert(e, worker);
      ready_.count_down(h_done + static_cast<std::size_t>(e));
    }
  };

  // down: straight into y's rows, each expert's items once its h is complete. Few-row experts'
  // s h A_down^T are prep items ahead of their experts' GEMM items, which add the term once it is
  // ready.
  std::vector<ExpertItem> down_items =
      split_expert_columns(active_, groups, w_.down_shape().panels, 1, s.intermediate, denser, kt_.few_row_item_panels,
                           decode_item_panels(denser));
  split_phase_tail(down_items, groups);
  if (down_sums)
    for (int e : active_)
      if (summed_down(e) && down_sums->owner(e) == nodes.node) down_prep_.push_back({e, -1});
  auto adds_down_term = [&](int e) { return any_lora && (!summed_down(e) || down_sums->owner(e) == nodes.node); };
  for (const auto& [e, p] : down_prep_) ready_.expect(down_ready + static_cast<std::size_t>(e));
  const std::vector<std::uint32_t> down_order = lead_items(down_prep_, down_items, lora_lead);
  // slot: in the one parallel_for below, after gate_up's.
  auto run_down = [&](std::size_t slot, int worker) {
    const std::size_t item = down_order[slot - order.size()];
    if (item < down_prep_.size()) {
      const auto [e, code] = down_prep_[item];
      ready_.wait(h_done + static_cast<std::size_t>(e), slot);
      LoraTerm& term = lora_[e][static_cast<int>(Projection::down)];
      if (code < 0) {
        // The summed term this node adds: every node's s h A_downᵀ of e, in node order.
        const int m = groups.count(e);
        auto& sum = scratch_[worker];
        grow_to(sum, static_cast<std::size_t>(m) * down_rank);
        down_sums->sum(e, static_cast<std::size_t>(groups.offsets[e]), m, static_cast<int>(down_rank), sum.data(), down_rank);
        term.load_xa(sum.data(), down_rank, m);
      } else {
        const ExpertRows he = expert_rows(h_, e, ik);
        term.project(kt_, he.p, ik, groups.count(e), static_cast<int>(ik), scratch_[worker], saved_xa(Projection::down, e), down_rank,
                     he.tiles);
      }
      ready_.count_down(down_ready + static_cast<std::size_t>(e));
      return;
    }
    auto [e, p0, p1] = down_items[item - down_prep_.size()];
    ready_.wait(h_done + static_cast<std::size_t>(e), slot);
    const int col0 = p0 * kernels::kPanelColumns;
    const int n = std::min((p1 - p0) * kernels::kPanelColumns, s.hidden - col0);
    const LoraTerm* term = adds_down_term(e) ? &lora_[e][static_cast<int>(Projection::down)] : nullptr;
    if (term) prefetch_lora_b(Projection::down, e, col0, n);
    // A summed term is loaded by a prep item of this phase.
    if (term && summed_down(e)) ready_.wait(down_ready + static_cast<std::size_t>(e), slot);
    const std::size_t row0 = static_cast<std::size_t>(groups.offsets[e]);
    const int m = groups.count(e);
    const std::size_t cols = static_cast<std::size_t>(p1 - p0) * kernels::kPanelColumns;
    auto& c = scratch_[worker];
    grow_to(c, static_cast<std::size_t>(m) * cols);
    bf16* const y_rows = y_.data() + row0 * y_ld + col0;
    // A bias is added to C, so the product does not write y itself then.
    const float* bias = w_.biases().of(Projection::down, e);
    if (project_columns(Projection::down, e, m, row0, p0, p1, expert_rows(h_, e, ik), term, c.data(), cols, n, &ready_,
                        down_ready + static_cast<std::size_t>(e), slot, bias ? nullptr : y_rows, y_ld))
      return;
    if (bias) add_column_bias(c.data(), cols, m, n, bias + col0);
    kernels::convert_rows_to_bf16(kt_.convert_to_bf16, c.data(), cols, m, static_cast<std::size_t>(n), 1.0f, y_rows, y_ld);
  };

  // Both in one parallel_for, down's after all of gate_up's: a worker that runs out of gate_up
  // items starts on the down items of experts whose h is complete instead of waiting at a phase
  // end for the last gate_up items (on the device at 4096 tokens, 0.6-1.0 ms a worker at
  // gate_up's end; with one parallel_for, int8 took 35.3-35.8 ms against 37.1-37.2 in the same
  // process, bf16 about as before). Every item waits only for items before it in the list, so
  // it cannot deadlock (item_countdowns.hpp). --phases counts gate_up until its last item ends.
  const std::size_t gate_up_slots = order.size();
  // The slots that count each counter down, named, so that ItemCountdowns checks the order of
  // every wait: a prep item its expert's [e] (one of them, as it runs, also the x Aᵀ's count) and,
  // a gather unit, [E + e]; an expert's gate_up items [2E + e] (the last to end counts it down); a
  // down prep item [3E + e].
  for (std::size_t slot = 0; slot < gate_up_slots; ++slot) {
    if (const std::size_t item = order[slot]; item < prep_count) {
      const std::size_t e = static_cast<std::size_t>(prep_[item][0]);
      ready_.produced_by(e, slot);
      if (prep_[item][1] < 0) ready_.produced_by(experts + e, slot);
    } else {
      ready_.produced_by(h_done + static_cast<std::size_t>(items[item - prep_count].expert), slot);
    }
  }
  for (std::size_t i = 0; i < down_order.size(); ++i)
    if (down_order[i] < down_prep_.size())
      ready_.produced_by(down_ready + static_cast<std::size_t>(down_prep_[down_order[i]][0]), gate_up_slots + i);
  std::atomic<std::size_t> gate_up_left{gate_up_slots};
  // Written once, by the item that ends gate_up; read after the parallel_for has returned.
  std::chrono::steady_clock::time_point gate_up_end{};
  auto gate_up_done = [&] {
    if (gate_up_left.fetch_sub(1, std::memory_order_acq_rel) == 1) gate_up_end = std::chrono::steady_clock::now();
  };
  // Idle workers of the other virtual nodes on this memory node join in (ThreadPool::link_siblings):
  // the weights they then stream lie in the memory they would have streamed anyway.
  ready_.parallel_for(
      pool_, gate_up_slots + down_order.size(),
      [&](std::size_t slot, int worker) {
        if (slot >= gate_up_slots) return run_down(slot, worker);
        run_gate_up(slot, worker);
        gate_up_done();
      },
      numa::ThreadPool::Guests::welcome);
  clock.lap_at(0, gate_up_slots > 0 ? gate_up_end : std::chrono::steady_clock::now());
  lap(1);

  combine_bf16_rows(kt_.combine_bf16_rows, pool_, y_.data(), y_ld, groups.row_of_slot.data(), hidden, tokens, top_k, ids, weights, out);
  lap(2);
}

}  // namespace tilemoe
