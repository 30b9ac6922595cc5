#pragma once
// One expert's LoRA term in one GEMM of the layer:
//
//   C = V W'ᵀ + (s V A'ᵀ) B'ᵀ,   A': [rank][in], B': [out][rank], read in place through strides.
//
// Forward uses it with A' = A and B' = B. Backward runs the transposed products with the same
// code: dH = dY Wd + (s dY Bd) Ad is the term with A' = Bdᵀ and B' = Adᵀ, and dX likewise for
// gate and up, so the factors are never copied into another orientation.
//
// Two forms, chosen by the caller from the number of rows (kLoraPackRows, or kLoraPackRowsAmx
// where the tile kernels run): from there on, A' and B' are packed to bf16 so that the GEMM
// kernels fuse B' as extra K steps of the main product (the packing is amortised over the rows);
// below, the term is computed from the factors as they are (f32 or bf16).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "amx/aligned_vector.hpp"
#include "amx/gemm_mxfp4.hpp"
#include "amx/kernel_table.hpp"
#include "amx/lora_grad.hpp"
#include "amx/lora_rows.hpp"
#include "amx/prefetch.hpp"
#include "tilemoe/lora.hpp"

namespace tilemoe {

inline constexpr int kLoraPackRows = 16;
// On AMX the fused form pays from 8 rows: at 128 tokens of DeepSeek-V2-Lite (about 12 rows an
// expert), r = 16, the forward took 8.7-9.7 ms against 9.5-10.0 with 16 and 8.9-10.0 with 4 (the
// device, three rounds in one call). On AVX-512 (2-core Zen 4) 8 was 1.5-2 % slower than 16.
inline constexpr int kLoraPackRowsAmx = 8;

// Expert e's A [rank][in] and B [out][rank] of a caller's view, read in place as they are stored.
kernels::StridedFactor lora_a_factor(const LoraProjectionView& lp, int e);
kernels::StridedFactor lora_b_factor(const LoraProjectionView& lp, int e);
// Expert e's gradient of A ([rank][in], rows lda apart) or B ([out][rank]) where backward writes it.
kernels::GradTarget lora_grad_a(const LoraProjectionGrad& g, int e, int rank, int in);
kernels::GradTarget lora_grad_b(const LoraProjectionGrad& g, int e, int rank, int out);

using kernels::prefetch_range;  // amx/prefetch.hpp: the few KiB of LoRA factors an item is about to read

class LoraTerm {
 public:
  void deactivate() { active_ = false; }
  // held_generation != 0: the factors are a set held by the layer (a loaded adapter) that never
  // changes under that number, so the packed form is made at the first call that needs it and
  // reused by later ones (the same bits as packing again); 0: the caller's arrays, which may
  // change between calls, packed at every call that needs them.
  //
  // b_by_item (for the caller's arrays only): B' is not packed here; each fuse_into packs just the
  // panels of its GEMM, into a per-thread buffer. A forward item reads each panel of B' once, so
  // that skips writing the whole packed B' and reading it back: at 512 tokens of
  // DeepSeek-V2-Lite, r = 16, 10 MB each way per layer call.
  // packed: the form of the rows >= kLoraPackRows(Amx) above, else the f32 form.
  //
  // pack_a = false (the packed form, the caller's arrays): A' is not packed here; the term reads
  // another term's packed A' (read_packed_a_of) before it projects. The nodes of a layer on one
  // memory node share A's packing and x Aᵀ that way (shared_gather.hpp).
  void prepare(const kernels::KernelTable& kt, kernels::StridedFactor a, kernels::StridedFactor b, int rank, int in, int out, float scale,
               bool packed, std::uint64_t held_generation = 0, bool b_by_item = false, bool pack_a = true);
  // The packed A' of `owner`, a term prepared with the same factors and shape, read in place by
  // this term's projections; and its xa, read in place by this term's fused products instead of a
  // projection of its own (until the next prepare or projection). `owner` must outlive the use.
  void read_packed_a_of(const LoraTerm& owner) { a_owner_ = &owner; }
  // Whether the last prepare packed A' here (false: pack_a = false, A' is to be borrowed).
  bool has_own_packed_a() const { return a_ready_; }
  void read_xa_of(const LoraTerm& owner) { xa_owner_ = &owner; }

  bool active() const { return active_; }
  bool packed() const { return packed_; }
  int rank() const { return rank_; }

