#include "amx/pack_bf16.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "tilemoe/error.hpp"

namespace tilemoe::kernels {
namespace {

void check_ld(int n, int k, std::size_t ld, const char* what) {
  if (n > 0 && ld < static_cast<std::size_t>(k)) {
    fail(ErrorKind::invalid_argument, std::string(what) + ": leading dimension " + std::to_string(ld) +
                                          " is smaller than k = " + std::to_string(k));
  }
}

}  // namespace

PackedShape packed_shape(int n, int k) {
  if (n < 0 || k < 0) {
    fail(ErrorKind::invalid_argument,
         "packed_shape: negative size n = " + std::to_string(n) + ", k = " + std::to_string(k));
  }
  PackedShape s{};
  s.n = n;
  s.k = k;
  s.panels = (n + kPanelColumns - 1) / kPanelColumns;
  s.kblocks = (k + kBlockK - 1) / kBlockK;
  s.n_padded = s.panels * kPanelColumns;
  s.k_padded = s.kblocks * kBlockK;
  return s;
}

std::size_t packed_bf16_elements(int n, int k) {
  const PackedShape s = packed_shape(n, k);
  return static_cast<std::size_t>(s.n_padded) * static_cast<std::size_t>(s.k_padded);
}

std::size_t compact_panel_elements(int k) {
  const PackedShape s = packed_shape(1, k);
  const int rest = k % kBlockK;
  const std::size_t whole = static_cast<std::size_t>(s.kblocks) * kBlockElements;
  return rest > 0 && rest <= kBlockK / 2 ? whole - kBlockElements / 2 : whole;
}

std::size_t compact_packed_elements(int n, int k) {
  const PackedShape s = packed_shape(n, k);
  const std::size_t panel = compact_panel_elements(k);
  const std::size_t whole = static_cast<std::size_t>(s.kblocks) * kBlockElements;
  return static_cast<std::size_t>(s.panels) * panel + (whole - panel);
}

void compact_packed_panels(const bf16* packed, int n, int k, bf16* compact) {
  const PackedShape s = packed_shape(n, k);
  const std::size_t panel = compact_panel_elements(k);
  const std::size_t whole = static_cast<std::size_t>(s.kblocks) * kBlockElements;
  for (int nb = 0; nb < s.panels; ++nb)
    std::copy_n(packed + static_cast<std::size_t>(nb) * whole, panel, compact + static_cast<std::size_t>(nb) * panel);
  std::fill_n(compact + static_cast<std::size_t>(s.panels) * panel, whole - panel, bf16{0});
}

void pack_bf16_weights(const bf16* w, int n, int k, std::size_t ldw, bf16* packed) {
  check_ld(n, k, ldw, "pack_bf16_weights");
  // Whole blocks (every block of a layer but its last panel's and last k-block's, if ragged) are
  // 16 x 16 transposes of k-pairs: each W row's 64 bytes read in order, each pair stored as one
  // 32-bit word. The element loop, with its bounds tests and 2-byte moves, packed a DeepSeek-V2-Lite
  // layer (1.1 GB) at about 120 MB/s a thread on a Zen 3.
  const PackedShape s = packed_shape(n, k);
  const int whole_panels = n / kPanelColumns, whole_kblocks = k / kBlockK;
  const auto load = [&](int col, int kk) { return w[static_cast<std::size_t>(col) * ldw + kk]; };
  bf16* out = packed;
  for (int nb = 0; nb < s.panels; ++nb) {
    for (int kb = 0; kb < s.kblocks; ++kb, out += kBlockElements) {
      if (nb >= whole_panels || kb >= whole_kblocks) {
        pack_block_with(n, k, nb, kb, out, load);
        continue;
      }
      const bf16* rows = w + static_cast<std::size_t>(nb) * kPanelColumns * ldw + static_cast<std::size_t>(kb) * kBlockK;
      for (int c = 0; c < kPanelColumns; ++c) {
        const bf16* row = rows + static_cast<std::size_t>(c) * ldw;
        for (int r = 0; r < kBlockK / 2; ++r) std::memcpy(out + r * 2 * kPanelColumns + c * 2, row + 2 * r, 2 * sizeof(bf16));
      }
    }
  }
}

void pack_f32_weights_to_bf16(const float* w, int n, int k, std::size_t ldw, bf16* packed) {
  check_ld(n, k, ldw, "pack_f32_weights_to_bf16");
  pack_weights_with(n, k, packed,
            [&](int col, int kk) { return float_to_bf16(w[static_cast<std::size_t>(col) * ldw + kk]); });
}

std::size_t tiled_rows_elements(int m, int k_padded) {
  const std::size_t tiles = static_cast<std::size_t>((std::max(m, 0) + kATileRows - 1) / kATileRows);
  return tiles * kATileRows * static_cast<std::size_t>(std::max(k_padded, 0));
}

void pack_rows_as_tiles(const bf16* a, std::size_t lda, int m, int k_padded, bf16* tiles) {
  const int kblocks = k_padded / kBlockK;
  for (int i = 0; i < m; ++i) {
    const bf16* row = a + static_cast<std::size_t>(i) * lda;
    bf16* dst = tile_row(tiles, k_padded, i, 0);
    for (int kb = 0; kb < kblocks; ++kb) {
      std::memcpy(dst + static_cast<std::size_t>(kb) * kBlockElements, row + static_cast<std::size_t>(kb) * kBlockK,
                  kBlockK * sizeof(bf16));
    }
  }
}

void unpack_tiles_to_rows(const bf16* tiles, int m, int k_padded, bf16* a, std::size_t lda) {
  const int kblocks = k_padded / kBlockK;
  for (int i = 0; i < m; ++i) {
    const bf16* src = tiles + (static_cast<std::size_t>(i / kATileRows) * kblocks * kATileRows + i % kATileRows) * kBlockK;
    bf16* row = a + static_cast<std::size_t>(i) * lda;
    for (int kb = 0; kb < kblocks; ++kb)
      std::memcpy(row + static_cast<std::size_t>(kb) * kBlockK, src + static_cast<std::size_t>(kb) * kBlockElements, kBlockK * sizeof(bf16));
  }
}

void store_row_tile(const bf16* const* src, int count, int n, int k_padded, bf16* tile) {
  for (int k0 = 0; k0 < k_padded; k0 += kBlockK, tile += kBlockElements) {
    const int take = std::clamp(n - k0, 0, kBlockK);
    for (int r = 0; r < count; ++r) {
      bf16* dst = tile + r * kBlockK;
      std::memcpy(dst, src[r] + k0, static_cast<std::size_t>(take) * sizeof(bf16));
      std::fill(dst + take, dst + kBlockK, bf16{0});
    }
  }
}

void unpack_bf16_weights(const bf16* packed, int n, int k, bf16* w, std::size_t ldw) {
  check_ld(n, k, ldw, "unpack_bf16_weights");
  const PackedShape s = packed_shape(n, k);
  for (int col = 0; col < n; ++col) {
    const int nb = col / kPanelColumns, c = col % kPanelColumns;
    for (int kk = 0; kk < k; ++kk) {
      const int kb = kk / kBlockK, r = (kk % kBlockK) / 2, p = kk % 2;
      const std::size_t at = ((static_cast<std::size_t>(nb) * s.kblocks + kb) * 16 + r) * 32 + c * 2 + p;
      w[static_cast<std::size_t>(col) * ldw + kk] = packed[at];
    }
  }
}

}  // namespace tilemoe::kernels
