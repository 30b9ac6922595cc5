#include "src/layer/tensor_parallel_layer.hpp"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>

#include "amx/pack_transposed.hpp"
#include "src/layer/pool_workspace.hpp"
#include "src/lora/lora_view.hpp"
#include "src/routing/token_groups.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe {

std::vector<quant::IntermediateSlice> node_slices(int intermediate, int nodes, int align) {
  if (nodes < 1 || align < 1 || intermediate < 1)
    fail(ErrorKind::invalid_argument, "node_slices: intermediate " + std::to_string(intermediate) + ", nodes " + std::to_string(nodes) +
                                          " and align " + std::to_string(align) + " must be positive");
  const int blocks = (intermediate + align - 1) / align;
  const int count = std::min(nodes, blocks);
  std::vector<quant::IntermediateSlice> out;
  for (int n = 0; n < count; ++n) {
    // Node n takes blocks [n * blocks / count, (n + 1) * blocks / count): counts differ by at most one.
    const int b0 = static_cast<int>(static_cast<long long>(n) * blocks / count);
    const int b1 = static_cast<int>(static_cast<long long>(n + 1) * blocks / count);
    out.push_back({b0 * align, std::min(intermediate, b1 * align)});
  }
  return out;
}

int node_slice_align(WeightType type, int int4_group) {
  switch (type) {
    case WeightType::bf16: return 32;
    case WeightType::int8: return 64;
    case WeightType::int4: return std::max(64, int4_group);
    case WeightType::mxfp4: return 32;  // one group, one bf16 k-block
  }
  return 128;
}

LayerLoraView slice_lora_view(const LayerLoraView& full, quant::IntermediateSlice slice) {
  LayerLoraView v = full;
  for (Projection p : kProjections) {
    const LoraProjectionView& f = full[p];
    LoraProjectionView& d = v[p];
    if (f.rank == 0) continue;
    // The window keeps the full arrays' strides: rows and experts stay where they were.
    d.strides = {f.lda(), f.strides.a_expert_of(f.rank, f.in), f.strides.b_expert_of(f.rank, f.out)};
    if (p == Projection::down) {
      d.in = slice.width();
      d.a = f.a_at(static_cast<std::size_t>(slice.begin));
    } else {
      d.out = slice.width();
      d.b = f.b_at(static_cast<std::size_t>(slice.begin) * f.rank);
    }
  }
  return v;
}

namespace {

// The gradient windows of one slice, as slice_lora_view; `ranks` of the saved forward's set,
// `full` the layer's unsplit shape (which the caller's arrays have).
LayerLoraGrad slice_lora_grad(const LayerLoraGrad& grads, const LayerLoraView& ranks, const MoeShape& full, quant::IntermediateSlice slice) {
  LayerLoraGrad g = grads;
  for (Projection p : kProjections) {
    const int i = static_cast<int>(p);
    const int r = ranks[p].rank, in = projection_in(full, p), out = projection_out(full, p);
    if (r == 0) continue;
    g[i].strides = {grads[i].lda(in), grads[i].strides.a_expert_of(r, in), grads[i].strides.b_expert_of(r, out)};
    if (p == Projection::down) {
      if (g[i].a) g[i].a = grads[i].a_at(static_cast<std::size_t>(slice.begin));
    } else if (g[i].b) {
      g[i].b = grads[i].b_at(static_cast<std::size_t>(slice.begin) * r);
    }
  }
  return g;
}

template <typename T>
void ensure(numa::NodeBuffer<T>& b, std::size_t n, int node) {
  if (b.size() < n) b = numa::NodeBuffer<T>(n, node);
}

// Below this many floats a merge runs on the calling thread: waking the nodes would cost more.
constexpr std::size_t kMergeInline = 1 << 15;

}  // namespace

struct TensorParallelLayer::Shard {
  quant::IntermediateSlice slice;
  int os_node = 0;
  numa::ThreadPool* pool = nullptr;
  PackedExpertWeights weights;
  std::unique_ptr<MoeSftLayer> layer;
  // Partial results of nodes other than node 0, in this node's memory.
  numa::NodeBuffer<float> out, grad_in;
};

