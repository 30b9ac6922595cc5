#pragma once
// Sums of outer products over rows: the shape of the LoRA weight gradients. With v bf16
// [rows][n] (row stride ldv; or, given v_rows, row i at v + v_rows[i] * ldv: rows read in place
// from a matrix they were gathered from, e.g. a token's x for each expert it went to) and u f32
// [rows][rank] (row stride ldu), for q < rank and o < n:
//
//   rank_major:  g[q][o] += sum_i u[i][q] * v[i][o]   (g: [rank][n], row stride ldg), e.g. dA = dPᵀ X
//   otherwise:   g[o][q] += sum_i v[i][o] * u[i][q]   (g: [n][rank], row stride ldg), e.g. dB = dYᵀ XA
//
// The sum over rows is accumulated in f32 and then added to g, or with `overwrite` stored in g
// (g is then not read: a trainer that does not accumulate gradients saves a pass zeroing them and
// the read of the zeros). g is f32 or bf16 (a trainer's bf16 parameters have bf16 gradients):
// bf16 is rounded as float_to_bf16 once per element, after the add in f32. Nothing outside the
// [rank][n] or [n][rank] block of g is written, and nothing past row rows-1 / column n-1 / rank-1
// of v (its rows named by v_rows) and u is read. NaN and infinity in v or u propagate (no zero skipping). rows, n or rank of
// 0 leave g as it is, in both modes. Pure: no allocation, no threads.
#include <cstddef>

#include "amx/strided_factor.hpp"
#include "tilemoe/bf16.hpp"

namespace tilemoe::kernels {

// Where a gradient block goes: element i of an f32 or a bf16 array (strides are the callers').
struct GradTarget {
  void* data = nullptr;
  FactorElement element = FactorElement::f32;

  GradTarget() = default;
  GradTarget(float* p) : data(p), element(FactorElement::f32) {}  // NOLINT: a float array is the common target
  GradTarget(bf16* p) : data(p), element(FactorElement::bf16) {}   // NOLINT
  bool is_bf16() const { return element == FactorElement::bf16; }
  float* f32() const { return static_cast<float*>(data); }
  bf16* bf16s() const { return static_cast<bf16*>(data); }
  GradTarget offset(std::size_t i) const {
    GradTarget t = *this;
    t.data = static_cast<char*>(data) + i * (is_bf16() ? sizeof(bf16) : sizeof(float));
    return t;
  }
};

using LoraGradOuterFn = void (*)(const bf16* v, std::size_t ldv, const int* v_rows, const float* u, std::size_t ldu, int rows, int n,
                                 int rank, GradTarget g, std::size_t ldg, bool rank_major, bool overwrite);

void lora_grad_outer_portable(const bf16* v, std::size_t ldv, const int* v_rows, const float* u, std::size_t ldu, int rows, int n,
                              int rank, GradTarget g, std::size_t ldg, bool rank_major, bool overwrite);
// The portable kernel compiled for AVX2 + FMA + F16C; only where isa_available(Isa::avx2).
void lora_grad_outer_avx2(const bf16* v, std::size_t ldv, const int* v_rows, const float* u, std::size_t ldu, int rows, int n,
                          int rank, GradTarget g, std::size_t ldg, bool rank_major, bool overwrite);
// Only where isa_available(Isa::avx512_bf16) (it needs AVX512-F/BW/VL).
void lora_grad_outer_avx512(const bf16* v, std::size_t ldv, const int* v_rows, const float* u, std::size_t ldu, int rows, int n,
                            int rank, GradTarget g, std::size_t ldg, bool rank_major, bool overwrite);
// On AMX tiles, with u split into three bf16 parts so that the sums keep f32's precision; any row
// count. Only where tile_instructions_usable().
void lora_grad_outer_amx_tiles(const bf16* v, std::size_t ldv, const int* v_rows, const float* u, std::size_t ldu, int rows, int n,
                               int rank, GradTarget g, std::size_t ldg, bool rank_major, bool overwrite);
// The AMX table's entry: the tiles from 64 rows, the AVX-512 kernel below (lora_grad_amx.cpp says why).
void lora_grad_outer_amx(const bf16* v, std::size_t ldv, const int* v_rows, const float* u, std::size_t ldu, int rows, int n,
                         int rank, GradTarget g, std::size_t ldg, bool rank_major, bool overwrite);

}  // namespace tilemoe::kernels
