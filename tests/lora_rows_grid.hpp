#pragma once
// The LoRA-for-few-rows kernels (lora_rows.hpp) of one ISA against a double reference: row, in,
// rank and column tails, f32 and bf16 factors by rows, by columns and with neither stride 1, NaN in the
// slots the kernels must not read, sentinels in the outputs' gaps, NaN propagation.
#include <cmath>
#include <random>
#include <sstream>
#include <vector>

#include "amx/lora_rows.hpp"
#include "catch.hpp"

namespace tilemoe::kernels::test {

enum class FactorLayout { by_rows, by_columns, strided };

// An R × C factor in one layout, stored as f32 or bf16; every slot outside the matrix holds NaN.
struct Factor {
  std::vector<float> data;
  std::vector<bf16> data16;
  StridedFactor view;
  Factor(std::mt19937& rng, int r, int c, FactorLayout layout, FactorElement element) {
    std::size_t rs = 0, cs = 0;
    switch (layout) {
      case FactorLayout::by_rows: rs = c + 3, cs = 1; break;
      case FactorLayout::by_columns: rs = 1, cs = r + 2; break;
      case FactorLayout::strided: rs = 2, cs = 2 * static_cast<std::size_t>(r) + 1; break;
    }
    data.assign((r - 1) * rs + (c - 1) * cs + 1, NAN);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (int i = 0; i < r; ++i)
      for (int j = 0; j < c; ++j) data[i * rs + j * cs] = uniform(rng);
    if (element == FactorElement::f32) {
      view = {data.data(), rs, cs};
      return;
    }
    data16.resize(data.size());
    for (std::size_t i = 0; i < data.size(); ++i) data16[i] = float_to_bf16(data[i]);
    view = {data16.data(), rs, cs};
  }
};

inline const char* element_name(FactorElement e) { return e == FactorElement::bf16 ? "bf16" : "f32"; }

inline const char* layout_name(FactorLayout l) {
  return l == FactorLayout::by_rows ? "by rows" : l == FactorLayout::by_columns ? "by columns" : "strided";
}

inline constexpr float kLoraSentinel = -777.0f;

inline void check_project_case(LoraProjectRowsFn fn, int rows, int in, int rank, FactorLayout layout, FactorElement element,
                               std::mt19937& rng) {
  INFO("project rows=" << rows << " in=" << in << " rank=" << rank << " A " << layout_name(layout) << " " << element_name(element));
  const std::size_t ldv = in + 5, ldxa = rank + 3;
  std::vector<bf16> v(rows * ldv);
  for (std::size_t e = 0; e < v.size(); ++e)
    v[e] = e % ldv < static_cast<std::size_t>(in) ? float_to_bf16(std::uniform_real_distribution<float>(-1, 1)(rng)) : bf16{0x7fc0};
  Factor a(rng, rank, in, layout, element);
  const float scale = 0.75f;
  std::vector<float> xa(rows * ldxa, kLoraSentinel);
  fn(v.data(), ldv, rows, in, a.view, rank, scale, xa.data(), ldxa);
  std::ostringstream error;
  for (int i = 0; i < rows && error.tellp() == 0; ++i)
    for (std::size_t j = 0; j < ldxa && error.tellp() == 0; ++j) {
      const float got = xa[i * ldxa + j];
      if (j >= static_cast<std::size_t>(rank)) {
        if (got != kLoraSentinel) error << "xa[" << i << "][" << j << "] is a gap but was written: " << got;
        continue;
      }
      double sum = 0, mag = 0;
      for (int k = 0; k < in; ++k) {
        const double t = double(bf16_to_float(v[i * ldv + k])) * a.view.at(static_cast<int>(j), k);
        sum += t, mag += std::fabs(t);
      }
      if (!(std::fabs(got - scale * sum) <= 1e-5 * scale * mag + 1e-30)) error << "xa[" << i << "][" << j << "] = " << got << ", reference " << scale * sum;
    }
  INFO(error.str());
  REQUIRE(error.tellp() == 0);
}

inline void check_expand_case(LoraExpandRowsAddFn fn, int rows, int rank, int col0, int n, FactorLayout layout, FactorElement element,
                              std::mt19937& rng) {
  INFO("expand rows=" << rows << " rank=" << rank << " col0=" << col0 << " n=" << n << " B " << layout_name(layout) << " "
                      << element_name(element));
  const std::size_t ldxa = rank + 1, ldc = n + 4;
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> xa(rows * ldxa);
  for (std::size_t e = 0; e < xa.size(); ++e) xa[e] = e % ldxa < static_cast<std::size_t>(rank) ? uniform(rng) : NAN;
  Factor b(rng, col0 + n + 2, rank, layout, element);
  std::vector<float> c(rows * ldc), c0;
  for (std::size_t e = 0; e < c.size(); ++e) c[e] = e % ldc < static_cast<std::size_t>(n) ? uniform(rng) : kLoraSentinel;
  c0 = c;
  fn(xa.data(), ldxa, rows, rank, b.view, col0, n, c.data(), ldc);
  std::ostringstream error;
  for (int i = 0; i < rows && error.tellp() == 0; ++i)
    for (std::size_t j = 0; j < ldc && error.tellp() == 0; ++j) {
      const float got = c[i * ldc + j];
      if (j >= static_cast<std::size_t>(n)) {
        if (got != kLoraSentinel) error << "c[" << i << "][" << j << "] is a gap but was written: " << got;
        continue;
      }
      double sum = c0[i * ldc + j], mag = std::fabs(sum);
      for (int q = 0; q < rank; ++q) {
        const double t = double(xa[i * ldxa + q]) * b.view.at(col0 + static_cast<int>(j), q);
        sum += t, mag += std::fabs(t);
      }
      if (!(std::fabs(got - sum) <= 1e-5 * mag)) error << "c[" << i << "][" << j << "] = " << got << ", reference " << sum;
    }
  INFO(error.str());
  REQUIRE(error.tellp() == 0);
}

// NaN in one element of v poisons that row of xa only; in one xa element, that row of c only.
inline void check_lora_rows_nan(LoraProjectRowsFn project, LoraExpandRowsAddFn expand) {
  std::mt19937 rng(3);
  for (FactorElement element : {FactorElement::f32, FactorElement::bf16})
    for (FactorLayout layout : {FactorLayout::by_rows, FactorLayout::by_columns, FactorLayout::strided}) {
      INFO("layout " << layout_name(layout) << " " << element_name(element));
      const int rows = 5, in = 37, rank = 9, n = 21;
      std::vector<bf16> v(rows * in, float_to_bf16(0.5f));
      v[2 * in + 30] = bf16{0x7fc0};
      Factor a(rng, rank, in, layout, element), b(rng, n, rank, layout, element);
      std::vector<float> xa(rows * rank);
      project(v.data(), in, rows, in, a.view, rank, 1.0f, xa.data(), rank);
      for (int i = 0; i < rows; ++i)
        for (int q = 0; q < rank; ++q) CHECK(std::isnan(xa[i * rank + q]) == (i == 2));
      std::vector<float> c(rows * n, 1.0f);
      expand(xa.data(), rank, rows, rank, b.view, 0, n, c.data(), n);
      for (int i = 0; i < rows; ++i)
        for (int j = 0; j < n; ++j) CHECK(std::isnan(c[i * n + j]) == (i == 2));
    }
}

inline void check_lora_rows(LoraProjectRowsFn project, LoraExpandRowsAddFn expand) {
  std::mt19937 rng(71);
  for (FactorElement element : {FactorElement::f32, FactorElement::bf16})
    for (FactorLayout layout : {FactorLayout::by_rows, FactorLayout::by_columns, FactorLayout::strided})
      for (int rows : {1, 2, 3, 4, 5, 7, 12, 17})
        for (int rank : {1, 5, 16, 17, 33, 64, 70}) {
          for (int in : {1, 15, 16, 17, 100, 130}) check_project_case(project, rows, in, rank, layout, element, rng);
          for (auto [col0, n] : {std::pair{0, 1}, {0, 16}, {3, 17}, {16, 40}, {5, 128}})
            check_expand_case(expand, rows, rank, col0, n, layout, element, rng);
        }
  check_lora_rows_nan(project, expand);
}

}  // namespace tilemoe::kernels::test
