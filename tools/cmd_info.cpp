// `tilemoe info`: what this CPU offers, what tilemoe will use, the machine's layout, and a short
// measurement of its limits (read bandwidth, the chosen ISA's peak).
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "amx/isa.hpp"
#include "amx/one_row_tile_block.hpp"
#include "numa/topology.hpp"
#include "src/layer/moe_compute.hpp"
#include "tools/cli_common.hpp"
#include "tools/machine_limits.hpp"
#include "tools/model_report.hpp"

namespace tilemoe::cli {
namespace {

constexpr int kBandwidthRepeats = 3;

struct Measured {
  int threads = 0;
  std::size_t buffer_bytes = 0;
  double read_bytes_per_s = 0, peak_flops = 0;
};

Measured measure(kernels::Isa isa) {
  Measured m;
  numa::ThreadPool& pool = pool_for_threads(0);
  pin_caller_to_first_core();
  m.threads = pool.size();
  m.buffer_bytes = quick_bandwidth_bytes();
  m.read_bytes_per_s = measure_read_bytes_per_s(pool, m.buffer_bytes, kBandwidthRepeats);
  m.peak_flops = measure_peak_flops(pool, isa);
  return m;
}

void print_text(kernels::Isa chosen, const Measured& m) {
  using namespace kernels;
  const auto& f = cpu_features();
  std::printf("cpu features: avx2 %d, avx512f %d, avx512bw %d, avx512vl %d, avx512dq %d, avx512_bf16 %d, avx512_vnni %d, fma %d, amx_tile %d, "
              "amx_bf16 %d, amx_int8 %d\n",
              f.avx2, f.avx512f, f.avx512bw, f.avx512vl, f.avx512dq, f.avx512_bf16, f.avx512_vnni, f.fma, f.amx_tile, f.amx_bf16, f.amx_int8);
  for (Isa isa : {Isa::amx_bf16, Isa::avx512_bf16, Isa::avx2, Isa::portable}) {
    std::string why = isa_unavailable_reason(isa);
    const bool emulated = isa == Isa::amx_bf16 && f.amx_emulated;
    std::printf("  %-9s %s\n", isa_name(isa),
                !why.empty() ? ("unavailable: " + why).c_str()
                : emulated   ? "available, emulated in software (a TILEMOE_AMX_EMULATION test build; chosen only by name)"
                             : "available");
  }
  std::printf("chosen: %s (override with --isa or TILEMOE_ISA)\n", isa_name(chosen));
  if (chosen == Isa::amx_bf16)
    std::printf("products of at most 16 rows: %s of panels (this CPU's default: %s; override with TILEMOE_ONE_ROW_BLOCK)\n",
                one_row_tile_block_name(resolve_one_row_tile_block({})), one_row_tile_block_name(default_one_row_tile_block(f)));
  const auto& t = numa::system_topology();
  const std::string signature = t.cpu_signature.empty() ? std::string() : " (" + t.cpu_signature + ")";
  std::printf("cpu: %s%s, %d cores, %d hardware threads, L2 %.1f MB per core, last-level cache %.0f MB\n",
              t.cpu_model.empty() ? "unknown" : t.cpu_model.c_str(), signature.c_str(), t.cores, t.pus, t.l2_bytes_per_core / 1e6, t.llc_bytes / 1e6);
  for (const auto& n : t.nodes) std::printf("  NUMA node %d: %zu cores, %.1f GB\n", n.os_index, n.cpus.size(), n.memory_bytes / 1e9);
  std::printf("measured with %d threads: read bandwidth %.1f GB/s (%zu MiB, best of %d)", m.threads, m.read_bytes_per_s / 1e9,
              m.buffer_bytes >> 20, kBandwidthRepeats);
  if (m.peak_flops > 0) std::printf(", %s peak %.2f TFLOP/s", isa_name(chosen), m.peak_flops / 1e12);
  std::printf("\n(a short run; tilemoe bench measures both at length)\n");
}

void print_json(kernels::Isa chosen, const Measured& m) {
  using namespace kernels;
  using nlohmann::json;
  const auto& f = cpu_features();
  json isas = json::object();
  for (Isa isa : {Isa::amx_bf16, Isa::avx512_bf16, Isa::avx2, Isa::portable}) {
    std::string why = isa_unavailable_reason(isa);
    isas[isa_name(isa)] = why.empty() ? json{{"available", true}} : json{{"available", false}, {"reason", why}};
    if (isa == Isa::amx_bf16 && f.amx_emulated) isas[isa_name(isa)]["emulated"] = true;
  }
  const auto& t = numa::system_topology();
  json nodes = json::array();
  for (const auto& n : t.nodes) nodes.push_back({{"os_index", n.os_index}, {"cores", n.cpus.size()}, {"cpus", n.cpus}, {"memory_bytes", n.memory_bytes}});
  json out = {
      {"cpu_features",
       {{"avx2", f.avx2}, {"avx512f", f.avx512f}, {"avx512bw", f.avx512bw}, {"avx512vl", f.avx512vl}, {"avx512dq", f.avx512dq}, {"avx512_bf16", f.avx512_bf16},
        {"avx512_vnni", f.avx512_vnni}, {"fma", f.fma}, {"amx_tile", f.amx_tile}, {"amx_bf16", f.amx_bf16}, {"amx_int8", f.amx_int8}}},
      {"isa", isas},
      {"chosen_isa", isa_name(chosen)},
      {"one_row_tile_block", chosen == Isa::amx_bf16 ? json(one_row_tile_block_name(resolve_one_row_tile_block({}))) : json(nullptr)},
      {"cpu_model", t.cpu_model},
      {"cpu_signature", t.cpu_signature},
      {"cores", t.cores},
      {"hardware_threads", t.pus},
      {"l2_bytes_per_core", t.l2_bytes_per_core},
      {"llc_bytes", t.llc_bytes},
      {"numa_nodes", nodes},
      {"measured",
       {{"threads", m.threads},
        {"read_bandwidth_gbps", m.read_bytes_per_s / 1e9},
        {"bandwidth_buffer_bytes", m.buffer_bytes},
        {"bandwidth_repeats", kBandwidthRepeats},
        {"peak_tflops", m.peak_flops / 1e12}}},
  };
  std::printf("%s\n", out.dump().c_str());
}

}  // namespace

void add_info_command(CLI::App& app, int& status) {
  auto json_out = std::make_shared<bool>(false);
  auto model = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("info", "CPU features, the ISA chosen, cores, NUMA nodes, caches, measured read bandwidth and peak; "
                                         "with --model, what tilemoe reads of a checkpoint");
  cmd->add_flag("--json", *json_out, "One JSON object instead of text");
  cmd->add_option("--model", *model,
                  "A Hugging Face checkpoint directory: its MoE shape and layers, where each layer's experts and router are stored, "
                  "and whether tilemoe computes its router (exit status 1 when some MoE layer does not read)");
  cmd->callback([json_out, model, &status] {
    if (!model->empty()) {
      status = print_model_report(*model, *json_out);
      return;
    }
    kernels::Isa chosen = kernels::resolve_isa({});
    Measured m = measure(chosen);
    if (*json_out) print_json(chosen, m);
    else print_text(chosen, m);
    status = 0;
  });
}

}  // namespace tilemoe::cli