  // xa = s V A'ᵀ for `rows` rows of V (bf16, row stride ldv, zeros in [in, k_padded)). When
  // `save` is given, the f32 values are also written there ([rows][ld_save]): backward needs them.
  // With v_tiles, V is in tile order (pack_bf16.hpp; ldv is then unused).
  void project(const kernels::KernelTable& kt, const bf16* v, std::size_t ldv, int rows, int k_padded,
               AlignedVector<float>& scratch, float* save, std::size_t ld_save, bool v_tiles = false);
  // The same in pieces, for a caller that holds only some rows of V at a time: start_rows sizes
  // the term for `rows` rows (zeroing the packed form's padding), then each project_rows computes
  // rows [row0, row0 + count) from v, which holds just those rows (by rows), and writes them to xa
  // and to save's rows [row0, row0 + count). Every row must be projected before the term is used.
  void start_rows(int rows);
  // With v_tiles (the packed form only), v holds those rows in tile order (ldv is then unused).
  void project_rows(const kernels::KernelTable& kt, const bf16* v, std::size_t ldv, int row0, int count, int k_padded,
                    AlignedVector<float>& scratch, float* save, std::size_t ld_save, bool v_tiles = false);
  // project_rows of two terms over the same rows of V (gate's and up's, after start_rows of both)
  // as one product: their A' side by side (first's panels, then second's) as one matrix of both
  // ranks' outputs, so that the kernel reads V once and, at r = 16, runs a panel pair instead of
  // two single panels. The same bits as two projections: every output column sums over k alone.
  // Only for held sets (the joint A' is made once a set): otherwise, or where either term is not
  // packed and active, or the two read different widths of V, each projects on its own.
  static void project_rows_pair(const kernels::KernelTable& kt, LoraTerm& first, LoraTerm& second, const bf16* v, std::size_t ldv,
                                int row0, int count, int k_padded, AlignedVector<float>& scratch, float* save_first,
                                std::size_t ld_save_first, float* save_second, std::size_t ld_save_second, bool v_tiles = false);
  // The packed form's xa for `rows` rows from values already scaled ([rows][ld] f32): the sum of
  // the nodes' projections, in a tensor-parallel layer's forward (expert_partial_sums.hpp).
  void load_xa(const float* values, std::size_t ld, int rows);

  // Makes the term the second product of `g` when it is packed. `panel_shift` is the global
  // panel index of g's panel 0 minus g.panel_begin, for a main B that covers only some panels.
  // With b_by_item, g's panels of B' are packed into this thread's buffer, which holds them until
  // the thread's next fuse_into: run g before fusing another term on the same thread.
  bool fuse_into(kernels::GemmBf16Args& g, int panel_shift) const;
  bool fuse_into(kernels::GemmIntArgs& g, int panel_shift) const;  // the same for integer weights
  // Adds the term, when it is not packed, from f32 to the rows of C at global columns
  // [col0, col0 + n).
  void add_f32(const kernels::KernelTable& kt, int rows, int col0, int n, float* c, std::size_t ldc) const;

 private:
  // Rows [row0, row0 + count) of xa (and of save) from the `count` rows of V at v.
  void project_range(const kernels::KernelTable& kt, const bf16* v, std::size_t ldv, int row0, int count, int k_padded, bool v_tiles,
                     AlignedVector<float>& scratch, float* save, std::size_t ld_save);
  // Rows [row0, row0 + count) of xa (and save) from the unscaled products in `products`, this
  // term's first output at column 0, rows ld apart.
  void store_xa(const float* products, std::size_t ld, int row0, int count, float* save, std::size_t ld_save);
  // The term whose packed A' this one's projections read: a_owner_, or this one.
  const LoraTerm& a_source() const { return a_owner_ ? *a_owner_ : *this; }
  const bf16* packed_a() const { return a_source().a_packed_.data(); }
  // Whether first and second can project as one product (project_rows_pair).
  static bool pairs_with(const LoraTerm& first, const LoraTerm& second);
  // first's and second's A' side by side, in first's joint_a_, copied once a pair of held sets.
  static const bf16* joint_packed_a(LoraTerm& first, const LoraTerm& second);

  bool active_ = false, packed_ = false, b_by_item_ = false;
  int out_ = 0;
  kernels::PackStridedFn pack_ = nullptr;
  std::uint64_t packed_generation_ = 0;  // the held set a_packed_ and b_packed_ hold; 0: none
  int rank_ = 0, in_ = 0;
  float scale_ = 0;
  kernels::StridedFactor a_, b_;
  AlignedVector<float> xa_f32_;  // [rows][rank], when not packed
  int rank_panels_ = 0;        // A' packed as n = rank
  int rank_k_padded_ = 0;      // B' packed as k = rank
  std::size_t b_panel_stride_ = 0;  // b_packed_'s short panel form (a held set), or 0: whole k-blocks
  AlignedVector<bf16> a_packed_, b_packed_;  // tile operands: cache-line aligned
  std::vector<bf16> pack_scratch_;
  AlignedVector<bf16> xa_;  // bf16(s V A'ᵀ), [rows][rank_k_padded_], when packed
  bool a_ready_ = false;                // a_packed_ holds this term's A'
  const LoraTerm* a_owner_ = nullptr;   // whose a_packed_ the projections read (null: this one's)
  const LoraTerm* xa_owner_ = nullptr;  // whose xa_ the fused products read (null: this one's)
  AlignedVector<bf16> joint_a_;         // project_rows_pair's A' of both terms, when this is the first
  const bf16* joint_of_[2] = {nullptr, nullptr};  // the packed A's joint_a_ was copied from
  std::uint64_t joint_generation_[2] = {0, 0};   // and their held sets
};

// C = V W'ᵀ over panels [p0, p1) of `packed_b` (panel_shift as in fuse_into), plus every active
// term: the first packed one fused as extra K steps, the others added after. n: the real
// columns of C from global column col0. g carries a, lda, m, k_padded, packed_b, the panel
// range, c and ldc.
// With `mxfp4`, the main product's weights are that MXFP4 matrix (g.packed_b unused; gemm_mxfp4.hpp).
void gemm_with_lora_terms(const kernels::KernelTable& kt, kernels::GemmBf16Args g, const LoraTerm* const* terms, int term_count,
                          int panel_shift, int n, const kernels::Mxfp4Operand* mxfp4 = nullptr);
// g's product on bf16 weights, or on `mxfp4`'s when given.
void gemm_main_weights(const kernels::KernelTable& kt, const kernels::GemmBf16Args& g, const kernels::Mxfp4Operand* mxfp4);

}  // namespace tilemoe
