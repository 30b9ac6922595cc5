#include "amx/pack_strided.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace tilemoe::kernels {

namespace {

// count elements of w from `first`, `stride` apart, as bf16 into dst: f32 through `convert`
// (contiguous runs directly, others gathered into `run` first), bf16 copied.
void to_bf16_run(StridedFactor w, std::size_t first, std::size_t stride, std::size_t count, ConvertRowFn convert,
                 std::vector<float>& run, bf16* dst) {
  if (w.is_bf16()) {
    const bf16* src = w.as<bf16>() + first;
    for (std::size_t i = 0; i < count; ++i) dst[i] = src[i * stride];
    return;
  }
  const float* src = w.as<float>() + first;
  if (stride == 1) return convert(src, count, 1.0f, dst);
  run.resize(count);
  for (std::size_t i = 0; i < count; ++i) run[i] = src[i * stride];
  convert(run.data(), count, 1.0f, dst);
}

}  // namespace

void pack_strided_portable(StridedFactor w, int n, int k, bf16* packed, std::vector<bf16>& scratch) {
  pack_strided_with(w, n, k, packed, convert_to_bf16_portable, scratch);
}

void pack_strided_with(StridedFactor w, int n, int k, bf16* packed, ConvertRowFn convert, std::vector<bf16>& scratch) {
  const PackedShape s = packed_shape(n, k);
  if (s.panels == 0 || s.kblocks == 0) return;
  const std::size_t np = static_cast<std::size_t>(s.n_padded), kp = static_cast<std::size_t>(s.k_padded);
  scratch.resize(np * kp);
  std::vector<float> run;
  if (w.col_stride == 1) {
    // Rows along k: scratch [n_padded][k_padded], then each 1 KiB block is a 16 x 16 transpose of k-pairs.
    for (std::size_t col = 0; col < np; ++col) {
      bf16* row = scratch.data() + col * kp;
      if (col < static_cast<std::size_t>(n)) {
        to_bf16_run(w, col * w.row_stride, 1, static_cast<std::size_t>(k), convert, run, row);
        std::fill(row + k, row + kp, bf16{0});
      } else {
        std::fill(row, row + kp, bf16{0});
      }
    }
    // k-pairs move as 32-bit words (memcpy: the storage is bf16).
    bf16* o = packed;
    for (int nb = 0; nb < s.panels; ++nb) {
      const bf16* rows = scratch.data() + static_cast<std::size_t>(nb) * kPanelColumns * kp;
      for (int kb = 0; kb < s.kblocks; ++kb)
        for (int r = 0; r < kBlockK / 2; ++r, o += 2 * kPanelColumns) {
          const bf16* src = rows + static_cast<std::size_t>(kb) * kBlockK + 2 * static_cast<std::size_t>(r);
          for (int c = 0; c < kPanelColumns; ++c) std::memcpy(o + 2 * c, src + static_cast<std::size_t>(c) * kp, 2 * sizeof(bf16));
        }
    }
    return;
  }
  // Otherwise along the columns: scratch [k_padded][n_padded] (contiguous runs when row_stride is
  // 1, the transposed factors of the backward), then each block row interleaves two k rows.
  for (std::size_t kk = 0; kk < kp; ++kk) {
    bf16* dst = scratch.data() + kk * np;
    if (kk < static_cast<std::size_t>(k)) {
      to_bf16_run(w, kk * w.col_stride, w.row_stride, static_cast<std::size_t>(n), convert, run, dst);
      std::fill(dst + n, dst + np, bf16{0});
    } else {
      std::fill(dst, dst + np, bf16{0});
    }
  }
  bf16* o = packed;
  for (int nb = 0; nb < s.panels; ++nb)
    for (int kb = 0; kb < s.kblocks; ++kb)
      for (int r = 0; r < kBlockK / 2; ++r) {
        const std::size_t kk = static_cast<std::size_t>(kb) * kBlockK + 2 * static_cast<std::size_t>(r);
        const bf16* even = scratch.data() + kk * np + static_cast<std::size_t>(nb) * kPanelColumns;
        const bf16* odd = even + np;
        for (int c = 0; c < kPanelColumns; ++c) {
          *o++ = even[c];
          *o++ = odd[c];
        }
      }
}

}  // namespace tilemoe::kernels
