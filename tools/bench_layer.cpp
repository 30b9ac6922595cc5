#include "tools/bench_layer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>

#include <sys/resource.h>

#include "amx/pack_bf16.hpp"
#include "numa/node_group.hpp"
#include "numa/topology.hpp"
#include "src/layer/moe_compute.hpp"
#include "src/layer/moe_forward.hpp"
#include "src/layer/moe_sft_layer.hpp"
#include "src/layer/synthetic_layer.hpp"
#include "src/layer/tensor_parallel_layer.hpp"
#include "src/quant/numa_slices.hpp"
#include "src/quant/quantize.hpp"
#include "tilemoe/error.hpp"
#include "tools/machine_limits.hpp"
#include "tools/onednn_baseline.hpp"

namespace tilemoe::cli {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

int iterations_for(int tokens) { return tokens <= 1 ? 300 : tokens <= 16 ? 150 : tokens <= 128 ? 60 : tokens <= 512 ? 30 : 8; }

// Routings and inputs rotate over this many sets: fresh experts at every call, as in serving.
constexpr int kInputSets = 8;

// The input set of call j (warm-up included) on `layers` layers taken in turn (layer j % layers):
// every layer gets all kInputSets sets before any (layer, set) pair comes back, so a call never
// finds the experts it reads where the same call left them one cycle of the sets before. With
// set j % 8 alone, 4 layers met the same set every 8 calls: at 1 token int4 read 30 MB a call
// and found all of it in the device's 315 MB cache (0.118 ms, time/floor 0.66).
int input_set(long j, int layers) {
  return static_cast<int>((layers % 2 == 0 ? j + j / layers : j) % kInputSets);
}

// What a call reads of one layer at `tokens` tokens: the expected number of distinct experts among
// tokens x top-k uniform choices, E (1 - (1 - k/E)^T), times one expert's bytes.
double bytes_read_per_call(const MoeShape& s, std::size_t layer_bytes, int tokens) {
  const double e = s.num_experts, k = s.top_k;
  const double experts = e * (1.0 - std::pow(1.0 - k / e, std::max(tokens, 1)));
  return static_cast<double>(layer_bytes) / e * std::min(experts, e);
}

// Memory the system can still give, from /proc/meminfo (0 where unknown).
double available_memory_bytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return 0;
  char line[256];
  double kib = 0;
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::sscanf(line, "MemAvailable: %lf kB", &kib) == 1) break;
  std::fclose(f);
  return kib * 1024.0;
}

// The routings and inputs of one token count (seeds 100+ and 200+): the bench's cases and the
// oneDNN baseline see the same ones.
struct BenchInputs {
  std::vector<RandomRouting> routings;
  std::vector<std::vector<bf16>> x;
};
BenchInputs make_inputs(const MoeShape& s, int tokens) {
  BenchInputs in;
  for (int i = 0; i < kInputSets; ++i) {
    in.routings.push_back(random_routing(tokens, s, 100 + i));
    const auto x = random_activations(static_cast<std::size_t>(tokens) * s.hidden, 200 + i);
    in.x.push_back(to_bf16(x.data(), x.size()));
  }
  return in;
}

// The process's page faults so far (getrusage: every thread's).
struct PageFaults {
  double minor = 0, major = 0;
  PageFaults operator-(const PageFaults& o) const { return {minor - o.minor, major - o.major}; }
};
PageFaults page_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return {static_cast<double>(u.ru_minflt), static_cast<double>(u.ru_majflt)};
}

// One case: a LoRA rank, factor type, node count, int4 group size and one-row tile block, with
// layers of its own.
// The cases take turns call by call, so that they are compared under the same conditions (drift
// within a run, not between runs): the LoRA cost and the split's cost are differences of a few
// percent, and the device's instances drift by 10-30 % within a minute.
struct BenchCase {
  int rank = 0;
  std::size_t group_index = 0;
  std::size_t block_index = 0;  // into LayerBenchOptions::one_row_blocks
  numa::NodeGroup* nodes = nullptr;
  std::unique_ptr<LayerLora> lora, grads;          // the layers read them in place
  std::unique_ptr<LayerLoraBf16> lora16, grads16;  // --lora-dtype bf16: factors and gradients in bf16 instead
  bool lora_bf16 = false;
  std::vector<std::unique_ptr<TensorParallelLayer>> layers;
  int slices = 1;
};

// Every case's layers, and what the report needs of the machine and of the set-up.
struct BenchSetup {
  std::vector<BenchCase> cases;
  int layers = 0;                       // per case
  double bandwidth = 0, peak = 0;       // measured: bytes/s, the ISA's bf16 products/s
  std::vector<numa::ReadPatternFigures> read_patterns;  // what makes up `bandwidth`, GB/s
  double product_peak = 0;              // the peak of the weight type's products
  double made_s = 0, quantized_s = 0, packed_s = 0;
  double reuse_bytes = 0, llc_bytes = 0;  // read between two calls of a layer at min_tokens; the cache
  int min_tokens = 1;
  std::vector<OnednnMoeBaseline> baselines;  // --onednn: as many layers as a case has
};

