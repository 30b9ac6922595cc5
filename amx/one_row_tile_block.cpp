// Baseline x86-64 file (no ISA flags): the setting is read by the AMX kernel, resolved anywhere.
#include "amx/one_row_tile_block.hpp"

#include <atomic>
#include <cstdlib>
#include <string>

#include "tilemoe/error.hpp"

namespace tilemoe::kernels {
namespace {

constexpr int kUnset = -1;
std::atomic<int> g_block{kUnset};

constexpr const char* kValidNames = "auto, pairs, quads";

}  // namespace

OneRowTileBlock default_one_row_tile_block(const CpuFeatures& f) {
  return f.family == 6 && f.model == 143 ? OneRowTileBlock::quads : OneRowTileBlock::pairs;
}

const char* one_row_tile_block_name(OneRowTileBlock b) { return b == OneRowTileBlock::quads ? "quads" : "pairs"; }

std::optional<OneRowTileBlock> parse_one_row_tile_block(std::string_view name) {
  if (name == "pairs") return OneRowTileBlock::pairs;
  if (name == "quads") return OneRowTileBlock::quads;
  return std::nullopt;
}

OneRowTileBlock resolve_one_row_tile_block(std::string_view requested) {
  std::string_view name = requested;
  std::string source = "requested one-row tile block";
  if (name.empty() || name == "auto") {
    const char* env = std::getenv("TILEMOE_ONE_ROW_BLOCK");
    if (env == nullptr || *env == '\0' || std::string_view(env) == "auto") return default_one_row_tile_block(cpu_features());
    name = env;
    source = "TILEMOE_ONE_ROW_BLOCK";
  }
  std::optional<OneRowTileBlock> b = parse_one_row_tile_block(name);
  if (!b) fail(ErrorKind::invalid_argument, source + " '" + std::string(name) + "' is not a block name; valid names: " + kValidNames);
  return *b;
}

OneRowTileBlock one_row_tile_block() {
  int v = g_block.load(std::memory_order_relaxed);
  if (v == kUnset) {
    OneRowTileBlock b = default_one_row_tile_block(cpu_features());
    try {
      b = resolve_one_row_tile_block({});
    } catch (const Error&) {  // a misspelt TILEMOE_ONE_ROW_BLOCK: resolve_isa reports it
    }
    v = static_cast<int>(b);
    int expected = kUnset;  // a concurrent set_one_row_tile_block wins
    if (!g_block.compare_exchange_strong(expected, v, std::memory_order_relaxed)) v = expected;
  }
  return static_cast<OneRowTileBlock>(v);
}

void set_one_row_tile_block(OneRowTileBlock b) { g_block.store(static_cast<int>(b), std::memory_order_relaxed); }

}  // namespace tilemoe::kernels
