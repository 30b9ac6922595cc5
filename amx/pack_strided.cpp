#include "amx/pack_strided.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace tilemoe::kernels {

void pack_strided_f32_portable(StridedF32 w, int n, int k, bf16* packed, std::vector<bf16>& scratch) {
  pack_strided_f32_with(w, n, k, packed, convert_to_bf16_portable, scratch);
}

void pack_strided_f32_with(StridedF32 w, int n, int k, bf16* packed, ConvertRowFn convert, std::vector<bf16>& scratch) {
  const PackedShape s = packed_shape(n, k);
  if (s.panels == 0 || s.kblocks == 0) return;
  const std::size_t np = static_cast<std::size_t>(s.n_padded), kp = static_cast<std::size_t>(s.k_padded);
  scratch.resize(np * kp);
  if (w.col_stride == 1) {
    // Rows along k: scratch [n_padded][k_padded], then each 1 KiB block is a 16 x 16 transpose of k-pairs.
    for (std::size_t col = 0; col < np; ++col) {
      bf16* row = scratch.data() + col * kp;
      if (col < static_cast<std::size_t>(n)) {
        convert(w.data + col * w.row_stride, static_cast<std::size_t>(k), 1.0f, row);
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
  std::vector<float> run(static_cast<std::size_t>(n));
  for (std::size_t kk = 0; kk < kp; ++kk) {
    bf16* dst = scratch.data() + kk * np;
    if (kk < static_cast<std::size_t>(k)) {
      const float* src = w.data + kk * w.col_stride;
      if (w.row_stride == 1) {
        convert(src, static_cast<std::size_t>(n), 1.0f, dst);
      } else {
        for (int col = 0; col < n; ++col) run[static_cast<std::size_t>(col)] = src[static_cast<std::size_t>(col) * w.row_stride];
        convert(run.data(), static_cast<std::size_t>(n), 1.0f, dst);
      }
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
