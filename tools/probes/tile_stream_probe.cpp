// tilemoe_tile_stream_probe: how a core's weight stream and its AMX tile products share the core,
// at one expert of 48 rows (512 tokens of DeepSeek-V2-Lite), in loop orders the kernels do not
// have to run. Stand-alone on purpose: it repeats the kernels' loops with raw tile intrinsics so
// that an order can be tried in minutes, and the bench (not this) decides what the kernels keep.
// docs/perf.md, sessions 42 and 45, have its figures and what they decided (session 45: the 3x2
// zig-zag, faster here on products from L2, lost 1-5 % in the bf16 kernel at 512-4096 tokens).
//
// Each of T threads (pinned to CPU i) owns its own pairs of packed panels (2 x kblocks x 1 KiB,
// laid out as the kernels pack B) and one 48-row A in tile order (3 row tiles, in L2), and runs
// one pass over its pairs per round; the variants take turns round by round. Printed: the median
// over rounds of the slowest thread's ms and of the median thread's ms (these vCPUs differ a lot
// from one another), and the stream's GB/s and the products' TFLOP/s at the slowest thread's time.
//
// Usage: tilemoe_tile_stream_probe [--threads T] [--weights bf16|int8] [--rounds R] [--mib M]
//                                  [--variants name,name,...]
#include <immintrin.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "amx/isa.hpp"

