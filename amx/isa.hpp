#pragma once
// Which instruction set the kernels run with. Detection happens once per process; everything
// that picks a kernel goes through here so that no ISA code runs on a CPU (or OS) without it.
#include <optional>
#include <string>
#include <string_view>

namespace tilemoe::kernels {

enum class Isa { portable, avx2, avx512_bf16, amx_bf16 };

struct CpuFeatures {
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false, avx512_bf16 = false;
  bool avx512_vnni = false;  // the int8/int4 weight kernels; every CPU with AVX512-BF16 has it
  bool avx2 = false;  // the avx2 table (the portable kernels built for AVX2 + FMA + F16C)
  bool fma = false;
  bool f16c = false;  // the avx512 files are compiled with -mf16c, so it is required too
  bool amx_tile = false, amx_bf16 = false, amx_int8 = false;
  bool os_ymm = false;            // XCR0 has SSE and AVX state enabled
  bool os_zmm = false;            // XCR0 has opmask, ZMM_Hi256 and Hi16_ZMM state enabled
  bool os_amx = false;            // XCR0 has XTILECFG and XTILEDATA state enabled
  bool os_amx_permitted = false;  // Linux granted this process XTILEDATA (arch_prctl)
  std::string amx_permission_error;  // why the permission request failed, when it did
  // A TILEMOE_AMX_EMULATION build (tests only) on a CPU with the AVX-512 the AMX table also uses:
  // the AMX kernels run on tile_emulation's software model, whatever the CPU has.
  bool amx_emulated = false;
  // CPUID leaf 1's display family and model (Sapphire Rapids 6 / 143, Emerald Rapids 6 / 207): for
  // the few choices measured to go different ways on CPUs of one ISA (one_row_tile_block.hpp).
  unsigned family = 0, model = 0;
};

// Detected once (thread-safe); requests AMX tile permission once when the CPU and OS have AMX.
const CpuFeatures& cpu_features();

// Whether the AMX kernels may issue tile instructions now (permitted, or emulated): the check
// they make on every call, cheaper than isa_available.
inline bool tile_instructions_usable() {
  const CpuFeatures& f = cpu_features();
  return f.os_amx_permitted || f.amx_emulated;
}

bool isa_available(Isa isa);
// "" when available; otherwise what is missing, in words a user can act on.
std::string isa_unavailable_reason(Isa isa);
const char* isa_name(Isa isa);  // "portable", "avx2", "avx512", "amx"
// isa_name, with " (emulated tiles)" for the AMX of a TILEMOE_AMX_EMULATION build: for what
// people read (demo, bench), so that no emulated figure passes for an AMX one.
std::string isa_label(Isa isa);
// Accepts "portable", "avx2", "avx512", "avx512_bf16", "amx", "amx_bf16".
std::optional<Isa> parse_isa(std::string_view name);
// amx > avx512 > avx2 > portable; an emulated AMX (a test build) runs only when asked for by name.
Isa best_available_isa();

// The ISA a run uses. `requested` is "auto", empty, or an ISA name; when it is empty or "auto"
// the environment variable TILEMOE_ISA (if set and not "auto") decides, else the best available.
// Throws Error(unsupported) naming the reason when the chosen ISA cannot run here, and
// Error(invalid_argument) listing the valid names for an unknown name.
Isa resolve_isa(std::string_view requested);

}  // namespace tilemoe::kernels
