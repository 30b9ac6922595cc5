// Dequantizing transposed repack of int8/int4 weights, element by element from the layout
// formulas (packed_int_code): the reference the vector version is tested against.
#include "amx/pack_transposed.hpp"

namespace tilemoe::kernels {

void pack_transposed_kblock_int_portable(const PackedIntShape& s, const PackedIntView& w, int nb0, int nb1, int kb, bf16* dst,
                                std::size_t dst_panel_stride) {
  const int panels = nb1 - nb0;
  const int tkblocks = transposed_kblocks(panels);
  const int rows = panels * kPanelColumns;  // W rows [nb0*16, nb1*16) become Wᵀ's reduction
  for (int q = 0; q < 2; ++q) {
    const int kk0 = kb * kBlockK + q * kPanelColumns;  // W columns kk0 .. kk0 + 15: this Wᵀ panel's outputs
    for (int j = 0; j < tkblocks; ++j) {
      bf16* out = dst + q * dst_panel_stride + static_cast<std::size_t>(j) * kBlockElements;
      for (int r = 0; r < kBlockK / 2; ++r)
        for (int p = 0; p < 2; ++p) {
          const int hl = j * kBlockK + 2 * r + p;  // W row, from nb0 * 16
          if (hl >= rows) {
            for (int c = 0; c < kPanelColumns; ++c) out[r * 32 + c * 2 + p] = 0;
            continue;
          }
          const int h = nb0 * kPanelColumns + hl;
          const float* scale_row = w.scales + static_cast<std::size_t>(h / kPanelColumns) * s.groups * kPanelColumns + h % kPanelColumns;
          for (int c = 0; c < kPanelColumns; ++c) {
            const int kk = kk0 + c;
            const float scale = scale_row[static_cast<std::size_t>(kk / s.group) * kPanelColumns];
            out[r * 32 + c * 2 + p] = float_to_bf16(static_cast<float>(packed_int_code(s, w.codes, h, kk)) * scale);
          }
        }
    }
  }
}

}  // namespace tilemoe::kernels
