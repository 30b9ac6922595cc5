// `tilemoe bench`: one MoE layer's forward over token counts, against this machine's measured
// limits (read bandwidth for decode, the ISA's dot-product peak for large batches), with
// weights spread over enough layers that they do not sit in the last-level cache.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <sstream>

#include <sys/resource.h>

#include "amx/pack_bf16.hpp"
#include "numa/topology.hpp"
#include "src/layer/moe_compute.hpp"
#include "src/layer/moe_forward.hpp"
#include "src/layer/moe_sft_layer.hpp"
#include "src/layer/tensor_parallel_layer.hpp"
#include "numa/node_group.hpp"
#include "src/quant/numa_slices.hpp"
#include "src/layer/synthetic_layer.hpp"
#include "src/quant/quantize.hpp"
#include "tilemoe/error.hpp"
#include "tools/cli_common.hpp"
#include "tools/machine_limits.hpp"
#include "tools/onednn_baseline.hpp"

namespace tilemoe::cli {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<int> parse_int_list(const std::string& s, const char* what) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      std::size_t used = 0;
      int v = std::stoi(item, &used);
      if (used != item.size() || v < 0) throw std::invalid_argument(item);
      out.push_back(v);
    } catch (const std::exception&) {
      fail(ErrorKind::invalid_argument, std::string(what) + ": '" + item + "' is not a non-negative integer");
    }
  }
  if (out.empty()) fail(ErrorKind::invalid_argument, std::string(what) + " is empty");
  return out;
}

// --lora-dtype: per entry, whether the LoRA factors are stored as bf16 (else f32).
std::vector<bool> parse_lora_dtypes(const std::string& s) {
  std::vector<bool> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item != "f32" && item != "bf16") fail(ErrorKind::invalid_argument, "--lora-dtype " + s + ": '" + item + "' is neither f32 nor bf16");
    out.push_back(item == "bf16");
  }
  if (out.empty()) fail(ErrorKind::invalid_argument, "--lora-dtype is empty");
  return out;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

int iterations_for(int tokens) { return tokens <= 1 ? 300 : tokens <= 16 ? 150 : tokens <= 128 ? 60 : tokens <= 512 ? 30 : 8; }

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

}  // namespace


namespace {

// Times the oneDNN baseline on the same routings and inputs as the bench (seeds 100+ and 200+),
// rotating through its layers, and prints the ratio of tilemoe's r=0 median to its median.
void run_onednn_baseline(std::vector<OnednnMoeBaseline>& baselines, const MoeShape& s, const std::vector<int>& token_list,
                         const std::vector<std::pair<int, double>>& r0_medians, double iter_scale, bool json, numa::ThreadPool& pool,
                         TensorParallelLayer& ours_layer) {
  const int threads = pool.size();
  // The baseline must compute the same layer: its output on the first routing against tilemoe's (r=0).
  LayerLora no_lora = random_lora(s, 0, 1.0f, 3);
  ours_layer.update_lora_weights(lora_view(no_lora));
  if (!json) std::printf("oneDNN baseline (%s; a matmul per expert and projection, weights prepacked, no LoRA); r0_ratio: tilemoe r=0 / it\n"
                         "%6s %6s %9s %9s %14s %9s\n",
                         baselines[0].implementation().c_str(), "tokens", "iters", "median_ms", "min_ms", "r0_ratio", "rel_diff");
  const int layers = static_cast<int>(baselines.size());
  for (int tokens : token_list) {
    if (tokens == 0) continue;
    const int sets = 8;
    std::vector<RandomRouting> routings;
    std::vector<std::vector<bf16>> inputs;
    for (int i = 0; i < sets; ++i) {
      routings.push_back(random_routing(tokens, s, 100 + i));
      auto x = random_activations(static_cast<std::size_t>(tokens) * s.hidden, 200 + i);
      inputs.push_back(to_bf16(x.data(), x.size()));
    }
    std::vector<float> out(static_cast<std::size_t>(tokens) * s.hidden);
    const int iters = std::max(3, static_cast<int>(iterations_for(tokens) * iter_scale));
    // Every routing once on every layer first: the primitives for its row counts are made then.
    for (auto& b : baselines)
      for (int set = 0; set < sets; ++set)
        b.forward(tokens, s.top_k, inputs[set].data(), routings[set].expert_ids.data(), routings[set].weights.data(), out.data(), pool);
    std::vector<double> ms;
    for (int i = -2; i < iters; ++i) {
      const int set = (i + 2) % sets, layer = (i + 2) % layers;
      auto t = Clock::now();
      baselines[static_cast<std::size_t>(layer)].forward(tokens, s.top_k, inputs[set].data(), routings[set].expert_ids.data(),
                                                         routings[set].weights.data(), out.data(), pool);
      if (i >= 0) ms.push_back(seconds_since(t) * 1e3);
    }
    std::sort(ms.begin(), ms.end());
    const double median = ms[ms.size() / 2];
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
      std::printf("{\"baseline\":\"onednn\",\"tokens\":%d,\"threads\":%d,\"ms\":%.4f,\"min_ms\":%.4f,\"tilemoe_r0_ms\":%.4f,\"ratio\":%.4g,\"rel_diff\":%.2e}\n",
                  tokens, threads, median, ms.front(), ours, ours > 0 ? ours / median : 0.0, rel_diff);
    else if (ours > 0)
      std::printf("%6d %6d %9.3f %9.3f %14.4g %9.2e\n", tokens, iters, median, ms.front(), ours / median, rel_diff);
    else
      std::printf("%6d %6d %9.3f %9.3f %14s %9.2e\n", tokens, iters, median, ms.front(), "-", rel_diff);
    std::fflush(stdout);
  }
}

}  // namespace