// Whether a rank and factor type make a case of their own: rank 0 has no factors to store, so it
// makes one case whatever the factor types.
bool is_case(const LayerBenchOptions& o, int rank, bool lora_bf16) { return rank != 0 || lora_bf16 == o.lora_bf16[0]; }

// Refuses, before allocating, a run that cannot fit in the memory available: the bf16 source, its
// quantized copies and the fewest layers the bench runs (2 a case) with their Wᵀ copies and the
// oneDNN baseline's. Past that the kernel's OOM killer would end the process half-way through
// packing (DeepSeek-V3 in bf16 needs about 68 GB with one case).
void check_memory(const LayerBenchOptions& o) {
  const double available = available_memory_bytes();
  if (available <= 0) return;
  const MoeShape& s = o.shape;
  int cases = 0;
  for (int rank : o.ranks)
    for (bool lora_bf16 : o.lora_bf16)
      if (is_case(o, rank, lora_bf16)) cases += static_cast<int>(o.node_counts.size() * o.group_sizes.size() * o.one_row_blocks.size());
  const bool bf16_weights = o.weight_type == WeightType::bf16;
  const double params = static_cast<double>(s.num_experts) * 3.0 * s.hidden * s.intermediate;
  const double packed = params * (bf16_weights ? 2.0 : o.weight_type == WeightType::int8 ? 1.0 : 0.53);
  const double quantized = bf16_weights ? 0.0 : packed * static_cast<double>(o.group_sizes.size());
  const double layer = packed * (o.weight_copy && bf16_weights ? 2.0 : 1.0);
  const double need = 2.0 * params + quantized + 2.0 * cases * layer + (o.onednn ? 2.0 * packed : 0.0);
  if (need <= available) return;
  char text[400];
  std::snprintf(text, sizeof text,
                "bench --shape %s with %s weights needs about %.0f GB (the bf16 source and 2 layers for each of %d case%s), "
                "and this machine has %.0f GB available: try %sfewer cases (--lora-rank, --lora-dtype, "
                "--numa-nodes, --group-size, --one-row-block) or a smaller --shape",
                o.shape_name.c_str(), o.weights_name.c_str(), need / 1e9, cases, cases == 1 ? "" : "s", available / 1e9,
                o.weight_type == WeightType::int4 ? "" : "--weights int4, ");
  fail(ErrorKind::unsupported, text);
}