TensorParallelLayer::TensorParallelLayer(const MoeShape& shape, WeightType type, int int4_group, numa::NodeGroup& nodes,
                                         kernels::Isa isa, const SftLayerOptions& options, const PackSlice& pack,
                                         const LayerLoraView& lora)
    : shape_(shape), type_(type), nodes_(nodes), max_rank_(options.max_lora_rank) {
  validate_lora_view(lora, shape_, max_rank_, "TensorParallelLayer");
  const std::vector<quant::IntermediateSlice> slices =
      node_slices(shape.intermediate, nodes.size(), node_slice_align(type, int4_group));
  for (std::size_t n = 0; n < slices.size(); ++n) {
    auto shard = std::make_unique<Shard>();
    shard->slice = slices[n];
    shard->os_node = nodes.os_node(static_cast<int>(n));
    shard->pool = &nodes.pool(static_cast<int>(n));
    shards_.push_back(std::move(shard));
  }
  nodes_.run_on_nodes([&](int node) {
    if (node >= node_count()) return;
    Shard& s = *shards_[static_cast<std::size_t>(node)];
    s.weights = pack(s.slice, *s.pool, s.os_node);
    SftLayerOptions o = options;
    o.memory_node = s.os_node;
    s.layer = std::make_unique<MoeSftLayer>(s.weights, isa, *s.pool, o, slice_lora_view(lora, s.slice));
  });
  lora_ = lora;
  bool one_memory_node = shards_.size() > 1;
  for (const auto& s : shards_) one_memory_node = one_memory_node && s->os_node == shards_[0]->os_node;
  // int4 at groups under 64: whether an expert's codes are held in tile order depends on each
  // node's scales (MoeForward), so the nodes' layouts of x may differ.
  forward_layouts_agree_ = type != WeightType::int4 || int4_group % 64 == 0;
  if (one_memory_node) shared_gather_ = pool_workspace<SharedGather>(*shards_[0]->pool);
}

TensorParallelLayer::~TensorParallelLayer() = default;

void TensorParallelLayer::update_lora_weights(const LayerLoraView& lora, bool held) {
  validate_lora_view(lora, shape_, max_rank_, "update_lora_weights");
  std::vector<LayerLoraView> views;
  for (const auto& s : shards_) {
    views.push_back(slice_lora_view(lora, s->slice));
    validate_lora_view(views.back(), s->weights.shape(), max_rank_, "update_lora_weights");
  }
  for (std::size_t n = 0; n < shards_.size(); ++n) shards_[n]->layer->update_lora_weights(views[n], held);
  lora_ = lora;
}

quant::IntermediateSlice TensorParallelLayer::slice(int node) const { return shards_.at(static_cast<std::size_t>(node))->slice; }
const PackedExpertWeights& TensorParallelLayer::packed(int node) const { return shards_.at(static_cast<std::size_t>(node))->weights; }
MoeSftLayer& TensorParallelLayer::node_layer(int node) { return *shards_.at(static_cast<std::size_t>(node))->layer; }
int TensorParallelLayer::cached_forwards() const { return shards_[0]->layer->cached_forwards(); }
int TensorParallelLayer::tokens_of_newest_saved() const { return shards_[0]->layer->tokens_of_newest_saved(); }

std::size_t TensorParallelLayer::cache_bytes() const {
  std::size_t b = 0;
  for (const auto& s : shards_) b += s->layer->cache_bytes();
  return b;
}

std::size_t TensorParallelLayer::weight_copy_bytes() const {
  std::size_t b = 0;
  for (const auto& s : shards_) b += s->layer->weight_copy_bytes();
  return b;
}

std::size_t TensorParallelLayer::weight_bytes() const {
  std::size_t b = 0;
  for (const auto& s : shards_) b += s->weights.bytes();
  return b;
}

std::size_t TensorParallelLayer::streamed_weight_bytes() const {
  std::size_t b = 0;
  for (const auto& s : shards_) b += s->weights.streamed_bytes();
  return b;
}

