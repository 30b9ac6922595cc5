#pragma once
// The one packed weight layout that the AMX, AVX512-BF16 and portable GEMM kernels all read.
//
// For W[N][K] (Y = X·Wᵀ; N outputs, K reduction), N is padded with zero rows to a multiple of
// 16 (a panel: 16 output columns) and K with zeros to a multiple of 32 (a k-block). Each
// (panel nb, k-block kb) block is 16 rows × 32 bf16 = 1 KiB in VNNI order:
//
//   packed[((nb*kblocks + kb)*16 + r)*32 + c*2 + p] = W[nb*16 + c][kb*32 + 2*r + p]
//   (r: k-pair 0..15, c: column 0..15, p: 0..1)
//
// so a block is exactly one AMX B tile (16 rows of 64 bytes) and one of its rows is one zmm for
// _mm512_dpbf16_ps. A panel's k-blocks are contiguous so a panel streams in order along K.
#include <cstddef>

#include "tilemoe/bf16.hpp"

namespace tilemoe::kernels {

inline constexpr int kPanelColumns = 16;
inline constexpr int kBlockK = 32;
inline constexpr int kBlockElements = kPanelColumns * kBlockK;  // 512 bf16 = 1 KiB

struct PackedShape {
  int n, k, n_padded, k_padded, panels, kblocks;
};

PackedShape packed_shape(int n, int k);  // throws Error(invalid_argument) for negative sizes
std::size_t packed_bf16_elements(int n, int k);  // n_padded * k_padded

// `packed` must hold packed_bf16_elements(n, k) elements; every one of them is written.
void pack_bf16_weights(const bf16* w, int n, int k, std::size_t ldw, bf16* packed);
// Rounds to nearest even (tilemoe::float_to_bf16).
void pack_f32_weights_to_bf16(const float* w, int n, int k, std::size_t ldw, bf16* packed);
// The inverse of pack_bf16_weights (padding dropped), for tests and debugging.
void unpack_bf16_weights(const bf16* packed, int n, int k, bf16* w, std::size_t ldw);

// Packs W[n][k] given element by element: `load(col, kk)` returns W[col][kk] as bf16 and is
// called only inside the unpadded matrix. For factors read in another orientation or pieced
// together from several arrays (the LoRA terms of the backward). Walks the packed layout in
// storage order, so writes are sequential.
template <typename Load>
void pack_weights_with(int n, int k, bf16* packed, Load load) {
  const PackedShape s = packed_shape(n, k);
  bf16* out = packed;
  for (int nb = 0; nb < s.panels; ++nb) {
    for (int kb = 0; kb < s.kblocks; ++kb) {
      for (int r = 0; r < kBlockK / 2; ++r) {
        const int kk = kb * kBlockK + 2 * r;
        for (int c = 0; c < kPanelColumns; ++c) {
          const int col = nb * kPanelColumns + c;
          const bool in_n = col < n;
          *out++ = (in_n && kk < k) ? load(col, kk) : bf16{0};
          *out++ = (in_n && kk + 1 < k) ? load(col, kk + 1) : bf16{0};
        }
      }
    }
  }
}

}  // namespace tilemoe::kernels