BenchSetup make_cases(const LayerBenchOptions& o, numa::ThreadPool& pool, const numa::Topology& topo) {
  const MoeShape& s = o.shape;
  check_memory(o);
  BenchSetup b;
  b.bandwidth = measure_read_bytes_per_s(pool, std::size_t(2) << 30, 5, &b.read_patterns);
  b.peak = measure_peak_flops(pool, o.isa);
  auto t0 = Clock::now();
  ExpertWeights source = random_expert_weights(s, 1, &pool);
  b.made_s = seconds_since(t0);
  std::vector<quant::QuantizedExperts> quantized(o.group_sizes.size());  // one per group size
  if (o.weight_type != WeightType::bf16) {
    t0 = Clock::now();
    for (std::size_t gi = 0; gi < o.group_sizes.size(); ++gi)
      quantized[gi] = quant::quantize_experts(source.view(), o.weight_type, o.group_sizes[gi], &pool);
    b.quantized_s = seconds_since(t0);
  }
  // Every layer is a tensor-parallel layer: with one node it is the plain layer, no split.
  const int max_tokens = std::max(1, *std::max_element(o.tokens.begin(), o.tokens.end()));
  auto pack_slice_of = [&](std::size_t gi) -> TensorParallelLayer::PackSlice {
    return [&, gi](quant::IntermediateSlice sl, numa::ThreadPool& node_pool, int node) {
      return o.weight_type == WeightType::bf16 ? PackedExpertWeights::pack_slice(source.view(), sl, node_pool, node)
                                               : PackedExpertWeights::pack_quantized_slice(quantized[gi], sl, node_pool, node);
    };
  };
  SftLayerOptions layer_options{max_tokens, o.backward ? 1 : 0, *std::max_element(o.ranks.begin(), o.ranks.end()), s.top_k};
  layer_options.backward_weight_copy = o.weight_copy;
  t0 = Clock::now();
  auto new_layer = [&](const BenchCase& c) {
    return std::make_unique<TensorParallelLayer>(s, o.weight_type, o.group_sizes[c.group_index], *c.nodes, o.isa, layer_options,
                                                 pack_slice_of(c.group_index));
  };
  for (int rank : o.ranks)
    for (bool lora_bf16 : o.lora_bf16)
      for (int n : o.node_counts)
        for (std::size_t gi = 0; gi < o.group_sizes.size(); ++gi)
          for (std::size_t bi = 0; bi < o.one_row_blocks.size(); ++bi) {
            if (!is_case(o, rank, lora_bf16)) continue;
            BenchCase c;
            c.rank = rank;
            c.lora_bf16 = lora_bf16;
            c.group_index = gi;
            c.block_index = bi;
            c.nodes = &node_group_for(pool, n);
            c.lora = std::make_unique<LayerLora>(random_lora(s, rank, 2.0f * std::max(rank, 1), 3));
            c.grads = std::make_unique<LayerLora>(c.lora->zeros_like());
            if (c.lora_bf16) {
              c.lora16 = std::make_unique<LayerLoraBf16>(round_lora_to_bf16(*c.lora));
              c.grads16 = std::make_unique<LayerLoraBf16>(round_lora_to_bf16(*c.grads));
            }
            c.layers.push_back(new_layer(c));
            c.slices = c.layers[0]->node_count();
            b.cases.push_back(std::move(c));
          }
  // Enough layers that a layer's weights have left the last-level cache when it is called again:
  // between two calls of one case's layer the run reads `layers` calls of every case, which at the
  // smallest token count must come to 4 times the cache. Few tokens read a few experts of a layer
  // (at 1 token int4 reads 30 MB of a 0.32 GB DeepSeek-V2-Lite layer), so they need the most
  // layers. Within 60 % of the memory available; where that binds, the header says so.
  const int min_tokens = std::max(1, *std::min_element(o.tokens.begin(), o.tokens.end()));
  double read_per_round = 0, bytes_per_layer = 0;
  for (const BenchCase& c : b.cases) {
    read_per_round += bytes_read_per_call(s, c.layers[0]->streamed_weight_bytes(), min_tokens);
    bytes_per_layer += static_cast<double>(c.layers[0]->weight_bytes() + c.layers[0]->weight_copy_bytes());
  }
  if (o.onednn) bytes_per_layer += static_cast<double>(b.cases[0].layers[0]->weight_bytes());
  const double llc = static_cast<double>(std::max<std::size_t>(topo.llc_bytes, 1 << 20));
  const int wanted = std::max(2, static_cast<int>(std::ceil(4 * llc / std::max(read_per_round, 1.0))));
  const double memory = available_memory_bytes();
  const int affordable = memory > 0 ? static_cast<int>(0.6 * memory / std::max(bytes_per_layer, 1.0)) : wanted;
  b.layers = o.layers > 0 ? o.layers : std::max(2, std::min(wanted, affordable));
  b.reuse_bytes = static_cast<double>(b.layers) * read_per_round;
  b.llc_bytes = llc;
  b.min_tokens = min_tokens;
  for (BenchCase& c : b.cases) {
    while (static_cast<int>(c.layers.size()) < b.layers) c.layers.push_back(new_layer(c));
    for (auto& l : c.layers) l->update_lora_weights(c.lora16 ? lora_view(*c.lora16) : lora_view(*c.lora), o.lora_held);
  }
  b.packed_s = seconds_since(t0);
  if (o.onednn) {
    if (o.weight_type != WeightType::bf16) fail(ErrorKind::invalid_argument, "--onednn compares bf16 weights; leave --weights at bf16");
    for (int l = 0; l < b.layers; ++l) b.baselines.emplace_back(source.view());
  }
  // Integer products: VPDPBUSD and TDPBSSD do twice the multiply-adds of their bf16 twins per
  // instruction (AVX2's VPMADDUBSW + VPMADDWD about twice the f32 multiply + add pairs), so the
  // floor takes the integer peak as twice the measured bf16 one. MXFP4 weights are multiplied as bf16.
  b.product_peak = is_integer_weight_type(o.weight_type) ? 2 * b.peak : b.peak;
  return b;
}

