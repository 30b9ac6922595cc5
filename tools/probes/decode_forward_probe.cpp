// tilemoe_decode_forward_probe: what the forward adds to decode's weight stream. One process, one
// thread pool, one set of DeepSeek-V2-Lite layers (bf16, packed as the bench packs them, more of
// them than the LLC holds): each call is one token routed to six experts, and the modes take turns
// call by call over the same layers and routings:
//   forward   MoeSftLayer::forward_sft, as the bench times it;
//   items     the same six experts' weights through the same decode kernel
//             (gemm_bf16_avx512_prefetching) in the forward's items: 4 panels of gate and then of
//             up, then 4 panels of down, handed out by the same pool's parallel_for;
//   items+h   the same, each down item waiting (spinning) until its expert's gate_up items are done,
//             as the forward's do.
// docs/perf.md, session 69: the forward streamed 6-18 % under a probe of its items on the device's
// fast-memory machines, in separate processes. This puts both on the same pool, layers and routing.
//
// Usage: tilemoe_decode_forward_probe [--threads T] [--calls N] [--layers L]
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "amx/gemm_bf16.hpp"
#include "amx/isa.hpp"
#include "amx/pack_bf16.hpp"
#include "numa/thread_pool.hpp"
#include "src/layer/moe_sft_layer.hpp"
#include "src/layer/packed_experts.hpp"
#include "src/layer/synthetic_layer.hpp"

namespace {

using namespace tilemoe;
using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Item {
  int expert_slot;  // 0..top_k-1
  bool gate_up;
  int p0;
};

}  // namespace