namespace {

constexpr std::size_t kBlockBytes = 1024;  // one B tile: 16 k-rows of 64 bytes
constexpr int kRowTiles = 3;                // 48 rows

struct alignas(64) TileConfig {
  std::uint8_t palette = 1, start_row = 0;
  std::uint8_t reserved[14]{};
  std::uint16_t colsb[16]{};
  std::uint8_t rows[16]{};
};

void prefetch_block_l1(const char* p) {
  for (std::size_t line = 0; line < kBlockBytes; line += 64) _mm_prefetch(p + line, _MM_HINT_T0);
}
void prefetch_block_l2(const char* p) {
  for (std::size_t line = 0; line < kBlockBytes; line += 64) _mm_prefetch(p + line, _MM_HINT_T1);
}

// The kernel's prefetch on a pair's streaming pass: each panel's block 4 k-steps ahead into L1 and
// 16 ahead into L2 (`panel` bytes from one panel to the next).
void prefetch_pair_ahead(const char* bk, std::size_t panel) {
  prefetch_block_l1(bk + 4 * kBlockBytes);
  prefetch_block_l1(bk + panel + 4 * kBlockBytes);
  prefetch_block_l2(bk + 16 * kBlockBytes);
  prefetch_block_l2(bk + panel + 16 * kBlockBytes);
}

// The product of the weight type; tile numbers must be literals.
#define TILE_PRODUCT(int8, c, a, b) \
  do {                              \
    if (int8)                       \
      _tile_dpbssd(c, a, b);        \
    else                            \
      _tile_dpbf16ps(c, a, b);      \
  } while (0)

struct Buffers {
  char* weights = nullptr;  // pairs + 1 (the last pair's prefetches stay inside)
  char* a = nullptr;        // kRowTiles x kblocks blocks, then 2 x 4 blocks for the cheats
  float* c = nullptr;       // C tiles written back (the chunked orders' accumulators)
  int pairs = 0;
};

struct Shape {
  int kblocks;  // per panel: bf16 K = 2048 is 64, int8 K = 2048 is 32
  std::size_t panel() const { return static_cast<std::size_t>(kblocks) * kBlockBytes; }
  std::size_t pair() const { return 2 * panel(); }
};

enum class Variant { stream, products, tree, three_by_one, tree_a_in_l1, three_by_one_a_in_l1, tree_k_chunks, three_by_one_k_chunks,
                     tree_a_prefetch, three_by_two, three_by_two_products, two_by_two_products, tree_next_pair_l2,
                     tree_next_pair_l2_l1, stream_next_pair_l2 };
struct VariantInfo {
  Variant v;
  const char* name;
  const char* what;
};
const VariantInfo kVariants[] = {
    {Variant::stream, "stream", "B tile loads alone, the kernel's prefetch (4 KiB a panel into L1, 16 KiB into L2 ahead)"},
    {Variant::products, "products", "the kernel's order over one pair that stays in L2: no stream"},
    {Variant::tree, "tree", "the kernel's order: 32 rows (2x2) stream the pair, 16 rows re-read it, ask for the next"},
    {Variant::three_by_one, "3x1", "each panel once, three row tiles a k-step: every B tile loaded once"},
    {Variant::tree_a_in_l1, "tree-a-l1", "tree with A read from 4 KiB a row tile (timing only: wrong products)"},
    {Variant::three_by_one_a_in_l1, "3x1-a-l1", "3x1 with A read from 4 KiB a row tile (timing only)"},
    {Variant::tree_k_chunks, "tree-kc8", "tree in K chunks of 8 over items of 8 panels, C through a buffer"},
    {Variant::three_by_one_k_chunks, "3x1-kc8", "3x1 in K chunks of 8 over items of 8 panels, C through a buffer"},
    {Variant::tree_a_prefetch, "tree-apf2", "tree with A asked for into L1 2 k-steps ahead"},
    {Variant::three_by_two, "3x2", "all 48 rows a k-step, C 0-5, one A and one B register in a zig-zag: 7 loads for 6 products"},
    {Variant::three_by_two_products, "3x2-prod", "3x2 over one pair that stays in L2: no stream"},
    {Variant::two_by_two_products, "2x2-prod", "the 2x2 block alone (32 rows: 2/3 of the ops printed) over one pair in L2"},
    {Variant::tree_next_pair_l2, "tree-np", "tree, no L1 requests; the whole next pair asked for into L2, a block each k-step"},
    {Variant::tree_next_pair_l2_l1, "tree-np-l1", "tree-np, and the 2x2 block's B asked for into L1 2 k-steps ahead"},
    {Variant::stream_next_pair_l2, "stream-np", "B tile loads alone, the next pair asked for into L2 a block each k-step"},
};

// The k-steps every order is built of, with the kernels' tile numbering (tile_block.hpp); one
// body each, so that the orders differ only in what they load from where.
// 2x2: C 0-3, A 4/5, B 6/7; both A and both B loaded before the four products.
template <bool Int8>
inline void step_2x2(const char* a0, const char* a1, const char* b0, const char* b1) {
  _tile_loadd(4, a0, 64);
  _tile_loadd(6, b0, 64);
  _tile_loadd(7, b1, 64);
  _tile_loadd(5, a1, 64);
  TILE_PRODUCT(Int8, 0, 4, 6);
  TILE_PRODUCT(Int8, 1, 4, 7);
  TILE_PRODUCT(Int8, 2, 5, 6);
  TILE_PRODUCT(Int8, 3, 5, 7);
}
// 1x2 (the 16-row block): C 0/1, A 4, B 6/7.
template <bool Int8>
inline void step_1x2(const char* a, const char* b0, const char* b1) {
  _tile_loadd(4, a, 64);
  _tile_loadd(6, b0, 64);
  _tile_loadd(7, b1, 64);
  TILE_PRODUCT(Int8, 0, 4, 6);
  TILE_PRODUCT(Int8, 1, 4, 7);
}
// 3x1: C 0-2, A 3-5 (row tiles `a_tile` bytes apart), B 6.
template <bool Int8>
inline void step_3x1(const char* b, const char* a, std::size_t a_tile) {
  _tile_loadd(6, b, 64);
  _tile_loadd(3, a, 64);
  _tile_loadd(4, a + a_tile, 64);
  _tile_loadd(5, a + 2 * a_tile, 64);
  TILE_PRODUCT(Int8, 0, 3, 6);
  TILE_PRODUCT(Int8, 1, 4, 6);
  TILE_PRODUCT(Int8, 2, 5, 6);
}

// 3x2 zig-zag: C 0-5 (row tile r, panel j at 2r + j), A 6, B 7. Each load replaces the one operand
// that the next product changes, so B's second use in a k-step comes from L1, just loaded:
// A0 B0 -> C00, B1 -> C01, A1 -> C11, B0 -> C10, A2 -> C20, B1 -> C21.
template <bool Int8>
inline void step_3x2(const char* a, std::size_t a_tile, const char* b0, const char* b1) {
  _tile_loadd(6, a, 64);
  _tile_loadd(7, b0, 64);
  TILE_PRODUCT(Int8, 0, 6, 7);
  _tile_loadd(7, b1, 64);
  TILE_PRODUCT(Int8, 1, 6, 7);
  _tile_loadd(6, a + a_tile, 64);
  TILE_PRODUCT(Int8, 3, 6, 7);
  _tile_loadd(7, b0, 64);
  TILE_PRODUCT(Int8, 2, 6, 7);
  _tile_loadd(6, a + 2 * a_tile, 64);
  TILE_PRODUCT(Int8, 4, 6, 7);
  _tile_loadd(7, b1, 64);
  TILE_PRODUCT(Int8, 5, 6, 7);
}

// C tiles 0 .. count-1 (1 KiB apart in c): zeroed (from == nullptr) or loaded; stored.
inline void start_c(int count, const float* from) {
  if (!from) {
    _tile_zero(0);
    _tile_zero(1);
    if (count > 2) _tile_zero(2);
    if (count > 3) _tile_zero(3);
    return;
  }
  _tile_loadd(0, from, 64);
  _tile_loadd(1, from + 256, 64);
  if (count > 2) _tile_loadd(2, from + 512, 64);
  if (count > 3) _tile_loadd(3, from + 768, 64);
}
inline void store_c(int count, float* to) {
  _tile_stored(0, to, 64);
  _tile_stored(1, to + 256, 64);
  if (count > 2) _tile_stored(2, to + 512, 64);
  if (count > 3) _tile_stored(3, to + 768, 64);
}

// The kernel's order for one pair (pair_order.hpp: pairs outside, row blocks inside).
template <bool Int8>
void tree_pair(const Shape& s, const char* b0, const char* next, const char* a, bool stream, bool a_in_l1, bool a_prefetch, float* c,
               int next_pair = 0) {
  const std::size_t panel = s.panel();
  // next_pair: 1 the next pair's 2 x kblocks blocks asked for into L2, one each k-step of the two
  // sweeps; 2 that and the 2x2 block's B into L1 2 k-steps ahead (from L2).
  auto next_block_l2 = [&](int step) { prefetch_block_l2(next + static_cast<std::size_t>(step) * kBlockBytes); };
  auto a_block = [&](int tile, int kb) { return a + (static_cast<std::size_t>(tile) * s.kblocks + (a_in_l1 ? kb % 4 : kb)) * kBlockBytes; };
  start_c(4, nullptr);
  for (int kb = 0; kb < s.kblocks; ++kb) {
    const char* bk = b0 + kb * kBlockBytes;
    if (next_pair) {
      next_block_l2(kb);
      if (next_pair == 2) {
        prefetch_block_l1(bk + 2 * kBlockBytes);
        prefetch_block_l1(bk + panel + 2 * kBlockBytes);
      }
    } else if (stream) {
      prefetch_pair_ahead(bk, panel);
    }
    if (a_prefetch) {
      prefetch_block_l1(a_block(0, kb + 2));
      prefetch_block_l1(a_block(1, kb + 2));
    }
    step_2x2<Int8>(a_block(0, kb), a_block(1, kb), bk, bk + panel);
  }
  store_c(4, c);
  start_c(2, nullptr);
  for (int kb = 0; kb < s.kblocks; ++kb) {
    const char* bk = b0 + kb * kBlockBytes;
    if (next_pair) {
      next_block_l2(s.kblocks + kb);
    } else if (stream && kb < 16) {
      prefetch_block_l2(next + kb * kBlockBytes);
      prefetch_block_l2(next + panel + kb * kBlockBytes);
    }
    if (a_prefetch) prefetch_block_l1(a_block(2, kb + 2));
    step_1x2<Int8>(a_block(2, kb), bk, bk + panel);
  }
  store_c(2, c + 1024);
}

// The 3x2 order over one pair: every B tile streamed once, its second use from L1.
template <bool Int8>
void three_by_two_pair(const Shape& s, const char* b0, const char* a, bool stream, float* c) {
  const std::size_t panel = s.panel();
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_zero(4);
  _tile_zero(5);
  for (int kb = 0; kb < s.kblocks; ++kb) {
    const char* bk = b0 + kb * kBlockBytes;
    if (stream) {
      prefetch_pair_ahead(bk, panel);
    }
    step_3x2<Int8>(a + static_cast<std::size_t>(kb) * kBlockBytes, panel, bk, bk + panel);
  }
  _tile_stored(0, c, 64);
  _tile_stored(1, c + 256, 64);
  _tile_stored(2, c + 512, 64);
  _tile_stored(3, c + 768, 64);
  _tile_stored(4, c + 1024, 64);
  _tile_stored(5, c + 1280, 64);
}

// Three row tiles against one panel at a time (tiles 0-2 C, 3-5 A, 6 B).
template <bool Int8>
void three_by_one_panel(const Shape& s, const char* bj, const char* a, bool a_in_l1, float* c) {
  start_c(3, nullptr);
  for (int kb = 0; kb < s.kblocks; ++kb) {
    const char* bk = bj + kb * kBlockBytes;
    prefetch_block_l1(bk + 4 * kBlockBytes);
    prefetch_block_l2(bk + 16 * kBlockBytes);
    step_3x1<Int8>(bk, a + static_cast<std::size_t>(a_in_l1 ? kb % 4 : kb) * kBlockBytes, s.panel());
  }
  store_c(3, c);
}

// K chunks of kc k-blocks over items of `panels` panels: A's chunk (48 rows x kc blocks) stays in
// L1 across the item's panels; C goes through a buffer between chunks. B is consumed chunk by
// chunk, panel by panel, and asked for ahead in that order.
template <bool Int8>
void k_chunks_item(const Shape& s, const char* w, const char* a, int panels, int kc, bool tree_blocks, float* cbuf) {
  const int chunks = s.kblocks / kc;
  auto block_at = [&](int step) -> const char* {
    const int per_chunk = panels * kc;
    const int chunk = step / per_chunk, r = step % per_chunk;
    if (chunk >= chunks) return w + static_cast<std::size_t>(panels) * s.panel() + static_cast<std::size_t>(step - chunks * per_chunk) * kBlockBytes;
    return w + static_cast<std::size_t>(r / kc) * s.panel() + static_cast<std::size_t>(chunk * kc + r % kc) * kBlockBytes;
  };
  int step = 0;
  for (int chunk = 0; chunk < chunks; ++chunk) {
    const char* ac = a + static_cast<std::size_t>(chunk) * kc * kBlockBytes;
    if (!tree_blocks) {
      for (int j = 0; j < panels; ++j) {
        float* cj = cbuf + j * 3 * 256;
        start_c(3, chunk == 0 ? nullptr : cj);
        for (int k = 0; k < kc; ++k, ++step) {
          prefetch_block_l1(block_at(step + 4));
          prefetch_block_l2(block_at(step + 16));
          step_3x1<Int8>(block_at(step), ac + k * kBlockBytes, s.panel());
        }
        store_c(3, cj);
      }
      continue;
    }
    for (int j = 0; j < panels; j += 2) {
      float* cj = cbuf + j * 3 * 256;  // 6 C tiles a pair
      start_c(4, chunk == 0 ? nullptr : cj);
      const int first = step;  // panel j's blocks of this chunk; panel j + 1's follow
      for (int k = 0; k < kc; ++k, ++step) {
        prefetch_block_l1(block_at(step + 4));
        prefetch_block_l1(block_at(step + kc + 4));
        prefetch_block_l2(block_at(step + 16));
        prefetch_block_l2(block_at(step + kc + 16));
        const char* ak = ac + k * kBlockBytes;
        step_2x2<Int8>(ak, ak + s.panel(), block_at(step), block_at(step + kc));
      }
      store_c(4, cj);
      start_c(2, chunk == 0 ? nullptr : cj + 1024);
      for (int k = 0; k < kc; ++k)
        step_1x2<Int8>(ac + 2 * s.panel() + k * kBlockBytes, block_at(first + k), block_at(first + kc + k));
      store_c(2, cj + 1024);
      step += kc;
    }
  }
}

template <bool Int8>
void run_pass(Variant v, const Shape& s, const Buffers& t) {
  const std::size_t pair = s.pair();
  constexpr int kItemPanels = 8, kChunk = 8;
  if (v == Variant::tree_k_chunks || v == Variant::three_by_one_k_chunks) {
    for (int item = 0; item < t.pairs * 2 / kItemPanels; ++item)
      k_chunks_item<Int8>(s, t.weights + static_cast<std::size_t>(item) * kItemPanels * s.panel(), t.a, kItemPanels, kChunk,
                          v == Variant::tree_k_chunks, t.c);
    return;
  }
  for (int p = 0; p < t.pairs; ++p) {
    const bool in_l2 = v == Variant::products || v == Variant::three_by_two_products || v == Variant::two_by_two_products;
    const char* b0 = t.weights + (in_l2 ? 0 : static_cast<std::size_t>(p) * pair);
    switch (v) {
      case Variant::stream:
        for (int kb = 0; kb < s.kblocks; ++kb) {
          const char* bk = b0 + kb * kBlockBytes;
          prefetch_pair_ahead(bk, s.panel());
          _tile_loadd(6, bk, 64);
          _tile_loadd(7, bk + s.panel(), 64);
        }
        break;
      case Variant::stream_next_pair_l2:
        for (int kb = 0; kb < s.kblocks; ++kb) {
          const char* bk = b0 + kb * kBlockBytes;
          prefetch_block_l2(b0 + pair + 2 * kb * kBlockBytes);
          prefetch_block_l2(b0 + pair + (2 * kb + 1) * kBlockBytes);
          _tile_loadd(6, bk, 64);
          _tile_loadd(7, bk + s.panel(), 64);
        }
        break;
      case Variant::tree_next_pair_l2:
      case Variant::tree_next_pair_l2_l1:
        tree_pair<Int8>(s, b0, b0 + pair, t.a, true, false, false, t.c, v == Variant::tree_next_pair_l2 ? 1 : 2);
        break;
      case Variant::products:
      case Variant::tree:
      case Variant::tree_a_in_l1:
      case Variant::tree_a_prefetch:
        tree_pair<Int8>(s, b0, b0 + pair, t.a, v != Variant::products, v == Variant::tree_a_in_l1, v == Variant::tree_a_prefetch, t.c);
        break;
      case Variant::two_by_two_products:
        start_c(4, nullptr);
        for (int kb = 0; kb < s.kblocks; ++kb)
          step_2x2<Int8>(t.a + static_cast<std::size_t>(kb) * kBlockBytes, t.a + s.panel() + static_cast<std::size_t>(kb) * kBlockBytes,
                         b0 + kb * kBlockBytes, b0 + s.panel() + kb * kBlockBytes);
        store_c(4, t.c);
        break;
      case Variant::three_by_two:
      case Variant::three_by_two_products:
        three_by_two_pair<Int8>(s, b0, t.a, v == Variant::three_by_two, t.c);
        break;
      default:
        for (int j = 0; j < 2; ++j)
          three_by_one_panel<Int8>(s, b0 + j * s.panel(), t.a, v == Variant::three_by_one_a_in_l1, t.c + 1536);
        break;
    }
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// why == nullptr: asked for (--help), to stdout.
int usage(const char* why) {
  std::FILE* out = why ? stderr : stdout;
  if (why) std::fprintf(out, "tilemoe_tile_stream_probe: %s\n", why);
  std::fprintf(out, "usage: tilemoe_tile_stream_probe [--threads T] [--weights bf16|int8] [--rounds R] [--mib M] [--variants name,...]\n"
                    "variants (default: all):\n");
  for (const VariantInfo& vi : kVariants) std::fprintf(out, "  %-10s %s\n", vi.name, vi.what);
  return why ? 2 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  bool int8 = false;
  int rounds = 20;
  int mib = 40;
  std::vector<VariantInfo> chosen(std::begin(kVariants), std::end(kVariants));
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") return usage(nullptr);
    if (i + 1 >= argc) return usage(("missing value after " + arg).c_str());
    const std::string value = argv[++i];
    if (arg == "--threads") {
      threads = std::atoi(value.c_str());
    } else if (arg == "--rounds") {
      rounds = std::atoi(value.c_str());
    } else if (arg == "--mib") {
      mib = std::atoi(value.c_str());
    } else if (arg == "--weights") {
      if (value != "bf16" && value != "int8") return usage("--weights is bf16 or int8");
      int8 = value == "int8";
    } else if (arg == "--variants") {
      chosen.clear();
      for (std::size_t at = 0; at <= value.size();) {
        const std::size_t end = std::min(value.find(',', at), value.size());
        const std::string name = value.substr(at, end - at);
        const auto it = std::find_if(std::begin(kVariants), std::end(kVariants), [&](const VariantInfo& vi) { return name == vi.name; });
        if (it == std::end(kVariants)) return usage(("unknown variant '" + name + "'").c_str());
        chosen.push_back(*it);
        at = end + 1;
      }
    } else {
      return usage(("unknown option " + arg).c_str());
    }
  }
  if (threads < 1 || rounds < 2 || mib < 1) return usage("--threads, --mib must be >= 1 and --rounds >= 2");
  // The tile instructions need the CPU, the kernel and Linux's permission (asked for here).
  if (!tilemoe::kernels::isa_available(tilemoe::kernels::Isa::amx_bf16)) {
    std::fprintf(stderr, "tilemoe_tile_stream_probe: %s\n", tilemoe::kernels::isa_unavailable_reason(tilemoe::kernels::Isa::amx_bf16).c_str());
    return 1;
  }

  const Shape shape{int8 ? 32 : 64};  // K = 2048 either way
  const int pairs = std::max(2, static_cast<int>(static_cast<std::size_t>(mib) * 1024 * 1024 / shape.pair()));
  std::vector<Buffers> buffers(static_cast<std::size_t>(threads));
  std::vector<double> thread_ms(static_cast<std::size_t>(threads));
  std::atomic<int> ready{0}, done{0}, round{0};
  std::atomic<bool> failed{false};
  Variant current = Variant::stream;

  auto worker = [&](int i) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(i % CPU_SETSIZE, &set);
    sched_setaffinity(0, sizeof set, &set);  // best effort: a CPU outside the process's set stays unpinned
    Buffers& b = buffers[static_cast<std::size_t>(i)];
    b.pairs = pairs;
    // Written by this thread, so that its pages come from its own node.
    b.weights = static_cast<char*>(std::aligned_alloc(4096, (static_cast<std::size_t>(pairs) + 1) * shape.pair()));
    b.a = static_cast<char*>(std::aligned_alloc(4096, static_cast<std::size_t>(kRowTiles) * shape.panel()));
    b.c = static_cast<float*>(std::aligned_alloc(4096, 64 * 1024));
    if (!b.weights || !b.a || !b.c) {
      failed = true;
    } else {
      std::memset(b.weights, 1, (static_cast<std::size_t>(pairs) + 1) * shape.pair());  // int8 1s, bf16 tiny normals
      std::memset(b.a, 1, static_cast<std::size_t>(kRowTiles) * shape.panel());
    }
    TileConfig config;
    for (int t = 0; t < 8; ++t) config.colsb[t] = 64, config.rows[t] = 16;
    _tile_loadconfig(&config);
    ready.fetch_add(1);
    for (int seen = 0;;) {
      int r;
      while ((r = round.load(std::memory_order_acquire)) == seen) _mm_pause();
      seen = r;
      if (r < 0) break;
      const auto t0 = std::chrono::steady_clock::now();
      if (!failed) {
        if (int8)
          run_pass<true>(current, shape, b);
        else
          run_pass<false>(current, shape, b);
      }
      thread_ms[static_cast<std::size_t>(i)] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      done.fetch_add(1, std::memory_order_acq_rel);
    }
    _tile_release();
    std::free(b.weights);
    std::free(b.a);
    std::free(b.c);
  };
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) pool.emplace_back(worker, i);
  while (ready.load() < threads) std::this_thread::sleep_for(std::chrono::milliseconds(1));

