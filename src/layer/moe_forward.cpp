#include "src/layer/moe_forward.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "amx/lora_rows.hpp"
#include "amx/pack_bf16.hpp"

namespace tilemoe {
namespace {

// Column chunk of one work item, in 16-column panels. With many rows an item must cover enough
// columns that its block of x (rows x K, re-read from L2 for every column chunk) is reused across
// several tiles; with few rows, one panel keeps decode spread over every core.
int panels_per_item(int rows) { return rows >= 64 ? 8 : rows >= 16 ? 2 : 1; }

using Clock = std::chrono::steady_clock;

}  // namespace

const char* MoeForward::phase_name(int i) {
  static const char* names[kPhases] = {"gather", "lora_prep", "gate_up", "lora_down", "down", "combine"};
  return names[i];
}

MoeForward::MoeForward(const PackedExpertWeights& weights, kernels::Isa isa, numa::ThreadPool& pool)
    : w_(weights), isa_(isa), kt_(kernels::kernel_table(isa)), pool_(pool), scratch_(static_cast<std::size_t>(pool.size())) {}

// Below this many rows an expert's LoRA is applied from the caller's f32 weights; from it up, A and
// B are packed so the tile kernels fuse B into the main GEMM and the packing is amortised.
constexpr int kLoraPackRows = 16;

void MoeForward::prepare_lora(const LayerLora& lora, int e, Projection p, int rows, ExpertLora& dst) {
  const auto& lp = lora[p];
  dst.active = lp.active(e);
  if (!dst.active) return;
  dst.scale = lp.scale[e];
  dst.a = lp.a_of(e);
  dst.b = lp.b_of(e);
  dst.rank = lp.rank;
  dst.packed = rows >= kLoraPackRows;
  if (!dst.packed) return;
  auto a_shape = kernels::packed_shape(lp.rank, lp.in);
  auto b_shape = kernels::packed_shape(lp.out, lp.rank);
  dst.rank_panels = a_shape.panels;
  dst.rank_k_padded = b_shape.k_padded;
  dst.a_packed.resize(kernels::packed_bf16_elements(lp.rank, lp.in));
  dst.b_packed.resize(kernels::packed_bf16_elements(lp.out, lp.rank));
  kernels::pack_f32_weights_to_bf16(lp.a_of(e), lp.rank, lp.in, static_cast<std::size_t>(lp.in), dst.a_packed.data());
  kernels::pack_f32_weights_to_bf16(lp.b_of(e), lp.out, lp.rank, static_cast<std::size_t>(lp.rank), dst.b_packed.data());
}

void MoeForward::project_lora(ExpertLora& l, const bf16* v, std::size_t ldv, int rows, int in, int k_padded,
                              std::vector<float>& scratch) {
  if (l.packed) return compute_xa(l, v, ldv, rows, k_padded, scratch);
  l.xa_f32.resize(static_cast<std::size_t>(rows) * l.rank);
  kernels::lora_project_rows(v, ldv, rows, in, l.a, l.rank, l.scale, l.xa_f32.data());
}

void MoeForward::add_lora_epilogue(const ExpertLora& l, int rows, int col0, int n, float* c, std::size_t ldc) {
  if (l.active && !l.packed) kernels::lora_expand_rows_add(l.xa_f32.data(), rows, l.rank, l.b, col0, n, c, ldc);
}

// xa = bf16(s * v A^T): the left factor of the LoRA term, fed to the main GEMM as extra K steps.
void MoeForward::compute_xa(ExpertLora& l, const bf16* v, std::size_t ldv, int rows, int k_padded, std::vector<float>& scratch) {
  int cols = l.rank_panels * kernels::kPanelColumns;
  scratch.resize(static_cast<std::size_t>(rows) * cols);
  kernels::GemmBf16Args g{};
  g.a = v;
  g.lda = ldv;
  g.m = rows;
  g.k_padded = k_padded;
  g.packed_b = l.a_packed.data();
  g.panel_begin = 0;
  g.panel_end = l.rank_panels;
  g.c = scratch.data();
  g.ldc = static_cast<std::size_t>(cols);
  kt_.gemm_bf16(g);
  l.xa.assign(static_cast<std::size_t>(rows) * l.rank_k_padded, 0);
  int r = std::min(cols, l.rank_k_padded);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < r; ++j)
      l.xa[static_cast<std::size_t>(i) * l.rank_k_padded + j] = float_to_bf16(l.scale * scratch[static_cast<std::size_t>(i) * cols + j]);
}

