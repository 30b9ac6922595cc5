#pragma once
// The fast forward of one MoE layer on one node: packed weights, the kernel table of one ISA,
// and the pool's workers. Work is split into items whose boundaries depend on the routing only,
// never on the thread count, so the output is bit-identical for any number of threads.
//
// Phases (each a parallel_for):
//   gather     x rows of every (token, slot) into one bf16 block, grouped by expert
//   lora_prep  per expert: pack its LoRA A and B for the kernels; s * x A^T for gate and up
//   gate_up    items (expert, column chunk): gate and up GEMMs with LoRA B fused as extra K
//              steps, then h = silu(gate) * up in bf16
//   lora_down  per expert: s * h A_down^T
//   down       items (expert, column chunk): y = h Wd^T (+ LoRA) into one f32 row per slot
//   combine    out[t] = sum_j w[t,j] y[t,j], slots in order
#include <array>
#include <cstdint>
#include <vector>

#include "amx/isa.hpp"
#include "amx/kernel_table.hpp"
#include "numa/thread_pool.hpp"
#include "src/layer/packed_experts.hpp"
#include "src/lora/lora_weights.hpp"
#include "src/routing/token_groups.hpp"

namespace tilemoe {

class MoeForward {
 public:
  MoeForward(const PackedExpertWeights& weights, kernels::Isa isa, numa::ThreadPool& pool);

  // x: bf16 [T][H]; expert_ids, weights: [T][k]; out: f32 [T][H], overwritten.
  void forward(const LayerLora& lora, int tokens, int top_k, const bf16* x, const std::int64_t* expert_ids, const float* weights,
               float* out);

  kernels::Isa isa() const { return isa_; }

  // Seconds spent in each phase since construction (gather, lora_prep, gate_up, lora_down,
  // down, combine): what the bench's --phases prints to show where time goes.
  static constexpr int kPhases = 6;
  static const char* phase_name(int i);
  const std::array<double, kPhases>& phase_seconds() const { return phase_seconds_; }
  void reset_phase_seconds() { phase_seconds_ = {}; }

 private:
  struct ExpertLora {  // one projection of one expert for this call
    bool active = false;
    bool packed = false;       // fused into the tile GEMM (many rows) or applied from f32 (few rows)
    float scale = 0;
    const float* a = nullptr;  // the caller's [rank][in] and [out][rank]
    const float* b = nullptr;
    int rank = 0;
    std::vector<float> xa_f32; // s * v A^T, [rows][rank], when not packed
    int rank_panels = 0;       // LoRA A packed as n = rank
    int rank_k_padded = 0;     // LoRA B packed as k = rank
    std::vector<bf16> a_packed, b_packed;
    std::vector<bf16> xa;      // s * v A^T, [rows][rank_k_padded]
  };

  void prepare_lora(const LayerLora& lora, int e, Projection p, int rows, ExpertLora& dst);
  void project_lora(ExpertLora& l, const bf16* v, std::size_t ldv, int rows, int in, int k_padded, std::vector<float>& scratch);
  void expert_gemm(const bf16* a, std::size_t lda, int m, const bf16* packed, int p0, int p1, const ExpertLora* lora, int n, float* c,
                   std::size_t ldc) const;
  static void add_lora_epilogue(const ExpertLora& l, int rows, int col0, int n, float* c, std::size_t ldc);
  void compute_xa(ExpertLora& l, const bf16* v, std::size_t ldv, int rows, int k_padded, std::vector<float>& scratch);

  const PackedExpertWeights& w_;
  kernels::Isa isa_;
  const kernels::KernelTable& kt_;
  numa::ThreadPool& pool_;

  // Reused across calls: grown to the largest batch seen, never shrunk.
  std::vector<bf16> xs_, h_;
  std::vector<float> y_;
  std::vector<int> active_;
  std::vector<std::array<ExpertLora, 3>> lora_;
  std::vector<std::vector<float>> scratch_;  // per worker
  std::array<double, kPhases> phase_seconds_{};
};

}  // namespace tilemoe
