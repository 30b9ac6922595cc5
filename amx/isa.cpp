// Baseline x86-64 file: detection must itself run on any CPU, so it uses cpuid and an inline
// xgetbv (the _xgetbv intrinsic would need -mxsave) and never touches an AVX-512 register.
#include "amx/isa.hpp"

#include "amx/one_row_tile_block.hpp"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "tilemoe/error.hpp"

namespace tilemoe::kernels {
namespace {

constexpr long kArchGetXcompPerm = 0x1022;
constexpr long kArchReqXcompPerm = 0x1023;
constexpr unsigned kXfeatureXtiledata = 18;

constexpr std::uint64_t kXcr0Sse = 1u << 1, kXcr0Avx = 1u << 2;
constexpr std::uint64_t kXcr0Opmask = 1u << 5, kXcr0ZmmHi256 = 1u << 6, kXcr0Hi16Zmm = 1u << 7;
constexpr std::uint64_t kXcr0Xtilecfg = 1u << 17, kXcr0Xtiledata = 1u << 18;

bool bit(unsigned reg, int n) { return (reg >> n) & 1u; }

std::uint64_t read_xcr0() {
  std::uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<std::uint64_t>(hi) << 32) | lo;
}

// Linux keeps the 8 KiB tile state disabled (XFD) until a process asks for it; the first tile
// instruction without this permission kills the process with SIGILL.
void request_amx_permission(CpuFeatures& f) {
  unsigned long granted = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &granted) == 0 &&
      (granted & (1ul << kXfeatureXtiledata)) != 0) {
    f.os_amx_permitted = true;
    return;
  }
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
    int err = errno;
    f.amx_permission_error = std::string("Linux refused AMX tile permission (arch_prctl ARCH_REQ_XCOMP_PERM): ") +
                             std::strerror(err);
    return;
  }
  granted = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &granted) != 0 ||
      (granted & (1ul << kXfeatureXtiledata)) == 0) {
    f.amx_permission_error = "Linux accepted the AMX tile permission request but does not report it granted";
    return;
  }
  f.os_amx_permitted = true;
}

std::string avx512_reason(const CpuFeatures& f);

CpuFeatures detect() {
  CpuFeatures f;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  unsigned max_leaf = __get_cpuid_max(0, nullptr);
  if (max_leaf < 1) return f;
  __cpuid(1, eax, ebx, ecx, edx);
  const unsigned base_family = (eax >> 8) & 0xf, base_model = (eax >> 4) & 0xf;
  f.family = base_family == 0xf ? base_family + ((eax >> 20) & 0xff) : base_family;
  f.model = base_family == 0x6 || base_family == 0xf ? (((eax >> 16) & 0xf) << 4) + base_model : base_model;
  f.fma = bit(ecx, 12);
  f.f16c = bit(ecx, 29);
  bool osxsave = bit(ecx, 27);
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    unsigned max_subleaf = eax;
    f.avx2 = bit(ebx, 5);
    f.avx512f = bit(ebx, 16);
    f.avx512dq = bit(ebx, 17);
    f.avx512bw = bit(ebx, 30);
    f.avx512vl = bit(ebx, 31);
    f.avx512_vnni = bit(ecx, 11);
    f.amx_bf16 = bit(edx, 22);
    f.amx_tile = bit(edx, 24);
    f.amx_int8 = bit(edx, 25);
    if (max_subleaf >= 1) {
      __cpuid_count(7, 1, eax, ebx, ecx, edx);
      f.avx512_bf16 = bit(eax, 5);
    }
  }
  if (osxsave) {  // without OSXSAVE, xgetbv itself is an invalid instruction
    std::uint64_t xcr0 = read_xcr0();
    std::uint64_t zmm = kXcr0Sse | kXcr0Avx | kXcr0Opmask | kXcr0ZmmHi256 | kXcr0Hi16Zmm;
    f.os_ymm = (xcr0 & (kXcr0Sse | kXcr0Avx)) == (kXcr0Sse | kXcr0Avx);
    f.os_zmm = (xcr0 & zmm) == zmm;
    f.os_amx = (xcr0 & (kXcr0Xtilecfg | kXcr0Xtiledata)) == (kXcr0Xtilecfg | kXcr0Xtiledata);
  }
  if (f.amx_tile && f.os_amx) request_amx_permission(f);
#if defined(TILEMOE_AMX_EMULATION)
  f.amx_emulated = avx512_reason(f).empty();
#endif
  return f;
}

std::string join_missing(const std::string& prefix, std::initializer_list<std::pair<bool, const char*>> items) {
  std::string missing;
  for (auto [present, name] : items) {
    if (present) continue;
    if (!missing.empty()) missing += ", ";
    missing += name;
  }
  return missing.empty() ? std::string() : prefix + missing;
}

