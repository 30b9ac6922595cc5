#pragma once
// One MoE layer split over NUMA nodes (tensor parallel, the role of kt-kernel's TP_MOE_SFT):
// every expert's intermediate dimension is cut into one slice per node (gate and up rows, down
// columns, and the matching LoRA B rows of gate/up and A columns of down). Each node packs its
// slice into its own memory and computes, with its own workers, a partial output for all
// tokens; merge_results adds the partials in node order.
//
// Everything the layer computes is linear in the slices: out and grad_input are sums of the
// nodes' partials (down's LoRA product B (A h) = sum over nodes of B (A_n h_n)); the B gradients
// of gate and up and the A gradient of down are per slice, written in place. The gradients of
// gate's and up's A and of down's B are sums too: the nodes add up their small [rows][rank]
// partials (dP, and down's A h) and compute those gradients once, straight into the caller's
// arrays (cross_node_sums.hpp).
//
// Node 0 writes the caller's out and grad_input directly, the others their own buffers, which
// are then added in order 1, 2, ...: the result is bit-identical for a given node count whatever
// the thread count. With one node there is no merge and no copy.
//
// Nodes that share one memory node (virtual nodes) also share the forward's gathered x: each
// row is copied once for all of them; with LoRA, gate's and up's A packed and s x Aᵀ; and the
// backward's rows of w dO and of x (shared_gather.hpp).
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "numa/node_group.hpp"
#include "src/layer/cross_node_sums.hpp"
#include "src/layer/expert_partial_sums.hpp"
#include "src/layer/moe_sft_layer.hpp"
#include "src/layer/packed_experts.hpp"
#include "src/layer/shared_gather.hpp"
#include "src/quant/numa_slices.hpp"

namespace tilemoe {

// Slices of [0, intermediate) for up to `nodes` nodes, boundaries on multiples of `align`, as
// even as that allows; fewer slices than nodes when there are fewer aligned blocks (a node with
// nothing to do is left out). Throws invalid_argument for nodes < 1 or align < 1.
std::vector<quant::IntermediateSlice> node_slices(int intermediate, int nodes, int align);

// The boundary alignment for a weight type: whole 32-wide k-blocks of bf16, whole 64-wide int8
// blocks, whole int4 groups.
int node_slice_align(WeightType type, int int4_group);

// The LoRA view of one slice: gate/up keep A and see B's rows [begin, end); down keeps B and
// sees A's columns [begin, end). Strided windows of the caller's arrays: nothing is copied.
LayerLoraView slice_lora_view(const LayerLoraView& full, quant::IntermediateSlice slice);

class TensorParallelLayer {
 public:
  // Builds node n's packed weights from its slice, with its pool, in memory of its os node.
  using PackSlice = std::function<PackedExpertWeights(quant::IntermediateSlice slice, numa::ThreadPool& pool, int os_node)>;

  // `nodes` must outlive the layer. Packs every node's slice at once (each with its own pool).
  // Throws invalid_argument for a LoRA set that does not fit.
  TensorParallelLayer(const MoeShape& shape, WeightType type, int int4_group, numa::NodeGroup& nodes, kernels::Isa isa,
                      const SftLayerOptions& options, const PackSlice& pack, const LayerLoraView& lora = {});
  ~TensorParallelLayer();

  // As MoeSftLayer (held: a set nothing writes until the next update, packed once): validated
  // first, a bad set keeps the old one.
  void update_lora_weights(const LayerLoraView& lora, bool held = false);
  const LayerLoraView& lora() const { return lora_; }

  // As MoeSftLayer::forward_sft and backward, over all nodes; a failure leaves every node's
  // cache stack as it was.
  void forward_sft(int tokens, int top_k, const bf16* x, const std::int64_t* expert_ids, const float* weights, float* out,
                   bool save_for_backward);
  void backward(const float* grad_output, float* grad_input, const LayerLoraGrad& grads, bool accumulate = false);

  int node_count() const { return static_cast<int>(shards_.size()); }
  quant::IntermediateSlice slice(int node) const;
  const PackedExpertWeights& packed(int node) const;
  MoeSftLayer& node_layer(int node);
  int cached_forwards() const;
  int tokens_of_newest_saved() const;
  std::size_t cache_bytes() const;
  std::size_t weight_bytes() const;
  std::size_t streamed_weight_bytes() const;  // PackedExpertWeights::streamed_bytes, every node's
  std::size_t weight_copy_bytes() const;  // every node's backward Wᵀ copy
  const MoeShape& shape() const { return shape_; }
  WeightType weight_type() const { return type_; }
  // Whether the nodes share the forward's gathered x: on from construction where there are
  // several nodes, all on one memory node, and their layouts of x agree (not int4 at groups of
  // 32, whose layout depends on each node's scales). Turning it off (tests: to compare with
  // per-node gathers) or on again is allowed between calls; on where it cannot be stays off.
  // The backward's rows of w dO and x are shared wherever the nodes are on one memory node and
  // this is not turned off.
  bool gather_shared() const { return share_gather_ && shared_gather_ != nullptr && forward_layouts_agree_; }
  void set_gather_shared(bool on) { share_gather_ = on; }
  // Seconds spent adding the nodes' partials (the bench's --phases).
  double merge_seconds() const { return merge_seconds_; }
  // Forward, summed over calls: each node's time from the call's start to its own start (waking
  // it) and to its end, and the nodes' run as a whole (the slowest node's end): where the time
  // of several nodes goes besides node 0's phases. guest_items: each node's items run by other
  // nodes' idle workers (ThreadPool::link_siblings).
  struct NodeTimes {
    std::vector<double> start, end, guest_items;
    double all = 0;
  };
  const NodeTimes& forward_node_seconds() const { return node_seconds_; }
  void reset_timings() {  // merge_seconds and forward_node_seconds
    merge_seconds_ = 0;
    node_seconds_ = {};
  }

 private:
  struct Shard;
  void merge_rows(float* dst, int tokens, const std::function<const float*(int node)>& partial);

  MoeShape shape_;
  WeightType type_;
  numa::NodeGroup& nodes_;
  int max_rank_;
  LayerLoraView lora_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::shared_ptr<SharedGather> shared_gather_;  // null where the nodes cannot share
  CrossNodeSums sums_;  // the backward's summed LoRA gradients
  ExpertPartialSums down_lora_sums_;  // the forward's s h A_downᵀ, summed for down's LoRA term
  bool share_gather_ = true;
  bool forward_layouts_agree_ = true;
  double merge_seconds_ = 0;
  NodeTimes node_seconds_;
};

}  // namespace tilemoe