void TensorParallelLayer::merge_rows(float* dst, int tokens, const std::function<const float*(int node)>& partial) {
  const auto t0 = std::chrono::steady_clock::now();
  struct Lap {
    double& total;
    std::chrono::steady_clock::time_point t0;
    ~Lap() { total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
  } lap{merge_seconds_, t0};
  const std::size_t hidden = static_cast<std::size_t>(shape_.hidden);
  const int n_nodes = node_count();
  auto merge = [&](std::size_t r0, std::size_t r1) {
    for (int n = 1; n < n_nodes; ++n) {
      const float* src = partial(n);
      for (std::size_t i = r0 * hidden; i < r1 * hidden; ++i) dst[i] += src[i];
    }
  };
  const std::size_t rows = static_cast<std::size_t>(tokens);
  if (rows * hidden <= kMergeInline) return merge(0, rows);
  // Node n adds up rows [n * rows / N, (n + 1) * rows / N), in 8-row items on its own workers.
  nodes_.run_on_nodes([&](int node) {
    if (node >= n_nodes) return;
    const std::size_t r0 = rows * static_cast<std::size_t>(node) / n_nodes, r1 = rows * static_cast<std::size_t>(node + 1) / n_nodes;
    const std::size_t items = (r1 - r0 + 7) / 8;
    shards_[static_cast<std::size_t>(node)]->pool->parallel_for(items, [&](std::size_t item, int) {
      merge(r0 + item * 8, std::min(r1, r0 + item * 8 + 8));
    });
  });
}

void TensorParallelLayer::forward_sft(int tokens, int top_k, const bf16* x, const std::int64_t* expert_ids, const float* weights,
                                      float* out, bool save_for_backward) {
  const int n_nodes = node_count();
  if (n_nodes == 1) return shards_[0]->layer->forward_sft(tokens, top_k, x, expert_ids, weights, out, save_for_backward);
  // The checks every node would make, made once, so that the nodes either all run or none does.
  SharedGather* shared = nullptr;
  std::unique_lock<std::mutex> shared_in_use;  // the node group's other layers wait
  if (tokens > 0) {
    const TokenGroups groups = group_tokens_by_expert(expert_ids, tokens, top_k, shape_.num_experts);
    if (gather_shared()) {
      shared = shared_gather_.get();
      shared_in_use = std::unique_lock<std::mutex>(shared->in_use);
      const PackedExpertWeights& w = shards_[0]->weights;
      const bool quantized = is_integer_weight_type(type_);
      shared->prepare(groups, quantized ? 0 : static_cast<std::size_t>(w.up_shape().k_padded),
                      quantized ? static_cast<std::size_t>(w.int_shape(Projection::gate).k_padded) : 0, n_nodes, tokens);
    }
  }
  down_lora_sums_.prepare(n_nodes, shape_.num_experts);
  const int saved_before = cached_forwards();
  const std::size_t elems = static_cast<std::size_t>(std::max(tokens, 0)) * shape_.hidden;
  node_seconds_.start.resize(static_cast<std::size_t>(n_nodes));
  node_seconds_.end.resize(static_cast<std::size_t>(n_nodes));
  node_seconds_.guest_items.resize(static_cast<std::size_t>(n_nodes));
  for (int n = 0; n < n_nodes; ++n)
    node_seconds_.guest_items[static_cast<std::size_t>(n)] -= static_cast<double>(shards_[static_cast<std::size_t>(n)]->pool->guest_items());
  const auto t0 = std::chrono::steady_clock::now();
  auto since_t0 = [&t0] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  try {
    nodes_.run_on_nodes([&](int node) {
      if (node >= n_nodes) return;
      node_seconds_.start[static_cast<std::size_t>(node)] += since_t0();
      struct End {
        double& total;
        const decltype(since_t0)& now;
        ~End() { total += now(); }
      } end{node_seconds_.end[static_cast<std::size_t>(node)], since_t0};
      Shard& s = *shards_[static_cast<std::size_t>(node)];
      float* dst = out;
      if (node > 0) {
        ensure(s.out, elems, s.os_node);
        dst = s.out.data();
      }
      try {
        s.layer->forward_sft(tokens, top_k, x, expert_ids, weights, dst, save_for_backward, {shared, &down_lora_sums_, node});
      } catch (const SharedGather::Stopped&) {
        // Another node failed while it held a unit: its error is rethrown below. This node's
        // partials of down's LoRA will not all come either.
        down_lora_sums_.fail(shared->error());
      } catch (const ExpertPartialSums::Stopped&) {
        // Another node failed before it published: its error is rethrown below.
      } catch (...) {
        down_lora_sums_.fail(std::current_exception());
        throw;
      }
    });
    node_seconds_.all += since_t0();
    for (int n = 0; n < n_nodes; ++n)
      node_seconds_.guest_items[static_cast<std::size_t>(n)] += static_cast<double>(shards_[static_cast<std::size_t>(n)]->pool->guest_items());
    if (shared && shared->error()) std::rethrow_exception(shared->error());
    if (down_lora_sums_.error()) std::rethrow_exception(down_lora_sums_.error());
  } catch (...) {
    for (const auto& s : shards_)
      if (s->layer->cached_forwards() > saved_before) s->layer->discard_newest_saved();
    throw;
  }
  merge_rows(out, tokens, [&](int node) { return shards_[static_cast<std::size_t>(node)]->out.data(); });
}

void TensorParallelLayer::backward(const float* grad_output, float* grad_input, const LayerLoraGrad& grads, bool accumulate) {
  const int n_nodes = node_count();
  if (n_nodes == 1) return shards_[0]->layer->backward(grad_output, grad_input, grads, accumulate);
  const ForwardCacheEntry& entry = shards_[0]->layer->newest_saved();  // Error(state) on an empty stack
  const int tokens = entry.tokens;
  const LayerLoraView lora = entry.lora;  // node 0's view: full widths for the summed gradients
  const std::size_t elems = static_cast<std::size_t>(tokens) * shape_.hidden;
  // Every node writes its windows of the caller's gradient arrays; the summed ones (gate's and
  // up's A, down's B) are written once, from every node's partials (cross_node_sums.hpp).
  sums_.prepare(n_nodes);
  BackwardNodes shared_work{&sums_, 0, nullptr};
  std::unique_lock<std::mutex> shared_in_use;  // the node group's other layers wait
  if (shared_gather_ && share_gather_ && tokens > 0) {
    shared_work.gather = shared_gather_.get();
    shared_in_use = std::unique_lock<std::mutex>(shared_work.gather->in_use);
    const TokenGroups groups = group_tokens_by_expert(entry.ids.data(), tokens, entry.top_k, shape_.num_experts);
    // dY rows as every node's down products read them: the hidden size padded to a k-block.
    const std::size_t dy_ld = static_cast<std::size_t>(kernels::transposed_kblocks(shards_[0]->weights.down_shape().panels)) * kernels::kBlockK;
    shared_work.gather->prepare_backward(groups, dy_ld);
  }
  const int saved_before = cached_forwards();
  try {
    nodes_.run_on_nodes([&](int node) {
      if (node >= n_nodes) return;
      Shard& s = *shards_[static_cast<std::size_t>(node)];
      float* dst = grad_input;
      if (node > 0) {
        ensure(s.grad_in, elems, s.os_node);
        dst = s.grad_in.data();
      }
      try {
        BackwardNodes mine = shared_work;
        mine.node = node;
        s.layer->backward(grad_output, dst, slice_lora_grad(grads, lora, shape_, s.slice), accumulate, mine);
      } catch (const CrossNodeSums::Stopped&) {
        // Another node failed before it published: its error is rethrown below.
      } catch (...) {
        sums_.fail(std::current_exception());
        throw;
      }
    });
    if (sums_.error()) std::rethrow_exception(sums_.error());
  } catch (...) {
    // Keep the nodes' stacks in step: a forward that some node has popped is dropped everywhere.
    for (const auto& s : shards_)
      if (s->layer->cached_forwards() == saved_before) s->layer->discard_newest_saved();
    throw;
  }
  merge_rows(grad_input, tokens, [&](int node) { return shards_[static_cast<std::size_t>(node)]->grad_in.data(); });
}

}  // namespace tilemoe