void print_header(const LayerBenchOptions& o, const BenchSetup& b, const numa::Topology& topo, const numa::ThreadPool& pool) {
  const MoeShape& s = o.shape;
  const std::vector<BenchCase>& cases = b.cases;
  char clamp[48] = "";
  if (s.swiglu_limit > 0) std::snprintf(clamp, sizeof clamp, ", swiglu_limit %g", s.swiglu_limit);
  std::printf("tilemoe bench: shape %s (hidden %d, intermediate %d, %d experts, top-%d%s), isa %s, %d threads\n", o.shape_name.c_str(),
              s.hidden, s.intermediate, s.num_experts, s.top_k, clamp, kernels::isa_label(o.isa).c_str(), pool.size());
  const std::string signature = topo.cpu_signature.empty() ? std::string() : " (" + topo.cpu_signature + ")";
  std::printf("machine: %s%s, %d cores, LLC %.0f MB; measured read bandwidth %.1f GB/s, %s peak %.2f TFLOP/s\n", topo.cpu_model.c_str(),
              signature.c_str(), topo.cores, topo.llc_bytes / 1e6, b.bandwidth / 1e9, kernels::isa_label(o.isa).c_str(), b.peak / 1e12);
  // The floor's bandwidth is the best of these; a decode figure is read against the pattern it resembles.
  std::printf("read patterns, best / median GB/s:");
  for (std::size_t i = 0; i < b.read_patterns.size(); ++i)
    std::printf("%s %s %.1f / %.1f", i > 0 ? ";" : "", b.read_patterns[i].name, b.read_patterns[i].best, b.read_patterns[i].median);
  std::printf("\n");
  std::printf("weights: %s, %d layers per case of", o.weights_name.c_str(), b.layers);
  for (const BenchCase& c : cases)
    if (c.rank == cases[0].rank && c.lora_bf16 == cases[0].lora_bf16 && c.nodes == cases[0].nodes && c.block_index == 0)
      std::printf("%s %.2f GB%s", c.group_index > 0 ? "," : "", c.layers[0]->weight_bytes() / 1e9,
                  o.weight_type == WeightType::int4 ? (" (group " + std::to_string(o.group_sizes[c.group_index]) + ")").c_str() : "");
  std::printf(" packed (made in %.1f s, quantized in %.1f s, packed in %.1f s)\n", b.made_s, b.quantized_s, b.packed_s);
  std::printf("a layer is called again after %.0f MB of weights read at %d token%s (LLC %.0f MB)%s\n", b.reuse_bytes / 1e6, b.min_tokens,
              b.min_tokens == 1 ? "" : "s", b.llc_bytes / 1e6,
              b.reuse_bytes < 4 * b.llc_bytes ? ": fewer than 4 LLCs, so some weights may still be in cache (more layers: --layers, memory)" : "");
  for (const BenchCase& c : cases) {
    if (c.rank != cases[0].rank) break;                    // the same splits for every rank
    if (c.lora_bf16 != cases[0].lora_bf16) continue;       // and factor type
    if (c.group_index != 0 || c.block_index != 0) continue;  // and every group size and block
    std::printf("NUMA: %d node(s) (%s), each layer split in %d slice(s) of the intermediate size:", c.nodes->size(),
                static_cast<std::size_t>(c.nodes->size()) == topo.nodes.size() ? "the machine's" : "virtual", c.slices);
    for (int n = 0; n < c.slices; ++n)
      std::printf(" [%d, %d) on %d threads", c.layers[0]->slice(n).begin, c.layers[0]->slice(n).end, c.nodes->pool(n).size());
    std::printf("\n");
  }
  if (cases.size() > 1)
    std::printf("the cases (LoRA ranks x factor types x node counts x group sizes x one-row blocks) take turns call by call\n");
  if (o.isa == kernels::Isa::amx_bf16) {
    std::printf("products of at most 16 rows (AMX bf16): 1 x 2 or 1 x 4 panel blocks,");
    for (std::size_t i = 0; i < o.one_row_blocks.size(); ++i)
      std::printf("%s %s", i > 0 ? "," : "", kernels::one_row_tile_block_name(o.one_row_blocks[i]));
    std::printf(" (this CPU's default: %s)\n", kernels::one_row_tile_block_name(kernels::default_one_row_tile_block(kernels::cpu_features())));
  }
  if (o.backward)
    std::printf("fine-tuning step: forward_sft + backward, LoRA gradients %s; floor counts the weights read twice\n",
                o.grad_overwrite ? "overwritten (every expert zeroed)" : "accumulated (the experts touched only)");
  if (o.lora_held) std::printf("LoRA held by the layers (as a loaded adapter): packed once\n");
  if (o.backward && o.weight_copy)
    std::printf("backward reads a Wt copy of the weights: %.2f GB per layer besides the packed %.2f GB\n",
                cases[0].layers[0]->weight_copy_bytes() / 1e9, cases[0].layers[0]->weight_bytes() / 1e9);
  std::printf("%6s %5s %5s %6s %9s %9s %9s %8s %9s %10s %11s%s%s%s%s\n", "tokens", "rank", "nodes", "iters", "median_ms", "min_ms", "GB/s",
              "TFLOP/s", "floor_ms", "time/floor", "node_GB/s", o.backward ? "    fwd_ms    bwd_ms" : "", " lora",
              o.group_sizes.size() > 1 ? " group" : "", o.one_row_blocks.size() > 1 ? " block" : "");
}

// Phases are node 0's: the nodes run theirs at the same time.
void reset_phases(BenchSetup& b) {
  for (BenchCase& c : b.cases)
    for (auto& l : c.layers)
      l->node_layer(0).forward_pass().reset_phase_seconds(), l->node_layer(0).backward_pass().reset_phase_seconds(), l->reset_timings();
}

