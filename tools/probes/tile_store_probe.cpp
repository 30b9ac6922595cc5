// tilemoe_tile_store_probe: what a C tile store costs the tile products around it, at 4096 tokens'
// shape (384 rows an expert: 12 row blocks of 32 over a 512 KiB panel group, K = 2048). One
// thread, pinned to one CPU; stand-alone, as tile_stream_probe.cpp, so that an order can be timed
// in seconds, while the bench decides what the kernels keep.
//
// On the repository's AMX machine (2 vCPUs, KVM), median T(FL)OP/s of one thread, session 61 and
// session 62 (the machine slower that day):
//
//   variant        int8         bf16
//   products       6.79  6.43   2.92  2.64   (the products alone: about the peak)
//   l2             3.09  2.75   1.71  1.31   (the kernels' order)
//   l2-nostore     4.29  3.76   1.88  1.49
//   l1             5.62  4.86   2.36  2.16   (with its stores)
//   l2-cold-c      2.67  2.43   1.46  1.21
//   l2-b-dt1             2.82         1.36
//   kparts8        3.79  3.39   1.59  1.23
//   kparts16             3.04         1.18
//   kparts8-dt1          3.20         1.32
//   kparts16-dt1         3.71         1.47
//   bparts16-dt1         3.60         1.16
//
// Session 68 (same machine; l2 3.12-3.13 int8 and 1.47-1.56 bf16 in those runs): l2-skew1 3.20-3.35
// and 1.50-1.61, l2-skew2 3.36-3.37 and 1.53-1.62, l2-skew4 3.37-3.44 and 1.57-1.58, l2-nostore
// 4.23-4.24 and 1.80-1.81. A store beside products on other tiles costs less than one that the
// next products wait behind: the skews win back about a quarter of int8's store cost here. Not on
// the device (an Emerald Rapids vCPU whose products alone ran 2.33 int8 / 0.98 bf16): l2 1.12 /
// 0.56, l2-nostore 1.13 / 0.57, the skews 0.81-1.04 / 0.55-0.56; there the stores cost nothing and
// the products' rate is the limit. The int8 kernel skewed that way was no faster here either
// (docs/perf.md, session 68).
//
// A C tile store after loads from L2 costs the products far more than its own bytes (int8, a
// store every 32 k-steps: 28 %; bf16, every 64: 9 %); after loads from L1, or in a loop without
// loads, it costs little; into lines that are not cached, more. Parts of K that keep A's part in
// L1 win back part of it, most with parts of 16 k-blocks whose B is loaded by TILELOADDT1 (then B's
// lines do not push A's 32 KiB part out of L1; without the hint parts of 16 gain nothing). What a
// kernel keeps is the bench's to say: in the kernels, parts of 16 with TILELOADDT1 made one expert's
// product 6-15 % faster here but the bench at 4096 tokens no faster beyond its noise (docs/perf.md,
// session 62).
//
// Usage: tilemoe_tile_store_probe [--cpu N] [--weights int8|bf16] [--rounds R]
#include <immintrin.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "amx/isa.hpp"
#include "amx/tile_block.hpp"
#include "amx/tile_config.hpp"

