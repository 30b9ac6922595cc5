// The transposed repack element by element, straight from the layout formulas: the reference the
// vector version is tested against, and the path for CPUs without AVX-512.
#include "amx/pack_transposed.hpp"

namespace tilemoe::kernels {

void pack_transposed_kblock_portable(const bf16* packed_w, int panels, int kblocks, int kb, bf16* dst,
                                     std::size_t dst_panel_stride) {
  const int tkblocks = transposed_kblocks(panels);
  for (int q = 0; q < 2; ++q) {
    for (int j = 0; j < tkblocks; ++j) {
      bf16* out = dst + q * dst_panel_stride + static_cast<std::size_t>(j) * kBlockElements;
      for (int r = 0; r < kBlockK / 2; ++r) {
        for (int c = 0; c < kPanelColumns; ++c) {
          for (int p = 0; p < 2; ++p) {
            // Output (q, j, r, c, p) is W[h][kb*32 + kk]; in the forward layout that sits in
            // block (h / 16, kb) at k-pair kk / 2, column h % 16, half kk % 2.
            const int h = j * kBlockK + 2 * r + p, kk = q * kPanelColumns + c;
            bf16 value = 0;
            if (h < panels * kPanelColumns) {
              const std::size_t block = static_cast<std::size_t>(h / kPanelColumns) * kblocks + kb;
              value = packed_w[block * kBlockElements + (kk / 2) * 32 + (h % kPanelColumns) * 2 + kk % 2];
            }
            out[r * 32 + c * 2 + p] = value;
          }
        }
      }
    }
  }
}

}  // namespace tilemoe::kernels
