// `tilemoe info`: what this CPU offers, what tilemoe will use, and the machine's layout.
#include <cstdio>
#include <memory>

#include "amx/isa.hpp"
#include "numa/topology.hpp"
#include "tools/cli_common.hpp"

namespace tilemoe::cli {

void add_info_command(CLI::App& app, int& status) {
  auto* cmd = app.add_subcommand("info", "CPU features, the ISA chosen, cores, NUMA nodes and caches");
  cmd->callback([&status] {
    using namespace kernels;
    const auto& f = cpu_features();
    std::printf("cpu features: avx512f %d, avx512bw %d, avx512vl %d, avx512dq %d, avx512_bf16 %d, fma %d, amx_tile %d, amx_bf16 %d, "
                "amx_int8 %d\n",
                f.avx512f, f.avx512bw, f.avx512vl, f.avx512dq, f.avx512_bf16, f.fma, f.amx_tile, f.amx_bf16, f.amx_int8);
    for (Isa isa : {Isa::amx_bf16, Isa::avx512_bf16, Isa::portable}) {
      std::string why = isa_unavailable_reason(isa);
      std::printf("  %-9s %s\n", isa_name(isa), why.empty() ? "available" : ("unavailable: " + why).c_str());
    }
    std::printf("chosen: %s (override with --isa or TILEMOE_ISA)\n", isa_name(resolve_isa({})));
    const auto& t = numa::system_topology();
    std::printf("cpu: %s, %d cores, %d hardware threads, L2 %.1f MB per core, last-level cache %.0f MB\n",
                t.cpu_model.empty() ? "unknown" : t.cpu_model.c_str(), t.cores, t.pus, t.l2_bytes_per_core / 1e6, t.llc_bytes / 1e6);
    for (const auto& n : t.nodes) std::printf("  NUMA node %d: %zu cores, %.1f GB\n", n.os_index, n.cpus.size(), n.memory_bytes / 1e9);
    std::printf("(tilemoe bench measures the read bandwidth and the chosen ISA's peak)\n");
    status = 0;
  });
}

}  // namespace tilemoe::cli