int main(int argc, char** argv) {
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  int calls = 300;
  int layers = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--threads") threads = std::atoi(argv[i + 1]);
    else if (a == "--calls") calls = std::atoi(argv[i + 1]);
    else if (a == "--layers") layers = std::atoi(argv[i + 1]);
  }
  if (!kernels::isa_available(kernels::Isa::avx512_bf16)) {
    std::printf("SKIPPED: no AVX512-BF16\n");
    return 0;
  }
  const MoeShape shape = shape_by_name("v2-lite");
  std::vector<int> cpus;
  for (int c = 0; c < threads; ++c) cpus.push_back(c);
  numa::ThreadPool pool(threads, cpus);
  numa::pin_current_thread(0);
  const kernels::Isa isa = kernels::best_available_isa();
  // Seven layers (7.7 GB), as the bench rotates through on the device: a layer's experts come back
  // after about 1.4 GB read, well beyond the LLC.
  const double layer_bytes = 3.0 * shape.num_experts * shape.hidden * static_cast<double>(shape.intermediate) * 2;
  if (layers <= 0) layers = 7;
  layers = std::max(layers, 3);
  std::vector<PackedExpertWeights> packed;
  std::vector<std::unique_ptr<MoeSftLayer>> moe;
  packed.reserve(static_cast<std::size_t>(layers));
  for (int l = 0; l < layers; ++l) {
    const ExpertWeights w = random_expert_weights(shape, 100 + static_cast<std::uint64_t>(l), &pool);
    packed.push_back(PackedExpertWeights::pack(w.view(), pool));
  }
  SftLayerOptions options;
  options.max_tokens = 1;
  options.max_cache_depth = 0;
  for (int l = 0; l < layers; ++l) moe.push_back(std::make_unique<MoeSftLayer>(packed[static_cast<std::size_t>(l)], isa, pool, options));

  constexpr int kRoutings = 64;
  std::vector<RandomRouting> routings;
  for (int r = 0; r < kRoutings; ++r) routings.push_back(random_routing(1, shape, 500 + static_cast<std::uint64_t>(r)));
  std::vector<bf16> x(static_cast<std::size_t>(shape.hidden));
  {
    const std::vector<float> xf = random_activations(x.size(), 9);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = float_to_bf16(xf[i]);
  }
  std::vector<float> out(static_cast<std::size_t>(shape.hidden));

  const kernels::PackedShape& up = packed[0].up_shape();
  const kernels::PackedShape& down = packed[0].down_shape();
  std::vector<bf16> xk(static_cast<std::size_t>(std::max(up.k_padded, down.k_padded)), bf16(0));
  std::copy(x.begin(), x.end(), xk.begin());
  std::vector<Item> items;
  const int k = shape.top_k;
  for (int s = 0; s < k; ++s)
    for (int p = 0; p < up.panels; p += 4) items.push_back({s, true, p});
  for (int s = 0; s < k; ++s)
    for (int p = 0; p < down.panels; p += 4) items.push_back({s, false, p});
  const int gate_up_items_per_expert = (up.panels + 3) / 4;
  std::vector<std::vector<float>> scratch(static_cast<std::size_t>(pool.worker_slots()), std::vector<float>(8 * 16));

  auto run_items = [&](int layer, const RandomRouting& r, bool wait_h) {
    const PackedExpertWeights& w = packed[static_cast<std::size_t>(layer)];
    std::vector<std::atomic<int>> left(static_cast<std::size_t>(k));
    for (auto& a : left) a.store(gate_up_items_per_expert, std::memory_order_relaxed);
    pool.parallel_for(items.size(), [&](std::size_t i, int worker) {
      const Item& it = items[i];
      const int e = static_cast<int>(r.expert_ids[static_cast<std::size_t>(it.expert_slot)]);
      // Panels [p0, p0 + 4) of one projection, as the forward's decode items call the kernel.
      auto product = [&](const kernels::PackedShape& shape, const bf16* packed) {
        kernels::GemmBf16Args g{};
        g.a = xk.data();
        g.lda = static_cast<std::size_t>(shape.k_padded);
        g.m = 1;
        g.k_padded = shape.k_padded;
        g.panel_begin = it.p0;
        g.panel_end = std::min(it.p0 + 4, shape.panels);
        g.c = scratch[static_cast<std::size_t>(worker)].data();
        g.ldc = 4 * kernels::kPanelColumns;
        g.packed_b = packed;
        kernels::gemm_bf16_avx512_prefetching(g);
      };
      std::atomic<int>& h_left = left[static_cast<std::size_t>(it.expert_slot)];
      if (it.gate_up) {
        product(up, w.packed(Projection::gate, e));
        product(up, w.packed(Projection::up, e));
        h_left.fetch_sub(1, std::memory_order_acq_rel);
        return;
      }
      if (wait_h)
        while (h_left.load(std::memory_order_acquire) > 0) {
        }
      product(down, w.packed(Projection::down, e));
    });
  };

  constexpr int kModes = 3;
  const char* names[kModes] = {"forward", "items", "items+h"};
  std::vector<std::vector<double>> ms(kModes);
  const double bytes = static_cast<double>(k) *
                       (2.0 * up.panels * kernels::kPanelColumns * up.k_padded + static_cast<double>(down.panels) * kernels::kPanelColumns * down.k_padded) * 2;
  const int warm = 2 * layers;
  for (int i = -warm; i < calls; ++i) {
    const int layer = (i + warm) % layers;
    const RandomRouting& r = routings[static_cast<std::size_t>((i + warm) % kRoutings)];
    for (int m = 0; m < kModes; ++m) {
      const int mode = (m + i + warm) % kModes;
      // Each mode over another layer in a call, so that none reads what another just read.
      const int l = (layer + mode * (layers / kModes)) % layers;
      const auto t0 = Clock::now();
      if (mode == 0) {
        moe[static_cast<std::size_t>(l)]->forward_sft(1, k, x.data(), r.expert_ids.data(), r.weights.data(), out.data(), false);
      } else {
        run_items(l, r, mode == 2);
      }
      const double dt = std::chrono::duration<double>(Clock::now() - t0).count() * 1e3;
      if (i >= 0) ms[static_cast<std::size_t>(mode)].push_back(dt);
    }
  }
  std::printf("decode forward probe: %d threads, %d layers of %.2f GB, %.1f MB a call, %d calls a mode, isa %s\n", threads, layers,
              layer_bytes / 1e9, bytes / 1e6, calls, kernels::isa_name(isa));
  std::printf("%-10s %9s %9s %9s\n", "mode", "median_ms", "min_ms", "GB/s");
  for (int m = 0; m < kModes; ++m) {
    const double med = median(ms[static_cast<std::size_t>(m)]);
    const double mn = *std::min_element(ms[static_cast<std::size_t>(m)].begin(), ms[static_cast<std::size_t>(m)].end());
    std::printf("%-10s %9.3f %9.3f %9.1f\n", names[m], med, mn, bytes / med / 1e6);
  }
  return 0;
}
