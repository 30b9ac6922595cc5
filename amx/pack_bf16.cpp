#include "amx/pack_bf16.hpp"

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

void pack_bf16_weights(const bf16* w, int n, int k, std::size_t ldw, bf16* packed) {
  check_ld(n, k, ldw, "pack_bf16_weights");
  pack_weights_with(n, k, packed, [&](int col, int kk) { return w[static_cast<std::size_t>(col) * ldw + kk]; });
}

void pack_f32_weights_to_bf16(const float* w, int n, int k, std::size_t ldw, bf16* packed) {
  check_ld(n, k, ldw, "pack_f32_weights_to_bf16");
  pack_weights_with(n, k, packed,
            [&](int col, int kk) { return float_to_bf16(w[static_cast<std::size_t>(col) * ldw + kk]); });
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
