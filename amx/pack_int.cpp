#include "amx/pack_int.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "amx/isa.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::kernels {

PackedIntShape packed_int_shape(int bits, int n, int k, int group) {
  if (n < 0 || k < 0) fail(ErrorKind::invalid_argument, "packed_int_shape: negative size");
  if (bits != 8 && bits != 4) fail(ErrorKind::invalid_argument, "packed_int_shape: bits " + std::to_string(bits) + " is not 8 or 4");
  if (bits == 4 && group != 32 && group != 64 && group != 128)
    fail(ErrorKind::invalid_argument, "packed_int_shape: int4 group " + std::to_string(group) + " is not 32, 64 or 128");
  // The kernels sum all of K in int32 (int8; int4 in column form: code times group multiple):
  // at most 127 * 127 (int8) or 8 * 16 * 127 (int4) a k, so K up to 2^17 cannot overflow.
  if (k > kIntMaxK)
    fail(ErrorKind::invalid_argument, "packed_int_shape: an input size of " + std::to_string(k) + " is over " + std::to_string(kIntMaxK) +
                                          ", past which the kernels' int32 sums could overflow");
  PackedIntShape s;
  s.bits = bits;
  s.n = n;
  s.k = k;
  s.panels = (n + 15) / 16;
  s.kblocks = (k + kIntBlockK - 1) / kIntBlockK;
  s.n_padded = s.panels * 16;
  s.k_padded = s.kblocks * kIntBlockK;
  s.group = bits == 8 ? std::max(s.k_padded, kIntBlockK) : group;
  s.groups = bits == 8 ? 1 : (s.k_padded + group - 1) / group;
  return s;
}

namespace {

int source_code(const PackedIntShape& s, const std::int8_t* q, std::size_t ld, int col, int kk) {
  if (col >= s.n || kk >= s.k) return 0;
  const std::int8_t* row = q + ld * static_cast<std::size_t>(col);
  if (s.bits == 8) return row[kk];
  const auto byte = static_cast<std::uint8_t>(row[kk / 2]);
  const int nibble = (kk & 1) ? (byte >> 4) : (byte & 0x0f);
  return nibble >= 8 ? nibble - 16 : nibble;
}

std::size_t code_offset(const PackedIntShape& s, int col, int kk, int* shift) {
  const int nb = col / 16, c = col % 16, kb = kk / kIntBlockK, r = (kk % kIntBlockK) / 4, p = kk % 4;
  const std::size_t block = (static_cast<std::size_t>(nb) * s.kblocks + kb) * s.block_bytes();
  if (s.bits == 8) {
    *shift = 0;
    return block + static_cast<std::size_t>(r) * 64 + c * 4 + p;
  }
  *shift = (r & 1) ? 4 : 0;
  return block + static_cast<std::size_t>(r / 2) * 64 + c * 4 + p;
}

}  // namespace

void pack_int_scales(const PackedIntShape& s, const float* row_scales, float* scales) {
  const int source_groups = s.bits == 8 ? 1 : (s.k + s.group - 1) / s.group;
  for (int col = 0; col < s.n_padded; ++col) {
    const int nb = col / 16, c = col % 16;
    for (int g = 0; g < s.groups; ++g)
      scales[(static_cast<std::size_t>(nb) * s.groups + g) * 16 + c] =
          (col < s.n && g < source_groups) ? row_scales[static_cast<std::size_t>(col) * source_groups + g] : 0.0f;
  }
}

void pack_int_weights_portable(const PackedIntShape& s, const std::int8_t* q, std::size_t ld, const float* row_scales,
                               std::uint8_t* codes, float* scales, std::int32_t* colsums) {
  pack_int_scales(s, row_scales, scales);
  std::fill(codes, codes + s.code_bytes(), std::uint8_t{0});
  std::fill(colsums, colsums + s.scale_count(), 0);
  for (int col = 0; col < s.n_padded; ++col) {
    const int nb = col / 16, c = col % 16;
    for (int kk = 0; kk < s.k_padded; ++kk) {
      const int code = source_code(s, q, ld, col, kk);
      int shift = 0;
      const std::size_t off = code_offset(s, col, kk, &shift);
      if (s.bits == 8) {
        codes[off] = static_cast<std::uint8_t>(static_cast<std::int8_t>(code));
      } else {
        codes[off] |= static_cast<std::uint8_t>((code + 8) << shift);
      }
      colsums[(static_cast<std::size_t>(nb) * s.groups + kk / s.group) * 16 + c] += code;
    }
  }
}