// Every case's timed calls at one token count.
struct TokenRun {
  struct Times {
    std::vector<double> ms, fwd_ms, bwd_ms;
  };
  int iters = 0;
  std::vector<Times> times;  // per case, call by call
  double experts_sum = 0;    // experts touched, summed over the timed calls
  PageFaults faults;         // over the timed calls
};

TokenRun time_cases(const LayerBenchOptions& o, BenchSetup& b, int tokens) {
  const MoeShape& s = o.shape;
  std::vector<BenchCase>& cases = b.cases;
  const BenchInputs in = make_inputs(s, tokens);
  const std::vector<RandomRouting>& routings = in.routings;
  const std::vector<std::vector<bf16>>& inputs = in.x;
  std::vector<std::vector<float>> grad_outs;
  for (int i = 0; i < kInputSets && o.backward; ++i)
    grad_outs.push_back(random_activations(static_cast<std::size_t>(tokens) * s.hidden, 300 + i));
  std::vector<float> out(static_cast<std::size_t>(tokens) * s.hidden), grad_in(out.size());
  TokenRun run;
  run.iters = std::max(3, static_cast<int>(iterations_for(tokens) * o.iter_scale));
  run.times.resize(cases.size());
  // Warm-up: every layer is called once (its buffers grow and are first touched then) and at
  // least twice in all. With fewer, a case whose layers outnumber the timed calls (int4's
  // many small layers at 4096 tokens) timed first touches: medians of 300-400 ms against
  // minima of 80-100 on the device.
  const int warm = std::max(2, b.layers);
  PageFaults faults_before{};
  numa::NodeGroup* last_group = nullptr;
  for (int i = -warm; i < run.iters; ++i) {
    const int set = input_set(i + warm, b.layers), layer = (i + warm) % b.layers;
    if (i == 0) reset_phases(b), faults_before = page_faults();  // the phases' means are of the timed calls only
    const auto& r = routings[set];
    // The order of the cases rotates call by call: each call's routing and input are shared by
    // the cases, and the case that runs after another found them in cache (about 3 % faster
    // on the device with identical code).
    for (std::size_t turn = 0; turn < cases.size(); ++turn) {
      const std::size_t c = (turn + static_cast<std::size_t>(i + warm)) % cases.size();
      TensorParallelLayer& l = *cases[c].layers[static_cast<std::size_t>(layer)];
      // Node counts have thread groups of their own on the same cores. The previous call's
      // group would poll for work for its spin time (100 us) on the cores this call needs:
      // on the device that made 1-token calls 5-12 % slower for both node counts than in
      // runs of one node count. Parked, it sleeps, as it would in a process of its own.
      if (last_group != nullptr && last_group != cases[c].nodes) last_group->park();
      last_group = cases[c].nodes;
      kernels::set_one_row_tile_block(o.one_row_blocks[cases[c].block_index]);
      auto t = Clock::now();
      double f_ms = 0;
      l.forward_sft(tokens, s.top_k, inputs[set].data(), r.expert_ids.data(), r.weights.data(), out.data(), o.backward);
      if (o.backward) {
        f_ms = seconds_since(t) * 1e3;
        const BenchCase& cs = cases[c];
        l.backward(grad_outs[set].data(), grad_in.data(), cs.grads16 ? lora_grad_view(*cs.grads16) : lora_grad_view(*cs.grads),
                   !o.grad_overwrite);
      }
      double dt = seconds_since(t) * 1e3;
      if (i < 0) continue;
      run.times[c].ms.push_back(dt);
      run.times[c].fwd_ms.push_back(f_ms);
      run.times[c].bwd_ms.push_back(dt - f_ms);
    }
    if (i < 0) continue;
    std::vector<char> touched(s.num_experts, 0);
    for (auto e : r.expert_ids) touched[e] = 1;
    run.experts_sum += static_cast<double>(std::count(touched.begin(), touched.end(), 1));
  }
  run.faults = page_faults() - faults_before;
  return run;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// --phases for case c: node 0's mean ms per call of each phase, and with several nodes the merge,
// when each node started and ended, and the items other nodes' idle workers ran.
void print_case_phases(const LayerBenchOptions& o, const BenchCase& cs, int iters) {
  auto print_phases = [&](const char* what, int count, auto name, auto seconds) {
    std::printf("        %s phases, mean ms per call:", what);
    for (int i = 0; i < count; ++i) std::printf(" %s %.3f", name(i), seconds(i) * 1e3 / iters);
    std::printf("\n");
  };
  print_phases("forward", MoeForward::kPhases, MoeForward::phase_name, [&](int i) {
    double t = 0;
    for (auto& l : cs.layers) t += l->node_layer(0).forward_pass().phase_seconds()[i];
    return t;
  });
  const int split = cs.slices;
  if (split > 1) {
    double merge = 0;
    for (auto& l : cs.layers) merge += l->merge_seconds();
    std::printf("        merge of the %d nodes' partial rows, mean ms per call: %.3f\n", split, merge * 1e3 / iters);
    if (!o.backward) {
      std::vector<double> start(static_cast<std::size_t>(split)), end(start.size()), guests(start.size());
      double all = 0;
      for (auto& l : cs.layers) {
        const auto& t = l->forward_node_seconds();
        for (std::size_t n = 0; n < t.start.size() && n < start.size(); ++n) start[n] += t.start[n], end[n] += t.end[n], guests[n] += t.guest_items[n];
        all += t.all;
      }
      std::printf("        nodes, mean ms from the call's start (started / ended):");
      for (std::size_t n = 0; n < start.size(); ++n) std::printf(" node %zu %.3f / %.3f", n, start[n] * 1e3 / iters, end[n] * 1e3 / iters);
      std::printf("; all ended %.3f\n", all * 1e3 / iters);
      std::printf("        items run by other nodes' idle workers, mean per call:");
      for (std::size_t n = 0; n < start.size(); ++n) std::printf(" node %zu %.1f", n, guests[n] / iters);
      std::printf("\n");
    }
  }
  if (o.backward)
    print_phases("backward", MoeBackward::kPhases, MoeBackward::phase_name, [&](int i) {
      double t = 0;
      for (auto& l : cs.layers) t += l->node_layer(0).backward_pass().phase_seconds()[i];
      return t;
    });
}

// Case c's line at this token count: median and minimum, the bytes and products it implies, the
// floor, and its LoRA's cost over the matching r=0 case. Returns its median.
double report_case(const LayerBenchOptions& o, const BenchSetup& b, const TokenRun& run, std::size_t c, int tokens, int threads) {
  const MoeShape& s = o.shape;
  const std::vector<BenchCase>& cases = b.cases;
  const BenchCase& cs = cases[c];
  const int rank = cs.rank, iters = run.iters;
  // The factors read per expert: the caller's A and B (f32 or bf16); or, held, their packed bf16 forms
  // (B's rank padded to a whole k-block of 32, or to 16 in the short panel form, pack_bf16.hpp) where
  // experts have the rows for that form.
  std::size_t lora_bytes_per_expert = 0;
  const std::size_t rank_padded = rank > 0 ? kernels::compact_panel_elements(rank) / kernels::kPanelColumns : 0;
  const bool packed_form = o.lora_held && static_cast<double>(tokens) * s.top_k * iters >= 16.0 * run.experts_sum;
  for (Projection p : kProjections)
    lora_bytes_per_expert += packed_form ? (rank * projection_in(s, p) + rank_padded * projection_out(s, p)) * sizeof(bf16)
                                         : static_cast<std::size_t>(rank) * (projection_in(s, p) + projection_out(s, p)) *
                                               (cs.lora_bf16 ? sizeof(bf16) : sizeof(float));
  // What the floor counts: the codes and one form of their scales (PackedExpertWeights::streamed_bytes).
  const std::size_t bytes_per_expert = cs.layers[0]->streamed_weight_bytes() / static_cast<std::size_t>(s.num_experts);
  const double bytes = (o.backward ? 2.0 : 1.0) * run.experts_sum / iters * static_cast<double>(bytes_per_expert + lora_bytes_per_expert);
  // Backward does twice the forward's products (dH through down, dX through gate and up).
  double flops = (o.backward ? 3.0 : 1.0) * 2.0 * tokens * s.top_k *
                 (3.0 * s.hidden * s.intermediate + rank * (2.0 * s.hidden + 2.0 * s.intermediate + s.intermediate + s.hidden));
  double floor_ms = std::max(bytes / b.bandwidth, b.product_peak > 0 ? flops / b.product_peak : 0.0) * 1e3;
  const int split = cs.slices;
  const TokenRun::Times& t = run.times[c];
  double median = median_of(t.ms), fwd_median = median_of(t.fwd_ms), bwd_median = median_of(t.bwd_ms);
  double min_ms = *std::min_element(t.ms.begin(), t.ms.end());
  // The LoRA's cost over the r=0 case of the same node count and group size: the median of the
  // call-by-call ratios. Each pair of calls shares its routing, input and moment, so the drift of
  // the machine within a run (10-30 % a minute on the device) cancels, which it does not in the
  // ratio of two medians.
  double lora_cost = 0;
  bool has_lora_cost = false;
  for (std::size_t c0 = 0; c0 < cases.size() && rank > 0; ++c0) {
    const BenchCase& base = cases[c0];
    if (base.rank != 0 || base.nodes != cs.nodes || base.group_index != cs.group_index || base.block_index != cs.block_index) continue;
    std::vector<double> ratios(t.ms.size());
    for (std::size_t i = 0; i < ratios.size(); ++i) ratios[i] = t.ms[i] / run.times[c0].ms[i];
    lora_cost = median_of(ratios) - 1.0;
    has_lora_cost = true;
    break;
  }
  // Each read pattern's best and median GB/s, so that a floor's bandwidth can be weighed.
  std::string patterns;
  for (const numa::ReadPatternFigures& f : b.read_patterns) {
    char one[160];
    std::snprintf(one, sizeof one, "%s\"%s\":[%.2f,%.2f]", patterns.empty() ? "" : ",", f.name, f.best, f.median);
    patterns += one;
  }
  if (o.json)
    std::printf("{\"shape\":\"%s\",\"weights\":\"%s\",\"tokens\":%d,\"lora_rank\":%d,\"isa\":\"%s\",\"threads\":%d,\"backward\":%s,\"ms\":%.4f,"
                "\"min_ms\":%.4f,\"fwd_ms\":%.4f,\"bwd_ms\":%.4f,\"floor_ms\":%.4f,\"time_over_floor\":%.3f,\"gbps\":%.2f,"
                "\"tflops\":%.3f,\"bandwidth_gbps\":%.2f,\"peak_tflops\":%.3f,\"layers\":%d,\"iters\":%d,\"numa_nodes\":%d,"
                "\"node_gbps\":%.2f,\"read_patterns_gbps\":{%s},\"group_size\":%d,\"lora_dtype\":\"%s\",\"one_row_block\":\"%s\","
                "\"cpu_signature\":\"%s\"%s}\n",
                o.shape_name.c_str(), o.weights_name.c_str(), tokens, rank, kernels::isa_name(o.isa), threads, o.backward ? "true" : "false",
                median, min_ms, o.backward ? fwd_median : median, o.backward ? bwd_median : 0.0, floor_ms, median / floor_ms,
                bytes / median / 1e6, flops / median / 1e9, b.bandwidth / 1e9, b.peak / 1e12, b.layers, iters, split,
                bytes / split / median / 1e6, patterns.c_str(), o.weight_type == WeightType::int4 ? o.group_sizes[cs.group_index] : 0,
                cs.rank == 0 ? "none" : cs.lora_bf16 ? "bf16" : "f32", kernels::one_row_tile_block_name(o.one_row_blocks[cs.block_index]),
                numa::system_topology().cpu_signature.c_str(),
                has_lora_cost ? (",\"lora_cost\":" + std::to_string(lora_cost)).c_str() : "");
  else if (o.backward)
    std::printf("%6d %5d %5d %6d %9.3f %9.3f %9.1f %8.2f %9.3f %10.2f %11.1f %9.3f %9.3f", tokens, rank, split, iters, median, min_ms,
                bytes / median / 1e6, flops / median / 1e9, floor_ms, median / floor_ms, bytes / split / median / 1e6, fwd_median,
                bwd_median);
  else
    std::printf("%6d %5d %5d %6d %9.3f %9.3f %9.1f %8.2f %9.3f %10.2f %11.1f", tokens, rank, split, iters, median, min_ms,
                bytes / median / 1e6, flops / median / 1e9, floor_ms, median / floor_ms, bytes / split / median / 1e6);
  if (!o.json) {
    const char* lora = rank == 0 ? "-" : cs.lora_bf16 ? "bf16" : "f32";
    std::printf(" %4s", lora);
    if (o.group_sizes.size() > 1) std::printf(" %d", o.group_sizes[cs.group_index]);
    if (o.one_row_blocks.size() > 1) std::printf(" %s", kernels::one_row_tile_block_name(o.one_row_blocks[cs.block_index]));
    std::printf("\n");
  }
  if (!o.json && has_lora_cost) std::printf("        LoRA over r=0, median of the call-by-call ratios: %+.1f %%\n", 100.0 * lora_cost);
  if (o.phases) print_case_phases(o, cs, iters);
  return median;
}

// Times the oneDNN baseline on the same routings and inputs as the bench (make_inputs), rotating
// through its layers, and prints the ratio of tilemoe's r=0 median to its median.
void run_onednn_baseline(std::vector<OnednnMoeBaseline>& baselines, const MoeShape& s, const std::vector<int>& token_list,
                         const std::vector<std::pair<int, double>>& r0_medians, double iter_scale, bool json, numa::ThreadPool& pool,
                         TensorParallelLayer& ours_layer) {
  const int threads = pool.size();
  // The baseline must compute the same layer: its output on the first routing against tilemoe's (r=0).
  LayerLora no_lora = random_lora(s, 0, 1.0f, 3);
  ours_layer.update_lora_weights(lora_view(no_lora));
  const std::string dtype = baselines[0].data_type();
  if (!json) std::printf("oneDNN baseline (%s, %s%s; a matmul per expert and projection, weights prepacked, no LoRA); r0_ratio: tilemoe r=0 / it\n"
                         "%6s %6s %9s %9s %14s %9s\n",
                         baselines[0].implementation().c_str(), dtype.c_str(), dtype == "bf16" ? "" : ": oneDNN has no bf16 matmul on this CPU",
                         "tokens", "iters", "median_ms", "min_ms", "r0_ratio", "rel_diff");
  const int layers = static_cast<int>(baselines.size());
  for (int tokens : token_list) {
    if (tokens == 0) continue;
    const BenchInputs in = make_inputs(s, tokens);
    const std::vector<RandomRouting>& routings = in.routings;
    const std::vector<std::vector<bf16>>& inputs = in.x;
    std::vector<float> out(static_cast<std::size_t>(tokens) * s.hidden);
    const int iters = std::max(3, static_cast<int>(iterations_for(tokens) * iter_scale));
    // Every routing once on every layer first: the primitives for its row counts are made then.
    for (auto& b : baselines)
      for (int set = 0; set < kInputSets; ++set)
        b.forward(tokens, s.top_k, inputs[set].data(), routings[set].expert_ids.data(), routings[set].weights.data(), out.data(), pool);
    std::vector<double> ms;
    for (int i = -2; i < iters; ++i) {
      const int set = input_set(i + 2, layers), layer = (i + 2) % layers;
      auto t = Clock::now();
      baselines[static_cast<std::size_t>(layer)].forward(tokens, s.top_k, inputs[set].data(), routings[set].expert_ids.data(),
                                                         routings[set].weights.data(), out.data(), pool);
      if (i >= 0) ms.push_back(seconds_since(t) * 1e3);
    }
    const double median = median_of(ms), min_ms = *std::min_element(ms.begin(), ms.end());
    std::vector<float> theirs(out.size()), mine(out.size());
    baselines[0].forward(tokens, s.top_k, inputs[0].data(), routings[0].expert_ids.data(), routings[0].weights.data(), theirs.data(), pool);
    ours_layer.forward_sft(tokens, s.top_k, inputs[0].data(), routings[0].expert_ids.data(), routings[0].weights.data(), mine.data(), false);
    double diff = 0, norm = 0;
    for (std::size_t i = 0; i < mine.size(); ++i) diff += double(theirs[i] - mine[i]) * (theirs[i] - mine[i]), norm += double(mine[i]) * mine[i];
    const double rel_diff = std::sqrt(diff / std::max(norm, 1e-300));
    double ours = 0;
    for (auto [t, m] : r0_medians)
      if (t == tokens) ours = m;
    if (json)
      std::printf("{\"baseline\":\"onednn\",\"dtype\":\"%s\",\"tokens\":%d,\"threads\":%d,\"ms\":%.4f,\"min_ms\":%.4f,\"tilemoe_r0_ms\":%.4f,\"ratio\":%.4g,"
                  "\"rel_diff\":%.2e}\n",
                  dtype.c_str(), tokens, threads, median, min_ms, ours, ours > 0 ? ours / median : 0.0, rel_diff);
    else if (ours > 0)
      std::printf("%6d %6d %9.3f %9.3f %14.4g %9.2e\n", tokens, iters, median, min_ms, ours / median, rel_diff);
    else
      std::printf("%6d %6d %9.3f %9.3f %14s %9.2e\n", tokens, iters, median, min_ms, "-", rel_diff);
    std::fflush(stdout);
  }
}

}  // namespace