// C = A W^T for panels [p0, p1) of one expert's packed projection, with its LoRA (when given and
// active) fused as extra K steps or added from f32 over the n real columns.
void MoeForward::expert_gemm(const bf16* a, std::size_t lda, int m, const bf16* packed, int p0, int p1, const ExpertLora* lora,
                             int n, float* c, std::size_t ldc) const {
  kernels::GemmBf16Args g{};
  g.a = a;
  g.lda = lda;
  g.m = m;
  g.k_padded = static_cast<int>(lda);
  g.packed_b = packed;
  g.panel_begin = p0;
  g.panel_end = p1;
  g.c = c;
  g.ldc = ldc;
  if (lora && lora->active && lora->packed) {
    g.a2 = lora->xa.data();
    g.lda2 = static_cast<std::size_t>(lora->rank_k_padded);
    g.k2_padded = lora->rank_k_padded;
    g.packed_b2 = lora->b_packed.data();
  }
  kt_.gemm_bf16(g);
  if (lora) add_lora_epilogue(*lora, m, p0 * kernels::kPanelColumns, n, c, ldc);
}

void MoeForward::forward(const LayerLora& lora, int tokens, int top_k, const bf16* x, const std::int64_t* ids, const float* weights,
                         float* out) {
  const MoeShape& s = w_.shape();
  TokenGroups groups = group_tokens_by_expert(ids, tokens, top_k, s.num_experts);
  const int rows = groups.total();
  const std::size_t hk = static_cast<std::size_t>(w_.up_shape().k_padded);    // x row stride
  const std::size_t ik = static_cast<std::size_t>(w_.down_shape().k_padded);  // h row stride
  const std::size_t hidden = static_cast<std::size_t>(s.hidden);
  const std::size_t slots = static_cast<std::size_t>(tokens) * top_k;
  if (xs_.size() < rows * hk) xs_.resize(rows * hk);
  if (h_.size() < rows * ik) h_.resize(rows * ik);
  if (y_.size() < slots * hidden) y_.resize(slots * hidden);
  active_.clear();
  for (int e = 0; e < s.num_experts; ++e)
    if (groups.count(e) > 0) active_.push_back(e);
  if (lora_.size() < static_cast<std::size_t>(s.num_experts)) lora_.resize(s.num_experts);
  const bool any_lora = !lora.empty();

  auto mark = Clock::now();
  auto lap = [&](int phase) {
    auto now = Clock::now();
    phase_seconds_[phase] += std::chrono::duration<double>(now - mark).count();
    mark = now;
  };

  // gather: rows grouped by expert; zero K padding so the kernels may read whole k-blocks.
  pool_.parallel_for(static_cast<std::size_t>(rows), [&](std::size_t pos, int) {
    bf16* dst = xs_.data() + pos * hk;
    std::memcpy(dst, x + static_cast<std::size_t>(groups.token[pos]) * hidden, hidden * sizeof(bf16));
    std::fill(dst + hidden, dst + hk, bf16(0));
    bf16* hrow = h_.data() + pos * ik;
    std::fill(hrow + s.intermediate, hrow + ik, bf16(0));
  }, 16);
  lap(0);

  if (any_lora) {
    pool_.parallel_for(active_.size() * 3, [&](std::size_t item, int worker) {
      int e = active_[item / 3];
      Projection p = static_cast<Projection>(item % 3);
      ExpertLora& l = lora_[e][static_cast<int>(p)];
      prepare_lora(lora, e, p, groups.count(e), l);
      if (l.active && p != Projection::down)
        project_lora(l, xs_.data() + groups.offsets[e] * hk, hk, groups.count(e), s.hidden, static_cast<int>(hk), scratch_[worker]);
    });
  }

  lap(1);

  // gate_up
  const int up_panels = w_.up_shape().panels;
  std::vector<std::pair<int, int>> items;  // (expert, first panel)
  for (int e : active_)
    for (int p0 = 0; p0 < up_panels; p0 += panels_per_item(groups.count(e))) items.emplace_back(e, p0);
  pool_.parallel_for(items.size(), [&](std::size_t item, int worker) {
    auto [e, p0] = items[item];
    int m = groups.count(e);
    int p1 = std::min(up_panels, p0 + panels_per_item(m));
    int cols = (p1 - p0) * kernels::kPanelColumns;
    auto& scratch = scratch_[worker];
    scratch.resize(static_cast<std::size_t>(2) * m * cols);
    float* cg = scratch.data();
    float* cu = cg + static_cast<std::size_t>(m) * cols;
    const bf16* a = xs_.data() + groups.offsets[e] * hk;
    int col0 = p0 * kernels::kPanelColumns;
    int n = std::min(cols, s.intermediate - col0);
    for (Projection p : {Projection::gate, Projection::up})
      expert_gemm(a, hk, m, w_.packed(p, e), p0, p1, any_lora ? &lora_[e][static_cast<int>(p)] : nullptr, n,
                  p == Projection::gate ? cg : cu, static_cast<std::size_t>(cols));
    kt_.silu_mul_bf16(cg, static_cast<std::size_t>(cols), cu, static_cast<std::size_t>(cols), m, n,
                      h_.data() + groups.offsets[e] * ik + col0, ik);
  });

  lap(2);

  if (any_lora) {
    pool_.parallel_for(active_.size(), [&](std::size_t item, int worker) {
      int e = active_[item];
      ExpertLora& l = lora_[e][static_cast<int>(Projection::down)];
      if (l.active)
        project_lora(l, h_.data() + groups.offsets[e] * ik, ik, groups.count(e), s.intermediate, static_cast<int>(ik), scratch_[worker]);
    });
  }

  lap(3);

  // down: one f32 row per routing slot
  const int down_panels = w_.down_shape().panels;
  items.clear();
  for (int e : active_)
    for (int p0 = 0; p0 < down_panels; p0 += panels_per_item(groups.count(e))) items.emplace_back(e, p0);
  pool_.parallel_for(items.size(), [&](std::size_t item, int worker) {
    auto [e, p0] = items[item];
    int m = groups.count(e);
    int p1 = std::min(down_panels, p0 + panels_per_item(m));
    int cols = (p1 - p0) * kernels::kPanelColumns;
    auto& scratch = scratch_[worker];
    scratch.resize(static_cast<std::size_t>(m) * cols);
    int col0 = p0 * kernels::kPanelColumns;
    int n = std::min(cols, s.hidden - col0);
    expert_gemm(h_.data() + groups.offsets[e] * ik, ik, m, w_.packed(Projection::down, e), p0, p1,
                any_lora ? &lora_[e][static_cast<int>(Projection::down)] : nullptr, n, scratch.data(), static_cast<std::size_t>(cols));
    for (int i = 0; i < m; ++i)
      std::memcpy(y_.data() + static_cast<std::size_t>(groups.slot[groups.offsets[e] + i]) * hidden + col0,
                  scratch.data() + static_cast<std::size_t>(i) * cols, static_cast<std::size_t>(n) * sizeof(float));
  });

  lap(4);

  // combine, in slot order: the same sum whatever the thread count
  pool_.parallel_for(static_cast<std::size_t>(tokens), [&](std::size_t t, int) {
    float* o = out + t * hidden;
    std::fill(o, o + hidden, 0.0f);
    for (int j = 0; j < top_k; ++j) {
      std::size_t slot = t * top_k + j;
      if (ids[slot] < 0) continue;
      const float* y = y_.data() + slot * hidden;
      float wt = weights[slot];
      for (std::size_t c = 0; c < hidden; ++c) o[c] += wt * y[c];
    }
  }, 4);
  lap(5);
}

}  // namespace tilemoe