void pack_int_weights(const PackedIntShape& s, const std::int8_t* q, std::size_t ld, const float* row_scales, std::uint8_t* codes,
                      float* scales, std::int32_t* colsums) {
  if (isa_available(Isa::avx512_bf16)) return pack_int_weights_avx512(s, q, ld, row_scales, codes, scales, colsums);
  pack_int_weights_portable(s, q, ld, row_scales, codes, scales, colsums);
}

bool decompose_int4_scales(const PackedIntShape& s, const float* scales, float* column_scales, std::uint8_t* group_multiples) {
  if (s.bits != 4) return false;
  for (int col = 0; col < s.n_padded; ++col) {
    const int nb = col / 16, c = col % 16;
    auto at = [&](int g) { return (static_cast<std::size_t>(nb) * s.groups + g) * 16 + c; };
    float top = 0.0f;
    for (int g = 0; g < s.groups; ++g) {
      const float v = scales[at(g)];
      if (!(std::isfinite(v) && v >= 0.0f)) return false;  // NaN fails this test too
      top = std::max(top, v);
    }
    column_scales[static_cast<std::size_t>(nb) * 16 + c] = 0.0f;
    if (top == 0.0f) {
      for (int g = 0; g < s.groups; ++g) group_multiples[at(g)] = 0;
      continue;
    }
    // The largest group is some multiple of the column scale: try them from the finest down.
    bool found = false;
    for (int top_multiple = kInt4MaxGroupMultiple; top_multiple >= 1 && !found; --top_multiple) {
      const float unit = top / static_cast<float>(top_multiple);
      if (!(unit > 0.0f) || !std::isnormal(unit)) break;
      found = true;
      for (int g = 0; g < s.groups && found; ++g) {
        const float ratio = scales[at(g)] / unit;
        const float m = std::nearbyint(ratio);
        found = m >= 0.0f && m <= static_cast<float>(kInt4MaxGroupMultiple) && std::fabs(ratio - m) <= 1e-5f * std::max(m, 1.0f);
        if (found) group_multiples[at(g)] = static_cast<std::uint8_t>(m);
      }
      if (found) column_scales[static_cast<std::size_t>(nb) * 16 + c] = unit;
    }
    if (!found) return false;
  }
  return true;
}

int packed_int_code(const PackedIntShape& s, const std::uint8_t* codes, int col, int kk) {
  int shift = 0;
  const std::size_t off = code_offset(s, col, kk, &shift);
  if (s.bits == 8) return static_cast<std::int8_t>(codes[off]);
  return ((codes[off] >> shift) & 0x0f) - 8;
}

std::size_t int8_tiled_rows_bytes(int m, int k_padded) {
  const std::size_t tiles = static_cast<std::size_t>((std::max(m, 0) + kIntATileRows - 1) / kIntATileRows);
  return tiles * kIntATileRows * static_cast<std::size_t>(std::max(k_padded, 0));
}

void pack_int8_rows_as_tiles(const std::int8_t* a, std::size_t lda, int m, int k_padded, std::int8_t* tiles, int row0) {
  for (int i = 0; i < m; ++i)
    for (int kb = 0; kb < k_padded / kIntBlockK; ++kb)
      std::memcpy(int8_tile_row(tiles, k_padded, row0 + i, kb), a + static_cast<std::size_t>(i) * lda + static_cast<std::size_t>(kb) * kIntBlockK,
                  kIntBlockK);
}

void unpack_int8_tiles_to_rows(const std::int8_t* tiles, int m, int k_padded, std::int8_t* a, std::size_t lda) {
  std::int8_t* t = const_cast<std::int8_t*>(tiles);  // int8_tile_row only computes an address
  for (int i = 0; i < m; ++i)
    for (int kb = 0; kb < k_padded / kIntBlockK; ++kb)
      std::memcpy(a + static_cast<std::size_t>(i) * lda + static_cast<std::size_t>(kb) * kIntBlockK, int8_tile_row(t, k_padded, i, kb),
                  kIntBlockK);
}

}  // namespace tilemoe::kernels