void run_layer_bench(const LayerBenchOptions& o) {
  numa::ThreadPool& pool = pool_for_threads(o.threads);
  const auto& topo = numa::system_topology();
  pin_caller_to_first_core();
  BenchSetup b = make_cases(o, pool, topo);
  if (!o.json) print_header(o, b, topo, pool);
  std::vector<std::pair<int, double>> r0_medians;  // (tokens, ms) of the first node count, r=0
  for (int tokens : o.tokens) {
    if (tokens == 0) continue;
    const TokenRun run = time_cases(o, b, tokens);
    for (std::size_t c = 0; c < b.cases.size(); ++c) {
      const double median = report_case(o, b, run, c, tokens, pool.size());
      if (b.cases[c].rank == 0 && b.cases[c].nodes == b.cases[0].nodes && b.cases[c].block_index == 0 && !o.backward) r0_medians.emplace_back(tokens, median);
    }
    if (o.phases) {
      // A layer call that touches fresh pages (a buffer freed and allocated again, memory the
      // hypervisor took back) pays microseconds a page, which no phase shows by itself.
      const double calls = static_cast<double>(run.iters) * static_cast<double>(b.cases.size());
      std::printf("        page faults per layer call (all cases): minor %.1f, major %.1f\n", run.faults.minor / calls, run.faults.major / calls);
      reset_phases(b);
    }
    std::fflush(stdout);
  }
  if (!b.baselines.empty()) run_onednn_baseline(b.baselines, o.shape, o.tokens, r0_medians, o.iter_scale, o.json, pool, *b.cases[0].layers[0]);
}

}  // namespace tilemoe::cli