void add_bench_command(CLI::App& app, int& status) {
  struct Args {
    std::string shape = "v2-lite", tokens = "1,16,128,512,4096", ranks = "0,16", isa = "auto", weights = "bf16", lora_dtype = "f32";
    int threads = 0, layers = 0;
    std::string group_sizes = std::to_string(quant::kDefaultInt4Group);
    std::string numa_nodes = "1";
    double iter_scale = 1.0;
    bool json = false, phases = false, convert = false, backward = false, grad_overwrite = false, weight_copy = false, lora_held = false;
    std::string workdir = "/tmp";
    bool onednn = false;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("bench", "Time one MoE layer's forward (or fine-tuning step) against the machine's measured limits");
  cmd->add_option("--shape", a->shape, "v2-lite, qwen3-30b, v3 or mixtral-8x7b")->capture_default_str();
  cmd->add_option("--tokens", a->tokens, "Comma-separated token counts")->capture_default_str();
  cmd->add_option("--lora-rank", a->ranks, "Comma-separated LoRA ranks on all three projections (0: none); each gets its own layers and the ranks take turns call by call")->capture_default_str();
  cmd->add_option("--isa", a->isa, "portable, avx512, amx or auto")->capture_default_str();
  cmd->add_option("--weights", a->weights, "Base weight type: bf16, int8 (per-channel scales, int8 activations) or int4")
      ->capture_default_str();
  cmd->add_option("--group-size", a->group_sizes,
                  "int4: inputs per scale (32, 64 or 128). Several (128,64): each gets its own layers and they take turns call by call")
      ->capture_default_str();
  cmd->add_option("--threads", a->threads, "Worker threads (0: every core)")->capture_default_str();
  cmd->add_option("--numa-nodes", a->numa_nodes,
                  "Split each layer over this many NUMA nodes, real or virtual (cores divided between them); 0: the machine's "
                  "nodes. Several (1,2): each gets its own layers and they take turns call by call")
      ->capture_default_str();
  cmd->add_option("--layers", a->layers, "Layers to rotate through (0: enough to exceed 4x the last-level cache)");
  cmd->add_option("--iter-scale", a->iter_scale, "Multiply the iteration counts")->capture_default_str();
  cmd->add_flag("--json", a->json, "One JSON object per case");
  cmd->add_flag("--phases", a->phases, "Also print the mean time of each phase of the forward (and backward), page faults per call, and with several NUMA nodes the merge and when each node started and ended");
  cmd->add_flag("--backward", a->backward,
                "Time the fine-tuning step instead: forward_sft (saving for backward) then backward, LoRA gradients included");
  cmd->add_option("--lora-dtype", a->lora_dtype,
                  "How the LoRA factors (and with --backward their gradients) are stored: f32 or bf16 (read in place either "
                  "way; bf16 is half the bytes); f32,bf16 gives each its own layers, taking turns call by call")
      ->capture_default_str();
  cmd->add_flag("--lora-held", a->lora_held,
                "The LoRA sets are held by the layers, as a loaded adapter is (nothing writes them): packed once, not at every "
                "call as the caller's arrays are");
  cmd->add_flag("--backward-weight-copy", a->weight_copy,
                "With --backward: backward reads a Wᵀ copy of the bf16 weights (twice their memory) instead of repacking");
  cmd->add_flag("--grad-overwrite", a->grad_overwrite,
                "With --backward: overwrite the LoRA gradients (zeroing every expert's) instead of accumulating into them");
  cmd->add_flag("--onednn", a->onednn,
                "Also time the oneDNN baseline (a matmul primitive per expert and projection, weights prepacked by oneDNN, no "
                "LoRA) on the same shape and routings, and print each r=0 time's ratio to it");
  cmd->add_flag("--convert-lora", a->convert,
                "Instead: time convert-lora on a synthetic PEFT adapter of DeepSeek-V3's size (--shape v3 --lora-rank 16)");
  cmd->add_option("--workdir", a->workdir, "Where --convert-lora writes its files (about 2x the adapter's size)")->capture_default_str();
  cmd->callback([a, &status] {
    if (a->convert) {
      auto ranks = parse_int_list(a->ranks == "0,16" ? "16" : a->ranks, "--lora-rank");
      run_convert_bench(a->shape == "v2-lite" ? "v3" : a->shape, std::max(1, ranks.front()), a->workdir);
      status = 0;
      return;
    }
    MoeShape s = shape_by_name(a->shape);
    auto token_list = parse_int_list(a->tokens, "--tokens");
    auto rank_list = parse_int_list(a->ranks, "--lora-rank");
    if (a->isa == "reference") fail(ErrorKind::invalid_argument, "bench times the kernels; --isa reference is not one");
    kernels::Isa isa = *kernels::parse_isa(resolve_backend(a->isa));
    const WeightType weight_type = quant::parse_weight_type(a->weights, "--weights");
    const std::vector<bool> lora_bf16_list = parse_lora_dtypes(a->lora_dtype);
    const std::vector<int> node_counts = parse_int_list(a->numa_nodes, "--numa-nodes");
    const std::vector<int> group_list = parse_int_list(a->group_sizes, "--group-size");
    if (group_list.size() > 1 && weight_type != WeightType::int4)
      fail(ErrorKind::invalid_argument, "--group-size " + a->group_sizes + ": several group sizes apply to int4 only");
    numa::ThreadPool& pool = pool_for_threads(a->threads);
    const auto& topo = numa::system_topology();
    pin_caller_to_first_core();

    double bw = measure_read_bandwidth(pool, std::size_t(2) << 30, 5);
    double peak = measure_peak_flops(pool, isa);
    auto t0 = Clock::now();
    ExpertWeights source = random_expert_weights(s, 1, &pool);
    double gen_s = seconds_since(t0);
    double quantize_s = 0;
    std::vector<quant::QuantizedExperts> quantized(group_list.size());  // one per group size
    if (weight_type != WeightType::bf16) {
      t0 = Clock::now();
      for (std::size_t gi = 0; gi < group_list.size(); ++gi)
        quantized[gi] = quant::quantize_experts(source.view(), weight_type, group_list[gi], &pool);
      quantize_s = seconds_since(t0);
    }
    // Every layer is a tensor-parallel layer: with one node it is the plain layer, no split.
    const int max_tokens = std::max(1, *std::max_element(token_list.begin(), token_list.end()));
    auto pack_slice_of = [&](std::size_t gi) -> TensorParallelLayer::PackSlice {
      return [&, gi](quant::IntermediateSlice sl, numa::ThreadPool& node_pool, int node) {
        return weight_type == WeightType::bf16 ? PackedExpertWeights::pack_slice(source.view(), sl, node_pool, node)
                                               : PackedExpertWeights::pack_quantized(quant::slice_experts(quantized[gi], sl), node_pool, node);
      };
    };
    SftLayerOptions layer_options{max_tokens, a->backward ? 1 : 0, *std::max_element(rank_list.begin(), rank_list.end()), s.top_k};
    layer_options.backward_weight_copy = a->weight_copy;
    // Every case (LoRA rank x node count x int4 group size) has its own layers, and the cases take
    // turns call by call, so that they are compared under the same conditions (drift within a run,
    // not between runs): the LoRA cost and the split's cost are differences of a few percent, and
    // the device's instances drift by 10-30 % within a minute.
    struct Case {
      int rank = 0;
      std::size_t group_index = 0;
      numa::NodeGroup* nodes = nullptr;
      std::unique_ptr<LayerLora> lora, grads;  // the layers read them in place
      std::unique_ptr<LayerLoraBf16> lora16, grads16;  // --lora-dtype bf16: factors and gradients in bf16 instead
      bool lora_bf16 = false;
      std::vector<std::unique_ptr<TensorParallelLayer>> layers;
      int slices = 1;
    };
    std::vector<Case> cases;
    t0 = Clock::now();
    auto new_layer = [&](const Case& c) {
      return std::make_unique<TensorParallelLayer>(s, weight_type, group_list[c.group_index], *c.nodes, isa, layer_options,
                                                   pack_slice_of(c.group_index));
    };
    for (int rank : rank_list)
      for (bool lora_bf16 : lora_bf16_list)
      for (int n : node_counts)
        for (std::size_t gi = 0; gi < group_list.size(); ++gi) {
          if (rank == 0 && lora_bf16 != lora_bf16_list[0]) continue;  // no factors to store
          Case c;
          c.rank = rank;
          c.lora_bf16 = lora_bf16;
          c.group_index = gi;
          c.nodes = &node_group_for(pool, n);
          c.lora = std::make_unique<LayerLora>(random_lora(s, rank, 2.0f * std::max(rank, 1), 3));
          c.grads = std::make_unique<LayerLora>(c.lora->zeros_like());
          if (c.lora_bf16) {
            c.lora16 = std::make_unique<LayerLoraBf16>(round_lora_to_bf16(*c.lora));
            c.grads16 = std::make_unique<LayerLoraBf16>(round_lora_to_bf16(*c.grads));
          }
          c.layers.push_back(new_layer(c));
          c.slices = c.layers[0]->node_count();
          cases.push_back(std::move(c));
        }
    // Enough layers that the smallest case's weights exceed the last-level cache 4 times over.
    std::size_t layer_bytes = cases[0].layers[0]->weight_bytes();
    for (const Case& c : cases) layer_bytes = std::min(layer_bytes, c.layers[0]->weight_bytes());
    layer_bytes = std::max<std::size_t>(layer_bytes, 1);
    int layers = a->layers > 0 ? a->layers
                               : static_cast<int>(std::max<std::size_t>(2, (4 * std::max<std::size_t>(topo.llc_bytes, 1 << 20) + layer_bytes - 1) / layer_bytes));
    for (Case& c : cases) {
      while (static_cast<int>(c.layers.size()) < layers) c.layers.push_back(new_layer(c));
      for (auto& l : c.layers) l->update_lora_weights(c.lora16 ? lora_view(*c.lora16) : lora_view(*c.lora), a->lora_held);
    }
    double pack_s = seconds_since(t0);
    // The baseline's layers: as many as ours, so that its weights do not fit in cache either.
    std::vector<OnednnMoeBaseline> baselines;
    if (a->onednn) {
      if (weight_type != WeightType::bf16) fail(ErrorKind::invalid_argument, "--onednn compares bf16 weights; leave --weights at bf16");
      for (int l = 0; l < layers; ++l) baselines.emplace_back(source.view());
    }
    source = ExpertWeights{};
    quantized.clear();
    // Integer products: VPDPBUSD and TDPBSSD do twice the multiply-adds of their bf16 twins per
    // instruction, so the floor takes the integer peak as twice the measured bf16 one.
    const double product_peak = weight_type == WeightType::bf16 ? peak : 2 * peak;
    if (!a->json) {
      std::printf("tilemoe bench: shape %s (hidden %d, intermediate %d, %d experts, top-%d), isa %s, %d threads\n", a->shape.c_str(),
                  s.hidden, s.intermediate, s.num_experts, s.top_k, kernels::isa_label(isa).c_str(), pool.size());
      std::printf("machine: %s, %d cores, LLC %.0f MB; measured read bandwidth %.1f GB/s, %s peak %.2f TFLOP/s\n",
                  topo.cpu_model.c_str(), topo.cores, topo.llc_bytes / 1e6, bw / 1e9, kernels::isa_label(isa).c_str(), peak / 1e12);
      std::printf("weights: %s, %d layers per case of", a->weights.c_str(), layers);
      for (const Case& c : cases)
        if (c.rank == cases[0].rank && c.lora_bf16 == cases[0].lora_bf16 && c.nodes == cases[0].nodes)
          std::printf("%s %.2f GB%s", c.group_index > 0 ? "," : "", c.layers[0]->weight_bytes() / 1e9,
                      weight_type == WeightType::int4 ? (" (group " + std::to_string(group_list[c.group_index]) + ")").c_str() : "");
      std::printf(" packed (made in %.1f s, quantized in %.1f s, packed in %.1f s)\n", gen_s, quantize_s, pack_s);
      for (const Case& c : cases) {
        if (c.rank != cases[0].rank) break;  // the same splits for every rank
        if (c.lora_bf16 != cases[0].lora_bf16) continue;  // and factor type
        if (c.group_index != 0) continue;    // and every group size
        std::printf("NUMA: %d node(s) (%s), each layer split in %d slice(s) of the intermediate size:", c.nodes->size(),
                    static_cast<std::size_t>(c.nodes->size()) == topo.nodes.size() ? "the machine's" : "virtual", c.slices);
        for (int n = 0; n < c.slices; ++n)
          std::printf(" [%d, %d) on %d threads", c.layers[0]->slice(n).begin, c.layers[0]->slice(n).end, c.nodes->pool(n).size());
        std::printf("\n");
      }
      if (cases.size() > 1) std::printf("the cases (LoRA ranks x factor types x node counts x group sizes) take turns call by call\n");
      if (a->backward)
        std::printf("fine-tuning step: forward_sft + backward, LoRA gradients %s; floor counts the weights read twice\n",
                    a->grad_overwrite ? "overwritten (every expert zeroed)" : "accumulated (the experts touched only)");
      if (a->lora_held) std::printf("LoRA held by the layers (as a loaded adapter): packed once\n");
      if (a->backward && a->weight_copy)
        std::printf("backward reads a Wt copy of the weights: %.2f GB per layer besides the packed %.2f GB\n",
                    cases[0].layers[0]->weight_copy_bytes() / 1e9, cases[0].layers[0]->weight_bytes() / 1e9);
      std::printf("%6s %5s %5s %6s %9s %9s %9s %8s %9s %10s %11s%s%s%s\n", "tokens", "rank", "nodes", "iters", "median_ms", "min_ms", "GB/s",
                  "TFLOP/s", "floor_ms", "time/floor", "node_GB/s", a->backward ? "    fwd_ms    bwd_ms" : "", " lora",
                  group_list.size() > 1 ? " group" : "");
    }
    std::vector<std::pair<int, double>> r0_medians;  // (tokens, ms) of the first node count, r=0
    // Phases are node 0's: the nodes run theirs at the same time.
    auto reset_phases = [&] {
      for (Case& c : cases)
        for (auto& l : c.layers)
          l->node_layer(0).forward_pass().reset_phase_seconds(), l->node_layer(0).backward_pass().reset_phase_seconds(), l->reset_timings();
    };
    for (int tokens : token_list) {
      if (tokens == 0) continue;
      const int sets = 8;  // routings and inputs rotate: fresh experts, as in serving
      std::vector<RandomRouting> routings;
      std::vector<std::vector<bf16>> inputs;
      std::vector<std::vector<float>> grad_outs;
      for (int i = 0; i < sets; ++i) {
        routings.push_back(random_routing(tokens, s, 100 + i));
        auto x = random_activations(static_cast<std::size_t>(tokens) * s.hidden, 200 + i);
        inputs.push_back(to_bf16(x.data(), x.size()));
        if (a->backward) grad_outs.push_back(random_activations(x.size(), 300 + i));
      }
      std::vector<float> out(static_cast<std::size_t>(tokens) * s.hidden), grad_in(out.size());
      int iters = std::max(3, static_cast<int>(iterations_for(tokens) * a->iter_scale));
      struct Times {
        std::vector<double> ms, fwd_ms, bwd_ms;
      };
      std::vector<Times> times(cases.size());
      double experts_sum = 0;  // experts touched, summed over the timed calls
      // Warm-up: every layer is called once (its buffers grow and are first touched then) and at
      // least twice in all. With fewer, a case whose layers outnumber the timed calls (int4's
      // many small layers at 4096 tokens) timed first touches: medians of 300-400 ms against
      // minima of 80-100 on the device.
      const int warm = std::max(2, layers);
      PageFaults faults_before{};
      numa::NodeGroup* last_group = nullptr;
      for (int i = -warm; i < iters; ++i) {
        int set = (i + warm) % sets, layer = (i + warm) % layers;
        if (i == 0) reset_phases(), faults_before = page_faults();  // the phases' means are of the timed calls only
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
          auto t = Clock::now();
          double f_ms = 0;
          l.forward_sft(tokens, s.top_k, inputs[set].data(), r.expert_ids.data(), r.weights.data(), out.data(), a->backward);
          if (a->backward) {
            f_ms = seconds_since(t) * 1e3;
            const Case& cs = cases[c];
            l.backward(grad_outs[set].data(), grad_in.data(), cs.grads16 ? lora_grad_view(*cs.grads16) : lora_grad_view(*cs.grads),
                       !a->grad_overwrite);
          }
          double dt = seconds_since(t) * 1e3;
          if (i < 0) continue;
          times[c].ms.push_back(dt);
          times[c].fwd_ms.push_back(f_ms);
          times[c].bwd_ms.push_back(dt - f_ms);
        }
        if (i < 0) continue;
        std::vector<char> touched(s.num_experts, 0);
        for (auto e : r.expert_ids) touched[e] = 1;
        experts_sum += static_cast<double>(std::count(touched.begin(), touched.end(), 1));
      }
      const PageFaults faults = page_faults() - faults_before;
      auto median_of = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
      };
      for (std::size_t c = 0; c < cases.size(); ++c) {
        const Case& cs = cases[c];
        const int rank = cs.rank;
        // The factors read per expert: the caller's A and B (f32 or bf16); or, held, their packed bf16 forms
        // (B's rank padded to a whole k-block of 32, or to 16 in the short panel form, pack_bf16.hpp) where
        // experts have the rows for that form.
        std::size_t lora_bytes_per_expert = 0;
        const std::size_t rank_padded = rank > 0 ? kernels::compact_panel_elements(rank) / kernels::kPanelColumns : 0;
        const bool packed_form = a->lora_held && static_cast<double>(tokens) * s.top_k * iters >= 16.0 * experts_sum;
        for (Projection p : kProjections)
          lora_bytes_per_expert += packed_form ? (rank * projection_in(s, p) + rank_padded * projection_out(s, p)) * sizeof(bf16)
                                               : static_cast<std::size_t>(rank) * (projection_in(s, p) + projection_out(s, p)) *
                                                     (cs.lora_bf16 ? sizeof(bf16) : sizeof(float));
        const std::size_t bytes_per_expert = cs.layers[0]->weight_bytes() / static_cast<std::size_t>(s.num_experts);
        const double bytes = (a->backward ? 2.0 : 1.0) * experts_sum / iters * static_cast<double>(bytes_per_expert + lora_bytes_per_expert);
        // Backward does twice the forward's products (dH through down, dX through gate and up).
        double flops = (a->backward ? 3.0 : 1.0) * 2.0 * tokens * s.top_k *
                       (3.0 * s.hidden * s.intermediate + rank * (2.0 * s.hidden + 2.0 * s.intermediate + s.intermediate + s.hidden));
        double floor_ms = std::max(bytes / bw, product_peak > 0 ? flops / product_peak : 0.0) * 1e3;
        const int split = cs.slices;
        double median = median_of(times[c].ms), fwd_median = median_of(times[c].fwd_ms), bwd_median = median_of(times[c].bwd_ms);
        double min_ms = *std::min_element(times[c].ms.begin(), times[c].ms.end());
        if (rank == 0 && cs.nodes == cases[0].nodes && !a->backward) r0_medians.emplace_back(tokens, median);
        // The LoRA's cost over the r=0 case of the same node count and group size: the median of the
        // call-by-call ratios. Each pair of calls shares its routing, input and moment, so the drift of
        // the machine within a run (10-30 % a minute on the device) cancels, which it does not in the
        // ratio of two medians.
        double lora_cost = 0;
        bool has_lora_cost = false;
        for (std::size_t c0 = 0; c0 < cases.size() && rank > 0; ++c0) {
          const Case& base = cases[c0];
          if (base.rank != 0 || base.nodes != cs.nodes || base.group_index != cs.group_index) continue;
          std::vector<double> ratios(times[c].ms.size());
          for (std::size_t i = 0; i < ratios.size(); ++i) ratios[i] = times[c].ms[i] / times[c0].ms[i];
          lora_cost = median_of(ratios) - 1.0;
          has_lora_cost = true;
          break;
        }
        if (a->json)
          std::printf("{\"shape\":\"%s\",\"weights\":\"%s\",\"tokens\":%d,\"lora_rank\":%d,\"isa\":\"%s\",\"threads\":%d,\"backward\":%s,\"ms\":%.4f,"
                      "\"min_ms\":%.4f,\"fwd_ms\":%.4f,\"bwd_ms\":%.4f,\"floor_ms\":%.4f,\"time_over_floor\":%.3f,\"gbps\":%.2f,"
                      "\"tflops\":%.3f,\"bandwidth_gbps\":%.2f,\"peak_tflops\":%.3f,\"layers\":%d,\"iters\":%d,\"numa_nodes\":%d,"
                      "\"node_gbps\":%.2f,\"group_size\":%d,\"lora_dtype\":\"%s\"%s}\n",
                      a->shape.c_str(), a->weights.c_str(), tokens, rank, kernels::isa_name(isa), pool.size(), a->backward ? "true" : "false",
                      median, min_ms, a->backward ? fwd_median : median, a->backward ? bwd_median : 0.0, floor_ms, median / floor_ms,
                      bytes / median / 1e6, flops / median / 1e9, bw / 1e9, peak / 1e12, layers, iters, split, bytes / split / median / 1e6,
                      weight_type == WeightType::int4 ? group_list[cs.group_index] : 0, cs.rank == 0 ? "none" : cs.lora_bf16 ? "bf16" : "f32",
                      has_lora_cost ? (",\"lora_cost\":" + std::to_string(lora_cost)).c_str() : "");
        else if (a->backward)
          std::printf("%6d %5d %5d %6d %9.3f %9.3f %9.1f %8.2f %9.3f %10.2f %11.1f %9.3f %9.3f", tokens, rank, split, iters, median, min_ms,
                      bytes / median / 1e6, flops / median / 1e9, floor_ms, median / floor_ms, bytes / split / median / 1e6, fwd_median,
                      bwd_median);
        else
          std::printf("%6d %5d %5d %6d %9.3f %9.3f %9.1f %8.2f %9.3f %10.2f %11.1f", tokens, rank, split, iters, median, min_ms,
                      bytes / median / 1e6, flops / median / 1e9, floor_ms, median / floor_ms, bytes / split / median / 1e6);
        if (!a->json)
          std::printf(" %4s%s\n", rank == 0 ? "-" : cs.lora_bf16 ? "bf16" : "f32",
                      group_list.size() > 1 ? (" " + std::to_string(group_list[cs.group_index])).c_str() : "");
        if (!a->json && has_lora_cost)
          std::printf("        LoRA over r=0, median of the call-by-call ratios: %+.1f %%\n", 100.0 * lora_cost);
        if (a->phases) {
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
          if (split > 1) {
            double merge = 0;
            for (auto& l : cs.layers) merge += l->merge_seconds();
            std::printf("        merge of the %d nodes' partial rows, mean ms per call: %.3f\n", split, merge * 1e3 / iters);
            if (!a->backward) {
              std::vector<double> start(static_cast<std::size_t>(split)), end(start.size()), guests(start.size());
              double all = 0;
              for (auto& l : cs.layers) {
                const auto& t = l->forward_node_seconds();
                for (std::size_t n = 0; n < t.start.size() && n < start.size(); ++n)
                  start[n] += t.start[n], end[n] += t.end[n], guests[n] += t.guest_items[n];
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
          if (a->backward)
            print_phases("backward", MoeBackward::kPhases, MoeBackward::phase_name, [&](int i) {
              double t = 0;
              for (auto& l : cs.layers) t += l->node_layer(0).backward_pass().phase_seconds()[i];
              return t;
            });
        }
      }
      if (a->phases) {
        // A layer call that touches fresh pages (a buffer freed and allocated again, memory the
        // hypervisor took back) pays microseconds a page, which no phase shows by itself.
        const double calls = static_cast<double>(iters) * static_cast<double>(cases.size());
        std::printf("        page faults per layer call (all cases): minor %.1f, major %.1f\n", faults.minor / calls, faults.major / calls);
        reset_phases();
      }
      std::fflush(stdout);
    }
    if (!baselines.empty()) run_onednn_baseline(baselines, s, token_list, r0_medians, a->iter_scale, a->json, pool, *cases[0].layers[0]);
    status = 0;
  });
}

}  // namespace tilemoe::cli
