#include "src/layer/lora_term.hpp"

#include <algorithm>
#include <stdexcept>

#include "amx/pack_bf16.hpp"
#include "amx/pack_strided.hpp"

namespace tilemoe {
namespace {
// B' gets zero rows up to a multiple of 32 outputs: the backward's main products cover whole
// 32-column slices of Wᵀ, one panel more than ceil(out / 16) when out % 32 is in (0, 16].
int padded_out_rows(int out) { return (out + 2 * kernels::kPanelColumns - 1) / (2 * kernels::kPanelColumns) * (2 * kernels::kPanelColumns); }
}  // namespace

void LoraTerm::prepare(const kernels::KernelTable& kt, kernels::StridedFactor a, kernels::StridedFactor b, int rank, int in, int out,
                       float scale, bool packed, std::uint64_t held_generation, bool b_by_item, bool pack_a) {
  active_ = rank > 0;
  a_owner_ = xa_owner_ = nullptr;
  if (!active_) return;
  a_ = a;
  b_ = b;
  rank_ = rank;
  in_ = in;
  out_ = out;
  scale_ = scale;
  pack_ = kt.pack_strided;
  packed_ = packed;
  b_by_item_ = false;
  if (!packed_) return;
  if (held_generation != 0 && packed_generation_ == held_generation) return;
  packed_generation_ = 0;
  b_panel_stride_ = 0;
  rank_panels_ = kernels::packed_shape(rank, in).panels;
  rank_k_padded_ = kernels::packed_shape(out, rank).k_padded;
  a_ready_ = pack_a || held_generation != 0;
  if (a_ready_) {
    a_packed_.resize(kernels::packed_bf16_elements(rank, in));
    kt.pack_strided(a, rank, in, a_packed_.data(), pack_scratch_);
  }
  if (b_by_item && held_generation == 0) {
    b_by_item_ = true;
    return;
  }
  const int b_rows = padded_out_rows(out);
  b_packed_.resize(kernels::packed_bf16_elements(b_rows, rank));
  // Rows of B' from out on are the zero padding pack_strided writes for n_padded > out.
  kt.pack_strided(b, out, rank, b_packed_.data(), pack_scratch_);
  const std::size_t b_written = kernels::packed_bf16_elements(out, rank);
  std::fill(b_packed_.begin() + static_cast<std::ptrdiff_t>(b_written), b_packed_.end(), bf16{0});
  packed_generation_ = held_generation;
  // A held set at a rank that ends in the first half of a k-block (16, say) keeps B' in the short
  // panel form (pack_bf16.hpp): at r = 16 half of each padded panel was zeros, so every call reads
  // half the bytes of B' (at 512 tokens of DeepSeek-V2-Lite, 21 MB of factors instead of 31). The
  // fused product then reads the next panel's first k-pairs against xa's zero columns, which adds
  // nothing only if they are finite: with a non-finite value in B' (which must reach its own
  // columns only, as in PyTorch) the padded form stays.
  const std::size_t compact_panel = kernels::compact_panel_elements(rank);
  if (held_generation == 0 || compact_panel == static_cast<std::size_t>(rank_k_padded_) * kernels::kPanelColumns) return;
  const bool finite = std::all_of(b_packed_.begin(), b_packed_.end(), bf16_is_finite);
  if (!finite) return;
  AlignedVector<bf16> compact(kernels::compact_packed_elements(b_rows, rank));
  kernels::compact_packed_panels(b_packed_.data(), b_rows, rank, compact.data());
  b_packed_ = std::move(compact);
  b_panel_stride_ = compact_panel;
}

void LoraTerm::project(const kernels::KernelTable& kt, const bf16* v, std::size_t ldv, int rows, int k_padded,
                       AlignedVector<float>& scratch, float* save, std::size_t ld_save, bool v_tiles) {
  if (!active_) return;
  if (!packed_ && v_tiles) {
    // The f32 loops read rows: the tiles' rows back into a per-thread buffer (rows × k_padded).
    thread_local std::vector<bf16> by_rows;
    grow_to(by_rows, static_cast<std::size_t>(rows) * k_padded);
    kernels::unpack_tiles_to_rows(v, rows, k_padded, by_rows.data(), static_cast<std::size_t>(k_padded));
    v = by_rows.data();
    ldv = static_cast<std::size_t>(k_padded);
    v_tiles = false;
  }
  start_rows(rows);
  project_range(kt, v, ldv, 0, rows, k_padded, v_tiles, scratch, save, ld_save);
}

void LoraTerm::start_rows(int rows) {
  if (!active_) return;
  xa_owner_ = nullptr;
  if (packed_) {
    xa_.assign(static_cast<std::size_t>(rows) * rank_k_padded_, bf16{0});
  } else {
    xa_f32_.resize(static_cast<std::size_t>(rows) * rank_);
  }
}

void LoraTerm::project_rows(const kernels::KernelTable& kt, const bf16* v, std::size_t ldv, int row0, int count, int k_padded,
                            AlignedVector<float>& scratch, float* save, std::size_t ld_save, bool v_tiles) {
  if (!active_) return;
  if (v_tiles && !packed_) throw std::logic_error("LoraTerm::project_rows: rows in tile order need the packed form");
  project_range(kt, v, ldv, row0, count, k_padded, v_tiles, scratch, save, ld_save);
}

void LoraTerm::load_xa(const float* values, std::size_t ld, int rows) {
  if (!active_) return;
  if (!packed_) throw std::logic_error("LoraTerm::load_xa: the f32 form keeps its own projection");
  start_rows(rows);
  for (int i = 0; i < rows; ++i) {
    const float* vi = values + static_cast<std::size_t>(i) * ld;
    bf16* xi = xa_.data() + static_cast<std::size_t>(i) * rank_k_padded_;
    for (int j = 0; j < rank_; ++j) xi[j] = float_to_bf16(vi[j]);
  }
}

void LoraTerm::project_range(const kernels::KernelTable& kt, const bf16* v, std::size_t ldv, int row0, int count, int k_padded,
                             bool v_tiles, AlignedVector<float>& scratch, float* save, std::size_t ld_save) {
  const std::size_t first = static_cast<std::size_t>(row0);
  if (!packed_) {
    float* xa = xa_f32_.data() + first * rank_;
    kt.lora_project_rows(v, ldv, count, in_, a_, rank_, scale_, xa, static_cast<std::size_t>(rank_));
    if (save)
      for (int i = 0; i < count; ++i)
        std::copy_n(xa + static_cast<std::size_t>(i) * rank_, rank_, save + (first + i) * ld_save);
    return;
  }
  // V A'ᵀ on the tile kernels (A' packed as a weight matrix of `rank` outputs), then scaled once.
  const int cols = rank_panels_ * kernels::kPanelColumns;
  grow_to(scratch, static_cast<std::size_t>(count) * cols);
  if (!a_owner_ && !a_ready_) throw std::logic_error("LoraTerm: a projection before A' was packed or borrowed");
  kernels::GemmBf16Args g = kernels::gemm_args(v, ldv, count, k_padded, packed_a(), 0, rank_panels_, scratch.data(), static_cast<std::size_t>(cols));
  g.a_tiles = v_tiles;
  kt.gemm_bf16(g);
  store_xa(scratch.data(), static_cast<std::size_t>(cols), row0, count, save, ld_save);
}

void LoraTerm::store_xa(const float* products, std::size_t ld, int row0, int count, float* save, std::size_t ld_save) {
  const std::size_t first = static_cast<std::size_t>(row0);
  for (int i = 0; i < count; ++i) {
    const float* si = products + static_cast<std::size_t>(i) * ld;
    bf16* xi = xa_.data() + (first + i) * rank_k_padded_;
    float* keep = save ? save + (first + i) * ld_save : nullptr;
    for (int j = 0; j < rank_; ++j) {
      const float x = scale_ * si[j];
      xi[j] = float_to_bf16(x);
      if (keep) keep[j] = x;
    }
  }
}

bool LoraTerm::pairs_with(const LoraTerm& first, const LoraTerm& second) {
  if (!first.active_ || !second.active_ || !first.packed_ || !second.packed_ || first.in_ != second.in_) return false;
  const LoraTerm& a = first.a_source();
  const LoraTerm& b = second.a_source();
  return a.a_ready_ && b.a_ready_ && a.packed_generation_ != 0 && b.packed_generation_ != 0;
}

const bf16* LoraTerm::joint_packed_a(LoraTerm& first, const LoraTerm& second) {
  const LoraTerm* owner[2] = {&first.a_source(), &second.a_source()};
  bool same = true;
  for (int i = 0; i < 2; ++i)
    same = same && first.joint_of_[i] == owner[i]->a_packed_.data() && first.joint_generation_[i] == owner[i]->packed_generation_;
  if (same) return first.joint_a_.data();
  const std::size_t size[2] = {kernels::packed_bf16_elements(first.rank_, first.in_), kernels::packed_bf16_elements(second.rank_, second.in_)};
  first.joint_a_.resize(size[0] + size[1]);
  std::copy_n(owner[0]->a_packed_.data(), size[0], first.joint_a_.data());
  std::copy_n(owner[1]->a_packed_.data(), size[1], first.joint_a_.data() + size[0]);
  for (int i = 0; i < 2; ++i) {
    first.joint_of_[i] = owner[i]->a_packed_.data();
    first.joint_generation_[i] = owner[i]->packed_generation_;
  }
  return first.joint_a_.data();
}

void LoraTerm::project_rows_pair(const kernels::KernelTable& kt, LoraTerm& first, LoraTerm& second, const bf16* v, std::size_t ldv,
                                 int row0, int count, int k_padded, AlignedVector<float>& scratch, float* save_first,
                                 std::size_t ld_save_first, float* save_second, std::size_t ld_save_second, bool v_tiles) {
  if (!pairs_with(first, second)) {
    first.project_rows(kt, v, ldv, row0, count, k_padded, scratch, save_first, ld_save_first, v_tiles);
    second.project_rows(kt, v, ldv, row0, count, k_padded, scratch, save_second, ld_save_second, v_tiles);
    return;
  }
  const int panels = first.rank_panels_ + second.rank_panels_;
  const std::size_t cols = static_cast<std::size_t>(panels) * kernels::kPanelColumns;
  grow_to(scratch, static_cast<std::size_t>(count) * cols);
  kernels::GemmBf16Args g = kernels::gemm_args(v, ldv, count, k_padded, joint_packed_a(first, second), 0, panels, scratch.data(), cols);
  g.a_tiles = v_tiles;
  kt.gemm_bf16(g);
  first.store_xa(scratch.data(), cols, row0, count, save_first, ld_save_first);
  second.store_xa(scratch.data() + static_cast<std::size_t>(first.rank_panels_) * kernels::kPanelColumns, cols, row0, count, save_second,
                  ld_save_second);
}

bool LoraTerm::fuse_into(kernels::GemmBf16Args& g, int panel_shift) const {
  if (!active_ || !packed_) return false;
  const std::size_t panel_stride = kernels::second_panel_stride(rank_k_padded_, b_panel_stride_);
  const bf16* b_packed = b_packed_.data();
  if (b_by_item_) {
    // Panels [p0, p1) of B' at their place in a buffer laid out as the whole packed B'; the
    // panels past `out` (up to the padded row count) are zeros.
    thread_local AlignedVector<bf16> item_b;
    thread_local std::vector<bf16> scratch;
    const int p0 = g.panel_begin + panel_shift, p1 = g.panel_end + panel_shift;
    const std::size_t need = kernels::packed_bf16_elements(std::max(padded_out_rows(out_), p1 * kernels::kPanelColumns), rank_);
    grow_to(item_b, need);
    const int row0 = p0 * kernels::kPanelColumns;
    const int rows = std::min(out_, p1 * kernels::kPanelColumns) - row0;
    int written = 0;  // panels from p0 that the packer wrote
    if (rows > 0) {
      pack_(b_.offset(row0, 0), rows, rank_, item_b.data() + static_cast<std::size_t>(p0) * panel_stride, scratch);
      written = (rows + kernels::kPanelColumns - 1) / kernels::kPanelColumns;
    }
    std::fill(item_b.begin() + static_cast<std::ptrdiff_t>((p0 + written) * panel_stride),
              item_b.begin() + static_cast<std::ptrdiff_t>(std::max(p0 + written, p1) * panel_stride), bf16{0});
    b_packed = item_b.data();
  }
  g.a2 = (xa_owner_ ? xa_owner_ : this)->xa_.data();
  g.lda2 = static_cast<std::size_t>(rank_k_padded_);
  g.k2_padded = rank_k_padded_;
  g.b2_panel_stride = b_by_item_ ? 0 : b_panel_stride_;
  g.packed_b2 = b_packed + static_cast<std::ptrdiff_t>(panel_shift) * static_cast<std::ptrdiff_t>(panel_stride);
  return true;
}

bool LoraTerm::fuse_into(kernels::GemmIntArgs& g, int panel_shift) const {
  kernels::GemmBf16Args second{};
  second.panel_begin = g.panel_begin;  // the panels a b_by_item term packs
  second.panel_end = g.panel_end;
  if (!fuse_into(second, panel_shift)) return false;
  g.a2 = second.a2;
  g.lda2 = second.lda2;
  g.k2_padded = second.k2_padded;
  g.packed_b2 = second.packed_b2;
  g.b2_panel_stride = second.b2_panel_stride;
  return true;
}

void LoraTerm::add_f32(const kernels::KernelTable& kt, int rows, int col0, int n, float* c, std::size_t ldc) const {
  if (!active_ || packed_) return;
  kt.lora_expand_rows_add(xa_f32_.data(), static_cast<std::size_t>(rank_), rows, rank_, b_, col0, n, c, ldc);
}

namespace {
kernels::GradTarget grad_target(void* first, LoraDType dtype) {
  if (dtype == LoraDType::bf16) return static_cast<bf16*>(first);
  return static_cast<float*>(first);
}

kernels::StridedFactor factor(const void* first, LoraDType dtype, std::size_t row_stride) {
  if (dtype == LoraDType::bf16) return {static_cast<const bf16*>(first), row_stride, 1};
  return {static_cast<const float*>(first), row_stride, 1};
}
}  // namespace

kernels::StridedFactor lora_a_factor(const LoraProjectionView& lp, int e) { return factor(lp.a_of(e), lp.dtype, lp.lda()); }
kernels::StridedFactor lora_b_factor(const LoraProjectionView& lp, int e) {
  return factor(lp.b_of(e), lp.dtype, static_cast<std::size_t>(lp.rank));
}

kernels::GradTarget lora_grad_a(const LoraProjectionGrad& g, int e, int rank, int in) { return grad_target(g.a_of(e, rank, in), g.dtype); }
kernels::GradTarget lora_grad_b(const LoraProjectionGrad& g, int e, int rank, int out) {
  return grad_target(g.b_of(e, rank, out), g.dtype);
}

void gemm_main_weights(const kernels::KernelTable& kt, const kernels::GemmBf16Args& g, const kernels::Mxfp4Operand* mxfp4) {
  if (mxfp4) kernels::gemm_mxfp4(g, mxfp4->shape, mxfp4->view, kernels::mxfp4_kernels(kt));
  else kt.gemm_bf16(g);
}

void gemm_with_lora_terms(const kernels::KernelTable& kt, kernels::GemmBf16Args g, const LoraTerm* const* terms, int term_count,
                          int panel_shift, int n, const kernels::Mxfp4Operand* mxfp4) {
  const LoraTerm* fused = nullptr;
  for (int t = 0; t < term_count && !fused; ++t)
    if (terms[t] && terms[t]->fuse_into(g, panel_shift)) fused = terms[t];
  gemm_main_weights(kt, g, mxfp4);
  const int col0 = (g.panel_begin + panel_shift) * kernels::kPanelColumns;
  for (int t = 0; t < term_count; ++t) {
    const LoraTerm* term = terms[t];
    if (!term || !term->active() || term == fused) continue;
    if (!term->packed()) {
      term->add_f32(kt, g.m, col0, n, g.c, g.ldc);
      continue;
    }
    // A second packed term: its own accumulating call with an empty main product.
    kernels::GemmBf16Args extra = g;
    extra.k_padded = 0;
    extra.accumulate = true;
    term->fuse_into(extra, panel_shift);
    kt.gemm_bf16(extra);
  }
}

}  // namespace tilemoe