namespace {

constexpr std::size_t kBlockBytes = 1024;  // one tile: 16 rows of 64 bytes
constexpr int kRowBlocks = 12;             // 384 rows
constexpr int kPairs = 8;                  // a 512 KiB group of int8 panels at K = 2048
constexpr std::size_t kColdBytes = std::size_t{64} << 20;

using tilemoe::kernels::TileProduct;

// products: tile products alone; rows: row blocks outside, pairs inside, whole K (the kernels'
// order); a_parts: row blocks outside, then parts of K, then pairs (A's part reused from L1 by
// the pairs); b_parts: pairs outside, then parts of K, then row blocks (B's part reused from L1
// by the row blocks). Parts go through an int32 accumulator of C tiles.
enum class Order { products, rows, a_parts, b_parts, rows_skewed };
enum class Operands { l2, l1_window };
enum class CStore { hot, none, cold };
struct Variant {
  const char* name;
  Order order;
  Operands operands;
  CStore c;
  int part;  // k-blocks a part (a_parts, b_parts)
  bool a_dt1, b_dt1;  // loaded by TILELOADDT1, the hint that the data is not used again soon
  const char* what;
};
const Variant kVariants[] = {
    {"products", Order::products, Operands::l2, CStore::hot, 0, false, false, "the 2x2 block's products alone, no loads, C stored every block"},
    {"l2", Order::rows, Operands::l2, CStore::hot, 0, false, false, "the kernels' order: A and B from L2, C stored into a hot 4 KiB after each block"},
    {"l2-skew1", Order::rows_skewed, Operands::l2, CStore::hot, 1, false, false, "l2, row tile 0's C stored beside row tile 1's last products, row tile 1's beside the next block's first row-0 k-step"},
    {"l2-skew2", Order::rows_skewed, Operands::l2, CStore::hot, 2, false, false, "l2-skew1 with the next block's first 2 row-0 k-steps before row tile 1's stores"},
    {"l2-skew4", Order::rows_skewed, Operands::l2, CStore::hot, 4, false, false, "the same with 4"},
    {"l2-nostore", Order::rows, Operands::l2, CStore::none, 0, false, false, "l2 without the C stores (timing only)"},
    {"l1", Order::rows, Operands::l1_window, CStore::hot, 0, false, false, "l2's loop over a 4 KiB window of A and of B (L1), C stored"},
    {"l2-cold-c", Order::rows, Operands::l2, CStore::cold, 0, false, false, "l2 with C stored into rows 1 KiB apart in 64 MiB (not cached)"},
    {"l2-b-dt1", Order::rows, Operands::l2, CStore::hot, 0, false, true, "l2 with B by TILELOADDT1"},
    {"kparts8", Order::a_parts, Operands::l2, CStore::hot, 8, false, false, "K in parts of 8 k-blocks, every pair of the group a part"},
    {"kparts16", Order::a_parts, Operands::l2, CStore::hot, 16, false, false, "the same in parts of 16"},
    {"kparts8-dt1", Order::a_parts, Operands::l2, CStore::hot, 8, false, true, "kparts8 with B by TILELOADDT1"},
    {"kparts16-dt1", Order::a_parts, Operands::l2, CStore::hot, 16, false, true, "kparts16 with B by TILELOADDT1"},
    {"bparts16-dt1", Order::b_parts, Operands::l2, CStore::hot, 16, true, false, "B's part of 16 k-blocks over every row block, A by TILELOADDT1"},
};

struct Buffers {
  char* a;     // kRowBlocks x 2 row tiles x kblocks blocks, tile order
  char* b;     // kPairs x 2 panels x kblocks blocks
  char* cold;  // kColdBytes
  alignas(64) std::int32_t hot[4][256];
  std::vector<std::int32_t> acc;  // max(kPairs, kRowBlocks) x 4 tiles
};

// The kernels' k-step (tile_block.hpp): A's two row tiles `a_second` bytes apart, B's two panels
// `b_second` apart, all four loaded before the four products; either operand by TILELOADDT1.
template <TileProduct P>
inline void step(const Variant& v, const char* a, std::size_t a_second, const char* b, std::size_t b_second) {
  if (!v.a_dt1 && !v.b_dt1) return tilemoe::kernels::tile_step<P, true, true>(a, a_second, 64, b, b_second);
  if (!v.a_dt1) return tilemoe::kernels::tile_step<P, true, true, true>(a, a_second, 64, b, b_second);
  _tile_stream_loadd(4, a, 64);
  if (v.b_dt1) {
    _tile_stream_loadd(6, b, 64);
    _tile_stream_loadd(7, b + b_second, 64);
  } else {
    _tile_loadd(6, b, 64);
    _tile_loadd(7, b + b_second, 64);
  }
  _tile_stream_loadd(5, a + a_second, 64);
  tilemoe::kernels::tile_products<P, true, true>();
}

// Row tile 1's half of a k-step: its A tile (tmm5), both B tiles, and its two products (C tiles 2
// and 3). Row tile 0's half is tile_step<P, false, true> (tile_block.hpp).
template <TileProduct P>
inline void second_row_tile_step(const char* a, const char* b, std::size_t b_second) {
  _tile_loadd(5, a, 64);
  _tile_loadd(6, b, 64);
  _tile_loadd(7, b + b_second, 64);
  if constexpr (P == TileProduct::int8) {
    _tile_dpbssd(2, 5, 6);
    _tile_dpbssd(3, 5, 7);
  } else {
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
}

// The four C tiles: tile t at at(t), rows `ld` bytes apart.
template <typename At>
inline void store_c(At at, long ld) {
  tilemoe::kernels::store_c_tiles<true, true>(at, ld);
}

// Part [k0, k1) of one block, C through the accumulator `acc` (4 tiles).
template <TileProduct P>
inline void part_block(const Variant& v, const char* a, const char* b, std::size_t panel, int k0, int k1, std::int32_t* acc) {
  auto acc_tile = [&](int t) { return acc + 256 * t; };
  if (k0 == 0) {
    tilemoe::kernels::zero_c_tiles<true, true>();
  } else {
    tilemoe::kernels::load_c_tiles<true, true>(acc_tile, 64);
  }
  for (int kb = k0; kb < k1; ++kb) {
    const std::size_t at = static_cast<std::size_t>(kb) * kBlockBytes;
    step<P>(v, a + at, panel, b + at, panel);
  }
  store_c(acc_tile, 64);
}

// One pass over the group by every row block; returns the seconds it took.
template <TileProduct P>
double pass(const Variant& v, Buffers& buf, int kblocks) {
  const std::size_t panel = static_cast<std::size_t>(kblocks) * kBlockBytes;
  auto a_block = [&](int rb) { return buf.a + static_cast<std::size_t>(rb) * 2 * panel; };
  auto b_pair = [&](int p) { return buf.b + static_cast<std::size_t>(p) * 2 * panel; };
  std::size_t cold_at = 0;
  const auto t0 = std::chrono::steady_clock::now();
  if (v.order == Order::a_parts) {
    for (int rb = 0; rb < kRowBlocks; ++rb)
      for (int k0 = 0; k0 < kblocks; k0 += v.part)
        for (int p = 0; p < kPairs; ++p)
          part_block<P>(v, a_block(rb), b_pair(p), panel, k0, std::min(kblocks, k0 + v.part), buf.acc.data() + p * 1024);
  } else if (v.order == Order::b_parts) {
    for (int p = 0; p < kPairs; ++p)
      for (int k0 = 0; k0 < kblocks; k0 += v.part)
        for (int rb = 0; rb < kRowBlocks; ++rb)
          part_block<P>(v, a_block(rb), b_pair(p), panel, k0, std::min(kblocks, k0 + v.part), buf.acc.data() + rb * 1024);
  } else if (v.order == Order::rows_skewed) {
    // C0/C1 (row tile 0) are stored while C2/C3's last products run; C2/C3 after the next block's
    // first v.part k-steps of row tile 0 (B reloaded from L1 for row tile 1's). Tiles 0-3 C, 4/5 A,
    // 6/7 B as in tile_block.hpp.
    tilemoe::kernels::zero_c_tiles<true, true>();
    bool first = true;
    const int skew = v.part;
    for (int rb = 0; rb < kRowBlocks; ++rb) {
      for (int p = 0; p < kPairs; ++p) {
        const char* a = a_block(rb);
        const char* b = b_pair(p);
        int kb = 0;
        if (!first) {
          for (; kb < skew && kb < kblocks; ++kb) {
            const std::size_t at = static_cast<std::size_t>(kb) * kBlockBytes;
            tilemoe::kernels::tile_step<P, false, true>(a + at, 0, 64, b + at, panel);
          }
          _tile_stored(2, buf.hot[2], 64);
          _tile_stored(3, buf.hot[3], 64);
          _tile_zero(2);
          _tile_zero(3);
          for (int k = 0; k < kb; ++k) {
            const std::size_t at = static_cast<std::size_t>(k) * kBlockBytes;
            second_row_tile_step<P>(a + at + panel, b + at, panel);
          }
        }
        for (; kb < kblocks; ++kb) {
          const std::size_t at = static_cast<std::size_t>(kb) * kBlockBytes;
          step<P>(v, a + at, panel, b + at, panel);
        }
        first = false;
        _tile_stored(0, buf.hot[0], 64);
        _tile_stored(1, buf.hot[1], 64);
        _tile_zero(0);
        _tile_zero(1);
      }
    }
    _tile_stored(2, buf.hot[2], 64);
    _tile_stored(3, buf.hot[3], 64);
  } else {
    for (int rb = 0; rb < kRowBlocks; ++rb) {
      for (int p = 0; p < kPairs; ++p) {
        tilemoe::kernels::zero_c_tiles<true, true>();
        for (int kb = 0; kb < kblocks; ++kb) {
          if (v.order == Order::products) {
            tilemoe::kernels::tile_products<P, true, true>();
            continue;
          }
          // l1_window: two k-blocks of a 4 KiB window of each operand, over and over.
          const bool window = v.operands == Operands::l1_window;
          const std::size_t at = static_cast<std::size_t>(window ? kb % 2 : kb) * kBlockBytes;
          const std::size_t second = window ? 2 * kBlockBytes : panel;
          step<P>(v, (window ? buf.a : a_block(rb)) + at, second, (window ? buf.b : b_pair(p)) + at, second);
        }
        if (v.c == CStore::none) continue;
        if (v.c == CStore::cold) {
          char* c = buf.cold + cold_at;
          cold_at = (cold_at + 32 * 1024) % kColdBytes;
          store_c([&](int t) { return c + (t / 2) * 16 * 1024 + (t % 2) * 64; }, 1024);
        } else {
          store_c([&](int t) { return buf.hot[t]; }, 64);
        }
      }
    }
  }
  _tile_stored(0, buf.hot[0], 64);  // the last products are waited for
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int usage(const char* why) {
  if (why) std::fprintf(stderr, "tilemoe_tile_store_probe: %s\n", why);
  std::fprintf(stderr, "usage: tilemoe_tile_store_probe [--cpu N] [--weights int8|bf16] [--rounds R]\nvariants:\n");
  for (const Variant& v : kVariants) std::fprintf(stderr, "  %-13s %s\n", v.name, v.what);
  return why ? 2 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  int cpu = 0, rounds = 5;
  bool int8 = true;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (arg == "--help" || arg == "-h") return usage(nullptr);
    const char* v = value();
    if (!v) return usage(("missing value after " + arg).c_str());
    auto number = [&](int lo, int& out) {
      char* end = nullptr;
      const long n = std::strtol(v, &end, 10);
      if (end == v || *end != '\0' || n < lo || n > 1 << 20) return false;
      out = static_cast<int>(n);
      return true;
    };
    if (arg == "--cpu") {
      if (!number(0, cpu)) return usage("--cpu: a CPU number");
    } else if (arg == "--rounds") {
      if (!number(1, rounds)) return usage("--rounds: a count of at least 1");
    } else if (arg == "--weights") {
      const std::string w = v;
      if (w != "int8" && w != "bf16") return usage("--weights: int8 or bf16");
      int8 = w == "int8";
    } else {
      return usage(("unknown option " + arg).c_str());
    }
  }
  if (!tilemoe::kernels::tile_instructions_usable()) {
    std::fprintf(stderr, "tilemoe_tile_store_probe: no usable AMX tiles here: %s\n",
                 tilemoe::kernels::isa_unavailable_reason(tilemoe::kernels::Isa::amx_bf16).c_str());
    return 1;
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  const bool pinned = sched_setaffinity(0, sizeof set, &set) == 0;
  if (!pinned) std::fprintf(stderr, "tilemoe_tile_store_probe: not pinned to CPU %d\n", cpu);

  const int kblocks = int8 ? 32 : 64;  // K = 2048
  const std::size_t panel = static_cast<std::size_t>(kblocks) * kBlockBytes;
  Buffers buf{};
  buf.a = static_cast<char*>(std::aligned_alloc(4096, kRowBlocks * 2 * panel));
  buf.b = static_cast<char*>(std::aligned_alloc(4096, kPairs * 2 * panel));
  buf.cold = static_cast<char*>(std::aligned_alloc(4096, kColdBytes));
  if (!buf.a || !buf.b || !buf.cold) return std::fprintf(stderr, "tilemoe_tile_store_probe: out of memory\n"), 1;
  // Small codes (bf16: small finite values), so that no product overflows or turns NaN.
  for (std::size_t i = 0; i < kRowBlocks * 2 * panel; ++i) buf.a[i] = static_cast<char>(int8 ? i * 7 % 11 : (i % 2 ? 0x3c : 0));
  for (std::size_t i = 0; i < kPairs * 2 * panel; ++i) buf.b[i] = static_cast<char>(int8 ? i * 13 % 9 : (i % 2 ? 0x3c : 0));
  std::memset(buf.cold, 0, kColdBytes);
  buf.acc.assign(static_cast<std::size_t>(std::max(kPairs, kRowBlocks)) * 1024, 0);

  tilemoe::kernels::ensure_tile_config(tilemoe::kernels::make_tile_config(16, 16));
  // Tiles 4-7 hold operands for the products-alone variant.
  if (int8) {
    step<TileProduct::int8>(kVariants[1], buf.a, panel, buf.b, panel);
  } else {
    step<TileProduct::bf16>(kVariants[1], buf.a, panel, buf.b, panel);
  }

  const double ops = 2.0 * kRowBlocks * 32 * kPairs * 32 * (int8 ? 64.0 : 32.0) * kblocks;
  const std::string where = pinned ? "CPU " + std::to_string(cpu) : "not pinned";
  std::printf("%s, %s, %d row blocks of 32 x %d pairs, K = 2048, %d rounds: median and best T(FL)OP/s\n", int8 ? "int8" : "bf16",
              where.c_str(), kRowBlocks, kPairs, rounds);
  for (const Variant& v : kVariants) {
    std::vector<double> rates;
    for (int r = 0; r < rounds + 1; ++r) {
      double sec = 0;
      for (int rep = 0; rep < 8; ++rep)
        sec += int8 ? pass<TileProduct::int8>(v, buf, kblocks) : pass<TileProduct::bf16>(v, buf, kblocks);
      if (r > 0) rates.push_back(8 * ops / sec * 1e-12);  // the first round warms the caches
    }
    std::sort(rates.begin(), rates.end());
    std::printf("%-13s %6.2f %6.2f\n", v.name, rates[rates.size() / 2], rates.back());
  }
  _tile_release();
  std::free(buf.a);
  std::free(buf.b);
  std::free(buf.cold);
  return 0;
}
