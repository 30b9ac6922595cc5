// Baseline x86-64 file (no ISA flags): the model must run where the tile unit does not exist.
#include "amx/tile_emulation.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tilemoe::kernels::tile_emulation {
namespace {

// The layout of LDTILECFG's 64-byte operand (palette 1).
constexpr int kColsbOffset = 16;  // 16 little-endian uint16, tiles 0..15
constexpr int kRowsOffset = 48;   // 16 uint8, tiles 0..15

struct TileUnit {
  bool configured = false;
  std::uint8_t config[64] = {};
  int rows[kTiles] = {};
  int colsb[kTiles] = {};
  alignas(64) std::uint8_t data[kTiles][kMaxRows][kMaxRowBytes] = {};
};

thread_local TileUnit unit;
thread_local TileCounts tally;

[[noreturn]] void fault(const std::string& what) {
  std::fprintf(stderr, "tilemoe tile emulation: %s (the AMX instruction would fault here)\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

std::string tile_name(int t) { return "tmm" + std::to_string(t); }

void check_index(int t, const char* op) {
  if (t < 0 || t >= kTiles) fault(std::string(op) + ": tile number " + std::to_string(t) + " is not 0-7");
}

// #UD cases shared by every tile instruction: no configuration, or an unconfigured tile.
void check_usable(int t, const char* op) {
  check_index(t, op);
  if (!unit.configured) fault(std::string(op) + " " + tile_name(t) + " before LDTILECFG loaded a palette");
  if (unit.rows[t] == 0 || unit.colsb[t] == 0) {
    fault(std::string(op) + " " + tile_name(t) + ": the tile is not configured (rows " + std::to_string(unit.rows[t]) +
          ", bytes per row " + std::to_string(unit.colsb[t]) + ")");
  }
}

std::uint16_t read_u16(const std::uint8_t* p) { return static_cast<std::uint16_t>(p[0] | (p[1] << 8)); }

float bf16_as_f32_daz(std::uint16_t v) {
  if ((v & 0x7f80u) == 0) v &= 0x8000u;  // denormal (or zero) input reads as a signed zero
  std::uint32_t bits = static_cast<std::uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

float flush_denormal(float f) {
  if (std::fpclassify(f) == FP_SUBNORMAL) return std::signbit(f) ? -0.0f : 0.0f;
  return f;
}

void zero_outside(int t) {
  for (int r = 0; r < kMaxRows; ++r) {
    const int keep = r < unit.rows[t] ? unit.colsb[t] : 0;
    std::memset(unit.data[t][r] + keep, 0, static_cast<std::size_t>(kMaxRowBytes - keep));
  }
}

// The shape rules of TDPBF16PS / TDPBSSD (SDM: #UD when they do not hold).
void check_product(int c, int a, int b, const char* op) {
  check_usable(c, op);
  check_usable(a, op);
  check_usable(b, op);
  if (c == a || c == b || a == b) fault(std::string(op) + ": operands " + tile_name(c) + ", " + tile_name(a) + ", " +
                                        tile_name(b) + " are not three different tiles");
  auto shape = [](int t) { return tile_name(t) + " " + std::to_string(unit.rows[t]) + "x" + std::to_string(unit.colsb[t]) + "B"; };
  const bool ok = unit.colsb[c] % 4 == 0 && unit.colsb[a] % 4 == 0 && unit.rows[c] == unit.rows[a] &&
                  unit.colsb[a] / 4 == unit.rows[b] && unit.colsb[c] == unit.colsb[b];
  if (!ok) fault(std::string(op) + ": shapes do not multiply: C " + shape(c) + ", A " + shape(a) + ", B " + shape(b));
}

}  // namespace

std::string config_error(const void* config) {
  const auto* cfg = static_cast<const std::uint8_t*>(config);
  const int palette = cfg[0];
  if (palette == 0) return {};
  if (palette != 1) return "palette " + std::to_string(palette) + " is not supported (only 0 and 1 exist)";
  for (int i = 2; i < kColsbOffset; ++i) {
    if (cfg[i] != 0) return "reserved byte " + std::to_string(i) + " is not zero";
  }
  for (int t = 0; t < 16; ++t) {
    const int colsb = read_u16(cfg + kColsbOffset + 2 * t), rows = cfg[kRowsOffset + t];
    if (t >= kTiles) {
      if (colsb != 0 || rows != 0) return "tile " + std::to_string(t) + " is configured but palette 1 has 8 tiles";
      continue;
    }
    if (rows > kMaxRows) return tile_name(t) + " has " + std::to_string(rows) + " rows (at most 16)";
    if (colsb > kMaxRowBytes) return tile_name(t) + " has " + std::to_string(colsb) + " bytes per row (at most 64)";
    if ((rows == 0) != (colsb == 0)) return tile_name(t) + " has rows or bytes per row zero but not both";
  }
  return {};
}

void load_config(const void* config) {
  std::string error = config_error(config);
  if (!error.empty()) fault("LDTILECFG: " + error);
  const auto* cfg = static_cast<const std::uint8_t*>(config);
  if (cfg[0] == 0) {
    release();
    return;
  }
  unit.configured = true;
  ++tally.configs;
  std::memcpy(unit.config, cfg, sizeof unit.config);
  unit.config[1] = 0;  // start_row is the restart point of an interrupted load: none is pending
  for (int t = 0; t < kTiles; ++t) {
    unit.rows[t] = cfg[kRowsOffset + t];
    unit.colsb[t] = read_u16(cfg + kColsbOffset + 2 * t);
  }
  std::memset(unit.data, 0, sizeof unit.data);
}

void store_config(void* config) {
  if (unit.configured) {
    std::memcpy(config, unit.config, sizeof unit.config);
  } else {
    std::memset(config, 0, sizeof unit.config);
  }
}

void release() { unit = TileUnit{}; }

void load(int t, const void* base, long stride) {
  check_usable(t, "TILELOADD");
  ++tally.loads[t];
  tally.load_bytes += static_cast<std::uint64_t>(unit.rows[t] * unit.colsb[t]);
  const auto* src = static_cast<const std::uint8_t*>(base);
  for (int r = 0; r < unit.rows[t]; ++r) std::memcpy(unit.data[t][r], src + r * stride, static_cast<std::size_t>(unit.colsb[t]));
  zero_outside(t);
}

void store(int t, void* base, long stride) {
  check_usable(t, "TILESTORED");
  ++tally.stores[t];
  tally.store_bytes += static_cast<std::uint64_t>(unit.rows[t] * unit.colsb[t]);
  auto* dst = static_cast<std::uint8_t*>(base);
  for (int r = 0; r < unit.rows[t]; ++r) std::memcpy(dst + r * stride, unit.data[t][r], static_cast<std::size_t>(unit.colsb[t]));
}

void zero(int t) {
  check_usable(t, "TILEZERO");
  ++tally.zeros[t];
  std::memset(unit.data[t], 0, sizeof unit.data[t]);
}

void dot_bf16(int c, int a, int b) {
  check_product(c, a, b, "TDPBF16PS");
  ++tally.dots;
  const int pairs = unit.colsb[a] / 4, columns = unit.colsb[c] / 4;
  for (int m = 0; m < unit.rows[c]; ++m) {
    float acc[kMaxRowBytes / 4];
    std::memcpy(acc, unit.data[c][m], sizeof acc);
    for (int k = 0; k < pairs; ++k) {
      const float a0 = bf16_as_f32_daz(read_u16(unit.data[a][m] + 4 * k));
      const float a1 = bf16_as_f32_daz(read_u16(unit.data[a][m] + 4 * k + 2));
      for (int n = 0; n < columns; ++n) {
        // A bf16 x bf16 product is exact in f32, so only the two additions round.
        acc[n] = flush_denormal(acc[n] + a0 * bf16_as_f32_daz(read_u16(unit.data[b][k] + 4 * n)));
        acc[n] = flush_denormal(acc[n] + a1 * bf16_as_f32_daz(read_u16(unit.data[b][k] + 4 * n + 2)));
      }
    }
    std::memcpy(unit.data[c][m], acc, static_cast<std::size_t>(unit.colsb[c]));
  }
  zero_outside(c);
}

void dot_s8(int c, int a, int b) {
  check_product(c, a, b, "TDPBSSD");
  ++tally.dots;
  const int quads = unit.colsb[a] / 4, columns = unit.colsb[c] / 4;
  for (int m = 0; m < unit.rows[c]; ++m) {
    std::uint32_t acc[kMaxRowBytes / 4];  // unsigned: the hardware's int32 sums wrap
    std::memcpy(acc, unit.data[c][m], sizeof acc);
    for (int k = 0; k < quads; ++k) {
      for (int n = 0; n < columns; ++n) {
        std::int32_t sum = 0;
        for (int i = 0; i < 4; ++i) {
          sum += static_cast<std::int8_t>(unit.data[a][m][4 * k + i]) * static_cast<std::int8_t>(unit.data[b][k][4 * n + i]);
        }
        acc[n] += static_cast<std::uint32_t>(sum);
      }
    }
    std::memcpy(unit.data[c][m], acc, static_cast<std::size_t>(unit.colsb[c]));
  }
  zero_outside(c);
}

const std::uint8_t* tile_bytes(int t) {
  check_index(t, "tile_bytes");
  return &unit.data[t][0][0];
}

TileCounts counts() { return tally; }

void reset_counts() { tally = TileCounts{}; }

}  // namespace tilemoe::kernels::tile_emulation
