#include "src/layer/moe_backward.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "amx/pack_transposed.hpp"
#include "src/layer/work_split.hpp"
#include "src/routing/token_groups.hpp"

namespace tilemoe {
namespace {

using Clock = std::chrono::steady_clock;

// The backward products run the forward's LoRA term transposed: for dIn = dOut W + s (dOut B) A
// the term's first factor is Bᵀ ([rank][out]) and its second Aᵀ ([in][rank]), both read in place.
void prepare_backward_term(const LoraProjectionView& lp, int e, int rows, LoraTerm& term) {
  if (!lp.active(e)) return term.deactivate();
  const kernels::StridedF32 b{lp.b_of(e), static_cast<std::size_t>(lp.rank), 1};
  const kernels::StridedF32 a{lp.a_of(e), static_cast<std::size_t>(lp.in), 1};
  term.prepare(b.transposed(), a.transposed(), lp.rank, lp.out, lp.in, lp.scale_of(e), rows);
}

template <typename T>
void grow(std::vector<T>& v, std::size_t n) {
  if (v.size() < n) v.resize(n);
}

}  // namespace

const char* MoeBackward::phase_name(int i) {
  static const char* names[kPhases] = {"gather", "lora_prep", "dh", "lora_grads", "dx", "combine"};
  return names[i];
}

MoeBackward::MoeBackward(const PackedExpertWeights& weights, kernels::Isa isa, numa::ThreadPool& pool)
    : w_(weights), kt_(kernels::kernel_table(isa)), pool_(pool), scratch_(static_cast<std::size_t>(pool.size())) {}

void MoeBackward::backward(const ForwardCacheEntry& entry, const float* grad_output, float* grad_input, const LayerLoraGrad& grads,
                           bool accumulate) {
  const MoeShape& s = w_.shape();
  const LayerLoraView& lora = entry.lora;
  const int tokens = entry.tokens, top_k = entry.top_k;
  const std::int64_t* ids = entry.ids.data();
  TokenGroups groups = group_tokens_by_expert(ids, tokens, top_k, s.num_experts);
  const int rows = groups.total();
  const std::size_t hidden = static_cast<std::size_t>(s.hidden), inter = static_cast<std::size_t>(s.intermediate);
  const std::size_t slots = static_cast<std::size_t>(tokens) * top_k;

  // Wd is packed with panels over hidden and k-blocks over intermediate; Wg, Wu the other way.
  const kernels::PackedShape down = w_.down_shape(), gate_up = w_.up_shape();
  const int tk_down = kernels::transposed_kblocks(down.panels), tk_gate = kernels::transposed_kblocks(gate_up.panels);
  const std::size_t hk = static_cast<std::size_t>(tk_down) * kernels::kBlockK;  // dY row: hidden padded to 32
  const std::size_t ik = static_cast<std::size_t>(tk_gate) * kernels::kBlockK;  // dG (then dU) row: intermediate padded to 32
  const std::size_t gu_ld = 2 * ik;

  const bool any_lora = !lora.empty();
  const bool need_x = (grads[0].a && lora[Projection::gate].rank > 0) || (grads[1].a && lora[Projection::up].rank > 0);
  const bool need_h = grads[2].a && lora[Projection::down].rank > 0;
  grow(dy_, rows * hk);
  grow(dgu_, rows * gu_ld);
  if (need_h) grow(h_, rows * inter);
  if (need_x) grow(xs_, rows * hidden);
  grow(dx_, slots * hidden);
  for (int p = 0; p < 3; ++p) grow(dp_[p], static_cast<std::size_t>(rows) * lora.proj[p].rank);
  active_.clear();
  for (int e = 0; e < s.num_experts; ++e)
    if (groups.count(e) > 0) active_.push_back(e);
  if (terms_.size() < static_cast<std::size_t>(s.num_experts)) terms_.resize(s.num_experts);
  auto off = [&](int e) { return static_cast<std::size_t>(groups.offsets[e]); };
  auto rank_of = [&](Projection p) { return static_cast<std::size_t>(lora[p].rank); };

  auto mark = Clock::now();
  auto lap = [&](int phase) {
    auto now = Clock::now();
    phase_seconds_[phase] += std::chrono::duration<double>(now - mark).count();
    mark = now;
  };

  // gather: dY = w * dO per slot, grouped by expert, zero-padded for the kernels; x rows for dA.
  pool_.parallel_for(static_cast<std::size_t>(rows), [&](std::size_t pos, int) {
    const std::size_t t = static_cast<std::size_t>(groups.token[pos]);
    const float wt = entry.weights[static_cast<std::size_t>(groups.slot[pos])];
    const float* go = grad_output + t * hidden;
    bf16* dy = dy_.data() + pos * hk;
    for (std::size_t c = 0; c < hidden; ++c) dy[c] = float_to_bf16(wt * go[c]);
    std::fill(dy + hidden, dy + hk, bf16(0));
    bf16* gu = dgu_.data() + pos * gu_ld;
    std::fill(gu + inter, gu + ik, bf16(0));
    std::fill(gu + ik + inter, gu + gu_ld, bf16(0));
    if (need_x) std::memcpy(xs_.data() + pos * hidden, entry.x.data() + t * hidden, hidden * sizeof(bf16));
  }, 16);
  lap(0);

  // lora_prep: gradients zeroed unless accumulating; the terms prepared; down's dP and dB.
  if (any_lora) {
    if (!accumulate) {
      pool_.parallel_for(static_cast<std::size_t>(s.num_experts) * 3, [&](std::size_t item, int) {
        const int e = static_cast<int>(item / 3), p = static_cast<int>(item % 3);
        const auto& lp = lora.proj[p];
        if (lp.rank == 0) return;
        const std::size_t na = static_cast<std::size_t>(lp.rank) * lp.in, nb = static_cast<std::size_t>(lp.out) * lp.rank;
        if (grads[p].a) std::fill_n(grads[p].a + e * na, na, 0.0f);
        if (grads[p].b) std::fill_n(grads[p].b + e * nb, nb, 0.0f);
      });
    }
    pool_.parallel_for(active_.size() * 3, [&](std::size_t item, int worker) {
      const int e = active_[item / 3];
      const Projection p = static_cast<Projection>(item % 3);
      LoraTerm& term = terms_[e][static_cast<int>(p)];
      const int m = groups.count(e);
      prepare_backward_term(lora[p], e, m, term);
      if (p != Projection::down || !term.active()) return;
      const std::size_t r = rank_of(p);
      term.project(kt_, dy_.data() + off(e) * hk, hk, m, static_cast<int>(hk), scratch_[worker].proj, dp_[2].data() + off(e) * r, r);
      if (grads[2].b)
        kt_.lora_grad_outer(dy_.data() + off(e) * hk, hk, entry.xa[2].data() + off(e) * r, r, m, s.hidden, static_cast<int>(r),
                            grads[2].b + static_cast<std::size_t>(e) * hidden * r, r, false);
    });
  }
  lap(1);

  // dh: dH = dY Wd (+ LoRA) on 32-column slices of Wdᵀ, then the SwiGLU backward into dG | dU.
  std::vector<ExpertItem> items = split_expert_columns(active_, groups, 2 * down.kblocks, 2);
  pool_.parallel_for(items.size(), [&](std::size_t item, int worker) {
    auto [e, p0, p1] = items[item];
    const int m = groups.count(e), cols = (p1 - p0) * kernels::kPanelColumns, col0 = p0 * kernels::kPanelColumns;
    const int n = std::min(cols, s.intermediate - col0);
    WorkerScratch& ws = scratch_[worker];
    const std::size_t panel_stride = static_cast<std::size_t>(tk_down) * kernels::kBlockElements;
    grow(ws.transposed, static_cast<std::size_t>(p1 - p0) * panel_stride);
    grow(ws.c, static_cast<std::size_t>(m) * cols);
    for (int kb = p0 / 2; kb < p1 / 2; ++kb)
      kt_.pack_transposed_kblock(w_.packed(Projection::down, e), down.panels, down.kblocks, kb,
                                 ws.transposed.data() + static_cast<std::size_t>(2 * kb - p0) * panel_stride, panel_stride);
    kernels::GemmBf16Args g{};
    g.a = dy_.data() + off(e) * hk;
    g.lda = hk;
    g.m = m;
    g.k_padded = static_cast<int>(hk);
    g.packed_b = ws.transposed.data();
    g.panel_begin = 0;
    g.panel_end = p1 - p0;
    g.c = ws.c.data();
    g.ldc = static_cast<std::size_t>(cols);
    const LoraTerm* term = any_lora ? &terms_[e][2] : nullptr;
    gemm_with_lora_terms(kt_, g, &term, 1, p0, n);
    bf16* gu = dgu_.data() + off(e) * gu_ld + col0;
    kt_.silu_mul_backward(ws.c.data(), static_cast<std::size_t>(cols), entry.gate.data() + off(e) * inter + col0,
                          entry.up.data() + off(e) * inter + col0, inter, m, n, gu, gu + ik, gu_ld,
                          need_h ? h_.data() + off(e) * inter + col0 : nullptr, inter);
  });
  lap(2);

  // lora_grads: dA of down; dP, dB and dA of gate and up.
  if (any_lora) {
    pool_.parallel_for(active_.size() * 3, [&](std::size_t item, int worker) {
      const int e = active_[item / 3];
      const int p = static_cast<int>(item % 3);
      LoraTerm& term = terms_[e][p];
      if (!term.active()) return;
      const int m = groups.count(e);
      const std::size_t r = rank_of(static_cast<Projection>(p));
      if (p == 2) {
        if (need_h)
          kt_.lora_grad_outer(h_.data() + off(e) * inter, inter, dp_[2].data() + off(e) * r, r, m, s.intermediate, static_cast<int>(r),
                              grads[2].a + static_cast<std::size_t>(e) * r * inter, inter, true);
        return;
      }
      const bf16* d_out = dgu_.data() + off(e) * gu_ld + (p == 1 ? ik : 0);
      float* dp = dp_[p].data() + off(e) * r;
      term.project(kt_, d_out, gu_ld, m, static_cast<int>(ik), scratch_[worker].proj, dp, r);
      if (grads[p].b)
        kt_.lora_grad_outer(d_out, gu_ld, entry.xa[p].data() + off(e) * r, r, m, s.intermediate, static_cast<int>(r),
                            grads[p].b + static_cast<std::size_t>(e) * inter * r, r, false);
      if (grads[p].a)
        kt_.lora_grad_outer(xs_.data() + off(e) * hidden, hidden, dp, r, m, s.hidden, static_cast<int>(r),
                            grads[p].a + static_cast<std::size_t>(e) * r * hidden, hidden, true);
    });
  }
  lap(3);

  // dx: dX = [dG | dU] [Wg ; Wu] (+ both LoRA terms) on 32-column slices of the stacked Wᵀ.
  items = split_expert_columns(active_, groups, 2 * gate_up.kblocks, 2);
  pool_.parallel_for(items.size(), [&](std::size_t item, int worker) {
    auto [e, p0, p1] = items[item];
    const int m = groups.count(e), cols = (p1 - p0) * kernels::kPanelColumns, col0 = p0 * kernels::kPanelColumns;
    const int n = std::min(cols, s.hidden - col0);
    WorkerScratch& ws = scratch_[worker];
    const std::size_t half = static_cast<std::size_t>(tk_gate) * kernels::kBlockElements, panel_stride = 2 * half;
    grow(ws.transposed, static_cast<std::size_t>(p1 - p0) * panel_stride);
    grow(ws.c, static_cast<std::size_t>(m) * cols);
    for (int kb = p0 / 2; kb < p1 / 2; ++kb) {
      bf16* dst = ws.transposed.data() + static_cast<std::size_t>(2 * kb - p0) * panel_stride;
      kt_.pack_transposed_kblock(w_.packed(Projection::gate, e), gate_up.panels, gate_up.kblocks, kb, dst, panel_stride);
      kt_.pack_transposed_kblock(w_.packed(Projection::up, e), gate_up.panels, gate_up.kblocks, kb, dst + half, panel_stride);
    }
    kernels::GemmBf16Args g{};
    g.a = dgu_.data() + off(e) * gu_ld;
    g.lda = gu_ld;
    g.m = m;
    g.k_padded = static_cast<int>(gu_ld);
    g.packed_b = ws.transposed.data();
    g.panel_begin = 0;
    g.panel_end = p1 - p0;
    g.c = ws.c.data();
    g.ldc = static_cast<std::size_t>(cols);
    const LoraTerm* terms[2] = {any_lora ? &terms_[e][0] : nullptr, any_lora ? &terms_[e][1] : nullptr};
    gemm_with_lora_terms(kt_, g, terms, 2, p0, n);
    for (int i = 0; i < m; ++i)
      std::memcpy(dx_.data() + static_cast<std::size_t>(groups.slot[off(e) + i]) * hidden + col0,
                  ws.c.data() + static_cast<std::size_t>(i) * cols, static_cast<std::size_t>(n) * sizeof(float));
  });
  lap(4);

  combine_slot_rows(pool_, dx_.data(), hidden, tokens, top_k, ids, nullptr, grad_input);
  lap(5);
}

}  // namespace tilemoe
