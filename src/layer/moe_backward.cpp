#include "src/layer/moe_backward.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stdexcept>

#include "amx/aligned_vector.hpp"
#include "amx/pack_transposed.hpp"
#include "amx/zero_streaming.hpp"
#include "src/layer/swiglu_form.hpp"
#include "src/layer/work_split.hpp"
#include "src/routing/token_groups.hpp"

namespace tilemoe {
namespace {

// The backward products run the forward's LoRA term transposed: for dIn = dOut W + s (dOut B) A
// the term's first factor is Bᵀ ([rank][out]) and its second Aᵀ ([in][rank]), both read in place.
void prepare_backward_term(const kernels::KernelTable& kt, const LoraProjectionView& lp, int e, int rows, LoraTerm& term) {
  if (!lp.active(e)) return term.deactivate();
  const kernels::StridedFactor b = lora_b_factor(lp, e);
  const kernels::StridedFactor a = lora_a_factor(lp, e);
  // Each dh / dx item packs its own panels of Aᵀ (b_by_item), as the forward's items do with B.
  term.prepare(kt, b.transposed(), a.transposed(), lp.rank, lp.out, lp.in, lp.scale_of(e), rows >= kLoraPackRows, 0,
               /*b_by_item=*/true);
}

// Experts with at most this many rows take the split-K form of the products with W: decode.
// There a column-split item would read one 1 KiB block from each of W's panels (scattered over
// the whole matrix, which the hardware prefetchers cannot follow) for a row or two of work; a
// split-K item instead streams a few whole panels in order, like the forward, and the partial
// sums (a row of f32 per item) are added up afterwards in a fixed order.
constexpr int kSplitKMaxRows = 3;
constexpr int kSplitKPanels = 8;
// The split-K sums add the LoRA terms from f32, the form a term takes for few rows.
static_assert(kSplitKMaxRows < kLoraPackRows);  // forward panels per split-K item: 352-512 KiB of weights at V2-Lite's size

// One split-K item: the partial product over W's panels [nb0, nb1) (W's outputs, the reduction
// here) for every k-column of W: c[m][k_padded] = a[:, nb0*16 ..] · W[nb0*16 .. nb1*16, :].
template <typename Transpose>
void split_k_partial(const kernels::KernelTable& kt, const Transpose& transpose, const kernels::PackedShape& w, int nb0, int nb1,
                     const bf16* a, std::size_t lda, int m, AlignedVector<bf16>& buffer, float* c) {
  const int panels = nb1 - nb0;
  const std::size_t panel_stride = static_cast<std::size_t>(kernels::transposed_kblocks(panels)) * kernels::kBlockElements;
  grow_to(buffer, 2 * static_cast<std::size_t>(w.kblocks) * panel_stride);
  for (int kb = 0; kb < w.kblocks; ++kb)
    transpose(nb0, nb1, kb, buffer.data() + 2 * static_cast<std::size_t>(kb) * panel_stride, panel_stride);
  kt.gemm_bf16(kernels::gemm_args(a + static_cast<std::size_t>(nb0) * kernels::kPanelColumns, lda, m,
                                  kernels::transposed_kblocks(panels) * kernels::kBlockK, buffer.data(), 0, 2 * w.kblocks, c,
                                  static_cast<std::size_t>(w.k_padded)));
}

// c[i][j] = sum over `count` partials of partial[i][j], in order; partials are [m][ld] apart by stride.
void sum_partials(const float* partials, int count, std::size_t stride, int m, int n, std::size_t ld, float* c, std::size_t ldc) {
  for (int i = 0; i < m; ++i) {
    float* ci = c + static_cast<std::size_t>(i) * ldc;
    std::copy_n(partials + static_cast<std::size_t>(i) * ld, n, ci);
    for (int q = 1; q < count; ++q) {
      const float* pi = partials + q * stride + static_cast<std::size_t>(i) * ld;
      for (int j = 0; j < n; ++j) ci[j] += pi[j];
    }
  }
}

}  // namespace

// W's panels [nb0, nb1) at k-block kb as two Wᵀ panels, from bf16 packed weights or, training
// through a frozen quantized base, dequantized from the int8/int4 codes or the MXFP4 ones (that
// k-block of those panels into a small bf16 buffer first, then transposed as bf16 weights are).
std::function<void(int, int, int, bf16*, std::size_t)> MoeBackward::transposer(Projection p, int e) const {
  if (w_.weight_type() == WeightType::mxfp4) {
    const kernels::Mxfp4Operand mx = w_.packed_mxfp4(p, e);
    const kernels::DequantizeMxfp4Fn dequantize = kt_.dequantize_mxfp4;
    const kernels::PackTransposedFn fn = kt_.pack_transposed_kblock;
    return [mx, dequantize, fn](int nb0, int nb1, int kb, bf16* dst, std::size_t stride) {
      thread_local AlignedVector<bf16> block;
      grow_to(block, static_cast<std::size_t>(nb1 - nb0) * kernels::kBlockElements);
      dequantize(mx.shape, mx.view, nb0, nb1, kb, kb + 1, block.data());
      fn(block.data(), nb1 - nb0, 1, 0, dst, stride);
    };
  }
  if (w_.weight_type() != WeightType::bf16) {
    const kernels::PackedIntShape* s = &w_.int_shape(p);
    const kernels::PackedIntView v = w_.packed_int(p, e);
    const kernels::PackTransposedIntFn fn = kt_.pack_transposed_kblock_int;
    return [s, v, fn](int nb0, int nb1, int kb, bf16* dst, std::size_t stride) { fn(*s, v, nb0, nb1, kb, dst, stride); };
  }
  const kernels::PackedShape& ps = p == Projection::down ? w_.down_shape() : w_.up_shape();
  const bf16* packed = w_.packed(p, e);
  const int kblocks = ps.kblocks;
  const kernels::PackTransposedFn fn = kt_.pack_transposed_kblock;
  return [packed, kblocks, fn](int nb0, int nb1, int kb, bf16* dst, std::size_t stride) {
    fn(packed + static_cast<std::size_t>(nb0) * kblocks * kernels::kBlockElements, nb1 - nb0, kblocks, kb, dst, stride);
  };
}

const char* MoeBackward::phase_name(int i) {
  static const char* names[kPhases] = {"gather", "lora_prep", "dh", "lora_grads", "dx", "lora_sums", "combine"};
  return names[i];
}

MoeBackward::MoeBackward(const PackedExpertWeights& weights, kernels::Isa isa, numa::ThreadPool& pool)
    : w_(weights), kt_(kernels::kernel_table(isa)), pool_(pool), ws_(pool_workspace<BackwardWorkspace>(pool)) {}

void MoeBackward::backward(const ForwardCacheEntry& entry, const float* grad_output, float* grad_input, const LayerLoraGrad& grads,
                           bool accumulate, const BackwardNodes& nodes) {
  CrossNodeSums* const sums = nodes.sums;
  const int node = nodes.node;
  SharedGather* const shared = nodes.gather;
  const MoeShape& s = w_.shape();
  const LayerLoraView& lora = entry.lora;
  const int tokens = entry.tokens, top_k = entry.top_k;
  const std::int64_t* ids = entry.ids.data();
  TokenGroups groups = group_tokens_by_expert(ids, tokens, top_k, s.num_experts);
  // From here to the end the pool's shared buffers are this call's.
  std::lock_guard<std::mutex> buffers(ws_->in_use);
  const int rows = groups.total();
  const std::size_t hidden = static_cast<std::size_t>(s.hidden), inter = static_cast<std::size_t>(s.intermediate);

  // Wd is packed with panels over hidden and k-blocks over intermediate; Wg, Wu the other way.
  const kernels::PackedShape down = w_.down_shape(), gate_up = w_.up_shape();
  const int tk_down = kernels::transposed_kblocks(down.panels), tk_gate = kernels::transposed_kblocks(gate_up.panels);
  const std::size_t hk = static_cast<std::size_t>(tk_down) * kernels::kBlockK;  // dY row: hidden padded to 32
  const std::size_t ik = static_cast<std::size_t>(tk_gate) * kernels::kBlockK;  // dG (then dU) row: intermediate padded to 32
  const std::size_t gu_ld = 2 * ik;

  const bool any_lora = !lora.empty();
  const bool need_h = grads[2].a && lora[Projection::down].rank > 0;
  if (!shared) {
    grow_to(dy_, rows * hk);
  } else if (shared->dy.size() < rows * hk) {
    throw std::logic_error("MoeBackward: the shared gather was not prepared for this backward");
  }
  bf16* const dy_rows = shared ? shared->dy.data() : dy_.data();
  grow_to(dgu_, rows * gu_ld);
  // dX: one bf16 row per routed row in TokenGroups order, written by the dx items from their f32
  // products (as the forward's y: half the bytes written here and read by the combine, which
  // sums a token's rows in f32).
  const std::size_t dx_ld = padded_row_stride<bf16>(hidden, 2 * kernels::kPanelColumns);
  grow_to(dx_, static_cast<std::size_t>(rows) * dx_ld);
  for (int p = 0; p < 3; ++p) grow_to(dp_[p], static_cast<std::size_t>(rows) * lora.proj[p].rank);
  active_.clear();
  column_split_.clear();
  split_k_.clear();
  for (int e = 0; e < s.num_experts; ++e) {
    if (groups.count(e) == 0) continue;
    active_.push_back(e);
    (groups.count(e) <= kSplitKMaxRows ? split_k_ : column_split_).push_back(e);
  }
  // Split-K items, in the order their partials are summed: per expert, down's panels (dh), then
  // gate's and up's (dx).
  struct SplitKItem {
    int e, proj, nb0, nb1;
    std::size_t partial;
  };
  std::vector<SplitKItem> dh_split, dx_split;
  std::vector<std::size_t> dh_first(s.num_experts), dx_first(s.num_experts);
  std::size_t partial_floats = 0;
  for (int e : split_k_) {
    const std::size_t m = static_cast<std::size_t>(groups.count(e));
    dh_first[e] = dh_split.size();
    for (int nb = 0; nb < down.panels; nb += kSplitKPanels, partial_floats += m * down.k_padded)
      dh_split.push_back({e, 2, nb, std::min(down.panels, nb + kSplitKPanels), partial_floats});
    dx_first[e] = dx_split.size();
    for (int proj = 0; proj < 2; ++proj)
      for (int nb = 0; nb < gate_up.panels; nb += kSplitKPanels, partial_floats += m * gate_up.k_padded)
        dx_split.push_back({e, proj, nb, std::min(gate_up.panels, nb + kSplitKPanels), partial_floats});
  }
  grow_to(partials_, partial_floats);
  const int dh_items_per_expert = (down.panels + kSplitKPanels - 1) / kSplitKPanels;
  const int dx_items_per_expert = 2 * ((gate_up.panels + kSplitKPanels - 1) / kSplitKPanels);
  grow_to(terms_, static_cast<std::size_t>(s.num_experts));
  auto off = [&](int e) { return static_cast<std::size_t>(groups.offsets[e]); };
  auto rank_of = [&](Projection p) { return static_cast<std::size_t>(lora[p].rank); };

  PhaseClock clock(phase_seconds_);
  auto lap = [&](int phase) { clock.lap(phase); };

  // Unless accumulating, the LoRA gradients that no item writes are zeroed first (experts without
  // tokens or without LoRA; the others are stored by the items, which then overwrite).
  const bool overwrite = !accumulate;
  if (any_lora && overwrite) {
    pool_.parallel_for(static_cast<std::size_t>(s.num_experts) * 3, [&](std::size_t item, int) {
      const int e = static_cast<int>(item / 3), p = static_cast<int>(item % 3);
      const auto& lp = lora.proj[p];
      if (lp.rank == 0 || (groups.count(e) > 0 && lp.active(e))) return;
      const LoraProjectionGrad& g = grads[p];
      // Across nodes, gate's and up's A and down's B are one array that one node zeroes.
      const bool zero_summed = !sums || e % sums->nodes() == node;
      if (g.a && (p == 2 || zero_summed))
        for (int i = 0; i < lp.rank; ++i)
          kernels::zero_bytes_streaming(lora_grad_a(g, e, lp.rank, lp.in).offset(i * g.lda(lp.in)).data, lp.in * g.element_bytes());
      if (g.b && (p != 2 || zero_summed))
        kernels::zero_bytes_streaming(g.b_of(e, lp.rank, lp.out), static_cast<std::size_t>(lp.out) * lp.rank * g.element_bytes());
      kernels::streaming_stores_done();
    });
  }
  lap(1);

  // The prep items of the one parallel_for below, each expert's in a row, ahead of its dh items:
  // - gather units: dY = w * dO per slot, grouped by expert, zero-padded for the kernels, up to 16
  //   rows of one expert each, copied once for all nodes that share them; each node pads its own
  //   dG|dU rows. (The A gradients of gate and up read the saved x's rows in place, by token: a
  //   gathered copy was 200 MB written and read back at 4096 tokens of DeepSeek-V2-Lite.)
  // - the LoRA terms prepared, and down's dP and (on one node) dB, once the expert's units are in.
  // As phases of their own (a parallel_for each) they took 0.26-0.30 and 0.5-0.6 ms of a 30 ms
  // step at 512 tokens on the device, every core waiting at both ends. Folded in (with the faster
  // by-columns projection of lora_rows_avx512.cpp), the backward / forward_sft went from 1.067 to
  // 0.999 at 128 tokens, 1.015 to 0.976 at 1 token and 1.091 to 1.080 at 512 (builds taking turns,
  // three rounds each).
  prep_.clear();
  for (int e : active_) {
    for (int r0 = 0; r0 < groups.count(e); r0 += SharedGather::kUnitRows) prep_.push_back({e, -1 - r0});
    if (any_lora)
      for (int p = 0; p < 3; ++p) prep_.push_back({e, p});
  }
  auto gather_unit = [&](int e, int r0) {
    const std::size_t p0 = off(e) + static_cast<std::size_t>(r0);
    const std::size_t p1 = off(e) + static_cast<std::size_t>(std::min(groups.count(e), r0 + SharedGather::kUnitRows));
    for (std::size_t pos = p0; pos < p1; ++pos) {
      bf16* gu = dgu_.data() + pos * gu_ld;
      std::fill(gu + inter, gu + ik, bf16(0));
      std::fill(gu + ik + inter, gu + gu_ld, bf16(0));
    }
    // A shared unit's copy cannot fail (no allocation) nor wait, so the nodes' waits always end.
    if (shared && !shared->claim(e, r0)) return;
    for (std::size_t pos = p0; pos < p1; ++pos) {
      const std::size_t t = static_cast<std::size_t>(groups.token[pos]);
      const float wt = entry.weights[static_cast<std::size_t>(groups.slot[pos])];
      bf16* dy = dy_rows + pos * hk;
      kt_.convert_to_bf16(grad_output + t * hidden, hidden, wt, dy);
      std::fill(dy + hidden, dy + hk, bf16(0));
    }
    if (shared) shared->done(e);
  };
  // Every row of expert e's dY, before this node reads them (another node may copy some).
  auto gathered = [&](int e) {
    if (shared) shared->wait(e);
  };
  auto prepare_term = [&](int e, Projection p, int worker) {
    LoraTerm& term = terms_[e][static_cast<int>(p)];
    const int m = groups.count(e);
    prepare_backward_term(kt_, lora[p], e, m, term);
    if (p != Projection::down || !term.active()) return;
    gathered(e);
    const std::size_t r = rank_of(p);
    term.project(kt_, dy_rows + off(e) * hk, hk, m, static_cast<int>(hk), scratch_[worker].proj, dp_[2].data() + off(e) * r, r);
    if (grads[2].b && !sums)
      kt_.lora_grad_outer(dy_rows + off(e) * hk, hk, nullptr, entry.xa[2].data() + off(e) * r, r, m, s.hidden, static_cast<int>(r),
                          lora_grad_b(grads[2], e, static_cast<int>(r), s.hidden), r, false, overwrite);
  };

  // dh: dH = dY Wd (+ LoRA) on 32-column slices of Wdᵀ (or split-K partials, then their sum),
  // then the SwiGLU backward into dG | dU, and the LoRA gradients that need only those columns,
  // while they are in this core's cache: gate's and up's dB rows (dG and dU against the saved
  // x Aᵀ) and down's dA columns (dP of down against h, recomputed here into the worker's scratch,
  // where a buffer of every row's h was written and read back by the lora_grads phase). Each
  // gradient element is the same sum over the rows as over whole rows. Here and in dx, the long
  // phases, idle workers of the other virtual nodes on this memory node may join
  // (ThreadPool::link_siblings): an item's results do not depend on who runs it.
  const std::size_t r_down = rank_of(Projection::down);
  auto swiglu_backward = [&](int e, int col0, int n, const float* c, std::size_t ldc, WorkerScratch& ws) {
    const int m = groups.count(e);
    bf16* gu = dgu_.data() + off(e) * gu_ld + col0;
    bf16* h = nullptr;
    if (need_h && terms_[e][2].active()) {
      grow_to(ws.h, static_cast<std::size_t>(m) * n);
      h = ws.h.data();
    }
    // The gradient blocks the outer products below write: down's dA columns [col0, col0 + n) and
    // gate's and up's dB rows. They are asked for now, so that their misses overlap the SwiGLU
    // backward (see silu_mul_backward_avx512).
    kernels::GradTarget down_da;
    const std::size_t da_ld = grads[2].lda(s.intermediate);
    if (h) {
      down_da = lora_grad_a(grads[2], e, static_cast<int>(r_down), s.intermediate).offset(col0);
      for (std::size_t q = 0; q < r_down; ++q)
        prefetch_range(down_da.offset(q * da_ld).data, static_cast<std::size_t>(n) * grads[2].element_bytes());
    }
    kernels::GradTarget gu_db[2];
    for (int p = 0; p < 2 && any_lora; ++p)
      if (terms_[e][p].active() && grads[p].b) {
        const std::size_t r = rank_of(static_cast<Projection>(p));
        gu_db[p] = lora_grad_b(grads[p], e, static_cast<int>(r), s.intermediate).offset(static_cast<std::size_t>(col0) * r);
        prefetch_range(gu_db[p].data, static_cast<std::size_t>(n) * r * grads[p].element_bytes());
      }
    kt_.silu_mul_backward(c, ldc, entry.gate.data() + off(e) * inter + col0, entry.up.data() + off(e) * inter + col0, inter, m, n, gu,
                          gu + ik, gu_ld, h, static_cast<std::size_t>(n), swiglu_form(s));
    if (h)
      kt_.lora_grad_outer(h, static_cast<std::size_t>(n), nullptr, dp_[2].data() + off(e) * r_down, r_down, m, n, static_cast<int>(r_down),
                          down_da, da_ld, true, overwrite);
    for (int p = 0; p < 2; ++p) {
      if (!gu_db[p].data) continue;
      const std::size_t r = rank_of(static_cast<Projection>(p));
      kt_.lora_grad_outer(gu + (p == 1 ? ik : 0), gu_ld, nullptr, entry.xa[p].data() + off(e) * r, r, m, n, static_cast<int>(r), gu_db[p], r,
                          false, overwrite);
    }
  };
  // dh items: 16 panels from 4 rows (1 MiB of Wdᵀ), so that each item's epilogue reads and writes
  // rows of 512 bytes, not 128 or 256 (the saved gate and up, dG | dU, the gradient blocks). On the
  // device (512 tokens, r=16, weight copy) 8 panels instead of 4 took the phase from 5.9 / 6.4 to
  // 5.3 / 5.7 ms; 16 then took the backward from 1.114 to 1.089 times the forward_sft (three
  // rounds each; every round of 16 below every round of 8). 32 was no better than 16.
  const std::vector<ExpertItem> dh_items =
      split_expert_columns(column_split_, groups, 2 * down.kblocks, 2, 0, /*denser=*/2, /*few_row_panels=*/8);
  auto run_dh = [&](const ExpertItem& item, WorkerScratch& ws) {
    auto [e, p0, p1] = item;
    const int m = groups.count(e), cols = (p1 - p0) * kernels::kPanelColumns, col0 = p0 * kernels::kPanelColumns;
    const int n = std::min(cols, s.intermediate - col0);
    const std::size_t panel_stride = static_cast<std::size_t>(tk_down) * kernels::kBlockElements;
    grow_to(ws.c, static_cast<std::size_t>(m) * cols);
    const bf16* wt = nullptr;  // Wdᵀ panels [p0, p1)
    if (copy_) {
      wt = copy_->down(e) + static_cast<std::size_t>(p0) * panel_stride;
    } else {
      grow_to(ws.transposed, static_cast<std::size_t>(p1 - p0) * panel_stride);
      const auto transpose_down = transposer(Projection::down, e);
      for (int kb = p0 / 2; kb < p1 / 2; ++kb)
        transpose_down(0, down.panels, kb, ws.transposed.data() + static_cast<std::size_t>(2 * kb - p0) * panel_stride, panel_stride);
      wt = ws.transposed.data();
    }
    const kernels::GemmBf16Args g =
        kernels::gemm_args(dy_rows + off(e) * hk, hk, m, static_cast<int>(hk), wt, 0, p1 - p0, ws.c.data(), static_cast<std::size_t>(cols));
    const LoraTerm* term = any_lora ? &terms_[e][2] : nullptr;
    gemm_with_lora_terms(kt_, g, &term, 1, p0, n);
    swiglu_backward(e, col0, n, ws.c.data(), static_cast<std::size_t>(cols), ws);
  };
  auto sum_dh = [&](int e, WorkerScratch& ws) {
    const int m = groups.count(e);
    AlignedVector<float>& c = ws.c;
    grow_to(c, static_cast<std::size_t>(m) * down.k_padded);
    const SplitKItem& first = dh_split[dh_first[e]];
    sum_partials(partials_.data() + first.partial, dh_items_per_expert, static_cast<std::size_t>(m) * down.k_padded, m, s.intermediate,
                 static_cast<std::size_t>(down.k_padded), c.data(), static_cast<std::size_t>(down.k_padded));
    if (any_lora) terms_[e][2].add_f32(kt_, m, 0, s.intermediate, c.data(), static_cast<std::size_t>(down.k_padded));
    swiglu_backward(e, 0, s.intermediate, c.data(), static_cast<std::size_t>(down.k_padded), ws);
  };

  // lora_grads: dP and dA of gate and up (the rest came with dh).
  auto run_lora_grads = [&](int e, int p, WorkerScratch& ws) {
    LoraTerm& term = terms_[e][p];
    if (!term.active()) return;
    const int m = groups.count(e);
    const std::size_t r = rank_of(static_cast<Projection>(p));
    const bf16* d_out = dgu_.data() + off(e) * gu_ld + (p == 1 ? ik : 0);
    float* dp = dp_[p].data() + off(e) * r;
    term.project(kt_, d_out, gu_ld, m, static_cast<int>(ik), ws.proj, dp, r);
    if (grads[p].a && !sums)
      kt_.lora_grad_outer(entry.x.data(), hidden, groups.token.data() + off(e), dp, r, m, s.hidden, static_cast<int>(r),
                          lora_grad_a(grads[p], e, static_cast<int>(r), s.hidden), grads[p].lda(s.hidden), true, overwrite);
  };

  // Across nodes (lora_sums, after dx: the other nodes have long published by then): blocks of
  // gate's and up's dA = (sum of dP)ᵀ x and of down's dB = dYᵀ (sum of u), claimed by any node's
  // workers. 1024 columns a block: each row of x or dY is read 2 KB at a time, which the
  // prefetchers follow (blocks of 256 took this phase 0.9-1.9 ms at 512 tokens on the device, 1024
  // 0.5-1.0), and an expert's 3 projections still give 6 blocks at DeepSeek-V2-Lite's hidden size.
  struct SumBlock {
    int e, p, col0, n;
  };
  std::vector<SumBlock> sum_blocks;
  if (sums && any_lora) {
    constexpr int kSumBlockColumns = 1024;
    for (int e : active_)
      for (int p = 0; p < 3; ++p) {
        const LoraProjectionView& lp = lora.proj[p];
        if (lp.rank == 0 || !lp.active(e) || (p == 2 ? grads[2].b : grads[p].a) == nullptr) continue;
        for (int c = 0; c < s.hidden; c += kSumBlockColumns) sum_blocks.push_back({e, p, c, std::min(kSumBlockColumns, s.hidden - c)});
      }
  }
  auto run_sum_blocks = [&](WorkerScratch& ws) {
    for (std::size_t b; (b = sums->claim_block()) < sum_blocks.size();) {
      const SumBlock& sb = sum_blocks[b];
      const int m = groups.count(sb.e);
      const std::size_t r = rank_of(static_cast<Projection>(sb.p));
      grow_to(ws.proj, static_cast<std::size_t>(m) * r);
      sums->sum_rows(sb.p, off(sb.e), m, static_cast<int>(r), ws.proj.data());
      if (sb.p == 2)
        kt_.lora_grad_outer(dy_rows + off(sb.e) * hk + sb.col0, hk, nullptr, ws.proj.data(), r, m, sb.n, static_cast<int>(r),
                            lora_grad_b(grads[2], sb.e, static_cast<int>(r), s.hidden).offset(static_cast<std::size_t>(sb.col0) * r), r, false,
                            overwrite);
      else
        kt_.lora_grad_outer(entry.x.data() + sb.col0, hidden, groups.token.data() + off(sb.e), ws.proj.data(), r, m, sb.n, static_cast<int>(r),
                            lora_grad_a(grads[sb.p], sb.e, static_cast<int>(r), s.hidden).offset(sb.col0), grads[sb.p].lda(s.hidden), true,
                            overwrite);
    }
  };

  // dx: dX = [dG | dU] [Wg ; Wu] (+ both LoRA terms) on 32-column slices of the stacked Wᵀ (or
  // split-K partials over gate's and up's panels, then their sum).
  auto dx_rows = [&](int e) { return dx_.data() + static_cast<std::size_t>(off(e)) * dx_ld; };
  // The reduction is gate's and up's intermediate columns: a NUMA node's slice of them widens the
  // items so that each streams as many bytes of Wᵀ as on one node (as the forward's down items).
  const std::vector<ExpertItem> dx_items =
      split_expert_columns(column_split_, groups, 2 * gate_up.kblocks, 2, 2 * s.intermediate, 1, kt_.few_row_item_panels);
  auto run_dx = [&](const ExpertItem& item, WorkerScratch& ws) {
    auto [e, p0, p1] = item;
    const int m = groups.count(e), cols = (p1 - p0) * kernels::kPanelColumns, col0 = p0 * kernels::kPanelColumns;
    const int n = std::min(cols, s.hidden - col0);
    const std::size_t half = static_cast<std::size_t>(tk_gate) * kernels::kBlockElements, panel_stride = 2 * half;
    const bf16* wt = nullptr;  // [Wg ; Wu]ᵀ panels [p0, p1)
    if (copy_) {
      wt = copy_->gate_up(e) + static_cast<std::size_t>(p0) * panel_stride;
    } else {
      grow_to(ws.transposed, static_cast<std::size_t>(p1 - p0) * panel_stride);
      const auto transpose_gate = transposer(Projection::gate, e), transpose_up = transposer(Projection::up, e);
      for (int kb = p0 / 2; kb < p1 / 2; ++kb) {
        bf16* dst = ws.transposed.data() + static_cast<std::size_t>(2 * kb - p0) * panel_stride;
        transpose_gate(0, gate_up.panels, kb, dst, panel_stride);
        transpose_up(0, gate_up.panels, kb, dst + half, panel_stride);
      }
      wt = ws.transposed.data();
    }
    grow_to(ws.c, static_cast<std::size_t>(m) * cols);
    const kernels::GemmBf16Args g = kernels::gemm_args(dgu_.data() + off(e) * gu_ld, gu_ld, m, static_cast<int>(gu_ld), wt, 0, p1 - p0,
                                                       ws.c.data(), static_cast<std::size_t>(cols));
    const LoraTerm* terms[2] = {any_lora ? &terms_[e][0] : nullptr, any_lora ? &terms_[e][1] : nullptr};
    gemm_with_lora_terms(kt_, g, terms, 2, p0, n);
    kernels::convert_rows_to_bf16(kt_.convert_to_bf16, ws.c.data(), static_cast<std::size_t>(cols), m, static_cast<std::size_t>(n), 1.0f,
                                  dx_rows(e) + col0, dx_ld);
  };
  auto sum_dx = [&](int e, WorkerScratch& ws) {
    const int m = groups.count(e);
    const std::size_t ld = static_cast<std::size_t>(gate_up.k_padded);
    AlignedVector<float>& c = ws.c;
    grow_to(c, static_cast<std::size_t>(m) * ld);
    const SplitKItem& first = dx_split[dx_first[e]];
    sum_partials(partials_.data() + first.partial, dx_items_per_expert, static_cast<std::size_t>(m) * ld, m, s.hidden, ld, c.data(), ld);
    if (any_lora)
      for (int p = 0; p < 2; ++p) terms_[e][p].add_f32(kt_, m, 0, s.hidden, c.data(), ld);
    kernels::convert_rows_to_bf16(kt_.convert_to_bf16, c.data(), ld, m, hidden, 1.0f, dx_rows(e), dx_ld);
  };

  // The prep items, dh, lora_grads and dx in one parallel_for, in that order: a worker that runs
  // out of dh items goes on with the LoRA gradients and then the dx items of experts whose dG | dU
  // is complete, instead of waiting at phase ends for the slowest item (as the forward's gate_up
  // and down, moe_forward.cpp). Each item waits only for items before it in the list, so it cannot
  // deadlock (item_countdowns.hpp), and computes what it did as a phase of its own: the same bits.
  // Counters, per expert e: [e] its dG | dU complete (dh items, or split-K sum); [E + e] its dh
  // split-K partials; [2E + e] its lora_grads items (dx's LoRA terms read their dP); [3E + e]
  // its dx split-K partials; [4E + e] its prep items (what its dh items wait for); [5E + e] its
  // gather units (what down's prep item and the split-K partials read). Split-K partial items
  // come after the column items of their pass.
  const std::size_t experts = static_cast<std::size_t>(s.num_experts);
  const std::size_t dgu_done = 0, dh_parts = experts, lora_done = 2 * experts, dx_parts = 3 * experts;
  const std::size_t prep_done = 4 * experts, units_done = 5 * experts;
  const std::size_t lora_items = any_lora ? 2 * active_.size() : 0;
  // Each expert's prep items go this many slots ahead of its first dh item, so that they are done
  // before a worker takes that item: four times the workers, the forward's lead for its LoRA prep
  // (a down term's dP and dB read the expert's dY and its factors). One lead for all of them keeps
  // an expert's gather units before its down term, which waits for them.
  const std::vector<std::uint32_t> dh_order = lead_items(prep_, dh_items, 4 * static_cast<std::size_t>(pool_.size()));
  // Slots: [prep and dh items (dh_order) | dh partials | dh sums | lora_grads | dx items | dx partials | dx sums].
  const std::size_t pre = prep_.size(), dh_region = dh_order.size();
  const std::size_t split_end = dh_region + dh_split.size(), dh_end = split_end + split_k_.size(), lora_end = dh_end + lora_items;
  const std::size_t dx_items_end = lora_end + dx_items.size(), dx_end = dx_items_end + dx_split.size(), slots = dx_end + split_k_.size();
  // What each slot counts down, named by its slot: every wait below names its own, and
  // ItemCountdowns checks that what it waits for comes first.
  ready_.reset(6 * experts);
  for (std::size_t slot = 0; slot < dh_region; ++slot) {
    if (const std::size_t j = dh_order[slot]; j < pre) {
      const std::size_t e = static_cast<std::size_t>(prep_[j][0]);
      ready_.expect(prep_done + e, slot);
      if (prep_[j][1] < 0) ready_.expect(units_done + e, slot);
    } else {
      ready_.expect(dgu_done + static_cast<std::size_t>(dh_items[j - pre].expert), slot);
    }
  }
  for (std::size_t i = 0; i < dh_split.size(); ++i) ready_.expect(dh_parts + static_cast<std::size_t>(dh_split[i].e), dh_region + i);
  for (std::size_t i = 0; i < split_k_.size(); ++i) ready_.expect(dgu_done + static_cast<std::size_t>(split_k_[i]), split_end + i);
  for (std::size_t i = 0; i < lora_items; ++i) ready_.expect(lora_done + static_cast<std::size_t>(active_[i / 2]), dh_end + i);
  for (std::size_t i = 0; i < dx_split.size(); ++i) ready_.expect(dx_parts + static_cast<std::size_t>(dx_split[i].e), dx_items_end + i);
  // --phases' ends of dh and lora_grads: the items left of each (dh_left counts the prep items
  // too: they run among the dh items), and when the last one ended.
  std::atomic<std::size_t> dh_left{dh_end}, lora_left{lora_items};
  std::chrono::steady_clock::time_point dh_finished{}, lora_finished{};  // written once each, read after the parallel_for
  // The node's dP of gate and up, for the other nodes' lora_sums: published by the item that
  // ends the last lora_grads item (or now, when there is none), before anything that waits.
  auto publish = [&] {
    if (sums) sums->publish(node, {dp_[0].data(), dp_[1].data(), entry.xa[2].data()});
  };
  if (lora_items == 0) publish();
  ready_.parallel_for(
      pool_, slots,
      [&](std::size_t slot, int worker) {
        WorkerScratch& ws = scratch_[worker];
        if (slot < dh_end) {
          if (slot < dh_region && dh_order[slot] < pre) {
            const auto [e, code] = prep_[dh_order[slot]];
            if (code < 0) {
              gather_unit(e, -1 - code);
              ready_.count_down(units_done + static_cast<std::size_t>(e));
            } else {
              if (code == static_cast<int>(Projection::down)) ready_.wait(units_done + static_cast<std::size_t>(e), slot);
              prepare_term(e, static_cast<Projection>(code), worker);
            }
            ready_.count_down(prep_done + static_cast<std::size_t>(e));
          } else if (slot < dh_region) {
            const ExpertItem& item = dh_items[dh_order[slot] - pre];
            ready_.wait(prep_done + static_cast<std::size_t>(item.expert), slot);
            gathered(item.expert);
            run_dh(item, ws);
            ready_.count_down(dgu_done + static_cast<std::size_t>(item.expert));
          } else if (const std::size_t i = slot - dh_region; i < dh_split.size()) {
            const SplitKItem& it = dh_split[i];
            ready_.wait(units_done + static_cast<std::size_t>(it.e), slot);
            gathered(it.e);
            split_k_partial(kt_, transposer(Projection::down, it.e), down, it.nb0, it.nb1, dy_rows + off(it.e) * hk, hk,
                            groups.count(it.e), ws.transposed, partials_.data() + it.partial);
            ready_.count_down(dh_parts + static_cast<std::size_t>(it.e));
          } else {
            const int e = split_k_[i - dh_split.size()];
            ready_.wait(prep_done + static_cast<std::size_t>(e), slot);
            ready_.wait(dh_parts + static_cast<std::size_t>(e), slot);
            sum_dh(e, ws);
            ready_.count_down(dgu_done + static_cast<std::size_t>(e));
          }
          if (dh_left.fetch_sub(1, std::memory_order_acq_rel) == 1) dh_finished = std::chrono::steady_clock::now();
          return;
        }
        if (slot < lora_end) {
          const std::size_t i = slot - dh_end;
          const int e = active_[i / 2];
          ready_.wait(dgu_done + static_cast<std::size_t>(e), slot);
          run_lora_grads(e, static_cast<int>(i % 2), ws);
          ready_.count_down(lora_done + static_cast<std::size_t>(e));
          if (lora_left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
            lora_finished = std::chrono::steady_clock::now();
            publish();
          }
          return;
        }
        if (slot < dx_end) {
          if (const std::size_t i = slot - lora_end; i < dx_items.size()) {
            const int e = dx_items[i].expert;
            ready_.wait(dgu_done + static_cast<std::size_t>(e), slot);
            ready_.wait(lora_done + static_cast<std::size_t>(e), slot);
            run_dx(dx_items[i], ws);
          } else {
            const SplitKItem& it = dx_split[i - dx_items.size()];
            ready_.wait(dgu_done + static_cast<std::size_t>(it.e), slot);
            const Projection p = it.proj == 0 ? Projection::gate : Projection::up;
            split_k_partial(kt_, transposer(p, it.e), gate_up, it.nb0, it.nb1,
                            dgu_.data() + off(it.e) * gu_ld + (it.proj == 1 ? ik : 0), gu_ld, groups.count(it.e), ws.transposed,
                            partials_.data() + it.partial);
            ready_.count_down(dx_parts + static_cast<std::size_t>(it.e));
          }
          return;
        }
        const int e = split_k_[slot - dx_end];
        ready_.wait(dx_parts + static_cast<std::size_t>(e), slot);
        ready_.wait(lora_done + static_cast<std::size_t>(e), slot);
        sum_dx(e, ws);
      },
      numa::ThreadPool::Guests::welcome);
  // --phases: dh (with the gather and the LoRA's prep, whose items run among dh's) until its last
  // item ended, lora_grads until its last one did, dx from there. gather and lora_prep keep only
  // what ran before this parallel_for (the zeroing of overwritten gradients).
  const auto now = std::chrono::steady_clock::now();
  clock.lap_at(2, dh_end > 0 ? dh_finished : now);
  clock.lap_at(3, lora_items > 0 ? lora_finished : now);
  lap(4);
  // Every expert's dY is read by now on this node except, across nodes, by the lora_sums.
  for (int e : active_) gathered(e);

  if (!sum_blocks.empty())
    pool_.parallel_for(static_cast<std::size_t>(pool_.size()), [&](std::size_t, int worker) { run_sum_blocks(scratch_[worker]); });
  lap(5);

  combine_bf16_rows(kt_.combine_bf16_rows, pool_, dx_.data(), dx_ld, groups.row_of_slot.data(), hidden, tokens, top_k, ids, nullptr,
                    grad_input);
  lap(6);
}

}  // namespace tilemoe