  std::vector<std::vector<double>> slowest(chosen.size()), typical(chosen.size());
  int r = 0;
  for (int pass = 0; pass < rounds && !failed; ++pass) {
    for (std::size_t v = 0; v < chosen.size(); ++v) {
      current = chosen[v].v;
      done.store(0);
      round.store(++r, std::memory_order_release);
      // This thread sleeps rather than spins: with one worker per CPU it shares a CPU with one.
      while (done.load(std::memory_order_acquire) < threads) std::this_thread::sleep_for(std::chrono::microseconds(50));
      if (pass == 0) continue;  // the first round faults the pages in
      slowest[v].push_back(*std::max_element(thread_ms.begin(), thread_ms.end()));
      typical[v].push_back(median(thread_ms));
    }
  }
  round.store(-1, std::memory_order_release);
  for (std::thread& t : pool) t.join();
  if (failed) {
    std::fprintf(stderr, "tilemoe_tile_stream_probe: out of memory for %d threads x %d MiB\n", threads, mib);
    return 1;
  }

  const double bytes = static_cast<double>(threads) * pairs * shape.pair();
  const double k = int8 ? shape.kblocks * 64.0 : shape.kblocks * 32.0;
  const double ops = static_cast<double>(threads) * pairs * (16.0 * kRowTiles) * 32.0 * k * 2.0;
  std::printf("%s, %d threads, %d pairs of %zu KiB a thread (%.0f MB in all), 48 rows, K = 2048, %d rounds\n", int8 ? "int8" : "bf16",
              threads, pairs, shape.pair() / 1024, bytes / 1e6, rounds - 1);
  std::printf("%-10s %12s %12s %8s %9s\n", "variant", "slowest_ms", "median_ms", "GB/s", "T(FL)OP/s");
  for (std::size_t v = 0; v < chosen.size(); ++v) {
    const double ms = median(slowest[v]);
    const bool streams = chosen[v].v != Variant::products && chosen[v].v != Variant::three_by_two_products &&
                         chosen[v].v != Variant::two_by_two_products;
    const bool multiplies = chosen[v].v != Variant::stream && chosen[v].v != Variant::stream_next_pair_l2;
    std::printf("%-10s %12.3f %12.3f %8.1f %9.2f\n", chosen[v].name, ms, median(typical[v]), streams ? bytes / ms / 1e6 : 0.0,
                multiplies ? ops / ms / 1e9 : 0.0);
  }
  return 0;
}