std::string avx512_reason(const CpuFeatures& f) {
  std::string r = join_missing("CPU has no ", {{f.avx512f, "AVX512F"},
                                               {f.avx512bw, "AVX512BW"},
                                               {f.avx512vl, "AVX512VL"},
                                               {f.avx512dq, "AVX512DQ"},
                                               {f.avx512_bf16, "AVX512-BF16"},
                                               {f.avx512_vnni, "AVX512-VNNI"},
                                               {f.fma, "FMA"},
                                               {f.f16c, "F16C"}});
  if (!r.empty()) return r;
  if (!f.os_zmm) return "the OS has not enabled AVX-512 register state (XCR0 bits 5-7)";
  return {};
}

std::string avx2_reason(const CpuFeatures& f) {
  std::string r = join_missing("CPU has no ", {{f.avx2, "AVX2"}, {f.fma, "FMA"}, {f.f16c, "F16C"}});
  if (!r.empty()) return r;
  if (!f.os_ymm) return "the OS has not enabled AVX register state (XCR0 bits 1-2)";
  return {};
}

std::string amx_reason(const CpuFeatures& f) {
  // The AMX table sends small batches to the AVX-512 kernel, so AMX needs AVX-512 too.
  std::string r = avx512_reason(f);
  if (!r.empty()) return r + " (the AMX path needs AVX-512 as well)";
  if (f.amx_emulated) return {};
  r = join_missing("CPU has no ", {{f.amx_tile, "AMX-TILE"}, {f.amx_bf16, "AMX-BF16"}, {f.amx_int8, "AMX-INT8"}});
  if (!r.empty()) return r;
  if (!f.os_amx) return "the OS has not enabled AMX tile state (XCR0 bits 17/18; Linux >= 5.16 needed)";
  if (!f.os_amx_permitted) return f.amx_permission_error;
  return {};
}

constexpr const char* kValidNames = "auto, portable, avx2, avx512 (or avx512_bf16), amx (or amx_bf16)";

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

bool isa_available(Isa isa) { return isa_unavailable_reason(isa).empty(); }

std::string isa_unavailable_reason(Isa isa) {
  switch (isa) {
    case Isa::portable: return {};
    case Isa::avx2: return avx2_reason(cpu_features());
    case Isa::avx512_bf16: return avx512_reason(cpu_features());
    case Isa::amx_bf16: return amx_reason(cpu_features());
  }
  return "unknown ISA";
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::portable: return "portable";
    case Isa::avx2: return "avx2";
    case Isa::avx512_bf16: return "avx512";
    case Isa::amx_bf16: return "amx";
  }
  return "unknown";
}

std::string isa_label(Isa isa) {
  std::string label = isa_name(isa);
  if (isa == Isa::amx_bf16 && cpu_features().amx_emulated) label += " (emulated tiles)";
  return label;
}

std::optional<Isa> parse_isa(std::string_view name) {
  if (name == "portable") return Isa::portable;
  if (name == "avx2") return Isa::avx2;
  if (name == "avx512" || name == "avx512_bf16") return Isa::avx512_bf16;
  if (name == "amx" || name == "amx_bf16") return Isa::amx_bf16;
  return std::nullopt;
}

Isa best_available_isa() {
  if (isa_available(Isa::amx_bf16) && !cpu_features().amx_emulated) return Isa::amx_bf16;
  if (isa_available(Isa::avx512_bf16)) return Isa::avx512_bf16;
  if (isa_available(Isa::avx2)) return Isa::avx2;
  return Isa::portable;
}

namespace {

Isa resolve_isa_name(std::string_view requested) {
  std::string_view name = requested;
  std::string source = "requested ISA";
  if (name.empty() || name == "auto") {
    const char* env = std::getenv("TILEMOE_ISA");
    if (env == nullptr || *env == '\0' || std::string_view(env) == "auto") return best_available_isa();
    name = env;
    source = "TILEMOE_ISA";
  }
  std::optional<Isa> isa = parse_isa(name);
  if (!isa) {
    fail(ErrorKind::invalid_argument,
         source + " '" + std::string(name) + "' is not an ISA name; valid names: " + kValidNames);
  }
  std::string reason = isa_unavailable_reason(*isa);
  if (!reason.empty()) {
    fail(ErrorKind::unsupported, source + " '" + std::string(name) + "' cannot run on this machine: " + reason);
  }
  return *isa;
}

}  // namespace

Isa resolve_isa(std::string_view requested) {
  const Isa isa = resolve_isa_name(requested);
  // A misspelt TILEMOE_ONE_ROW_BLOCK fails here, where a layer or runtime is made, not silently
  // in the kernel (which falls back to the CPU's default).
  if (isa == Isa::amx_bf16) resolve_one_row_tile_block({});
  return isa;
}

}  // namespace tilemoe::kernels
