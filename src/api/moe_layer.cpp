// The public MoeLayer: argument checks, bf16 <-> f32 at the boundary, the runtime's ordering, on
// top of MoeSftLayer (src/layer), which does the work.
#include "tilemoe/moe_layer.hpp"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "amx/aligned_vector.hpp"
#include "amx/kernel_table.hpp"
#include "src/api/layer_peft_state.hpp"
#include "src/api/runtime_impl.hpp"
#include "numa/node_group.hpp"
#include "src/layer/moe_compute.hpp"
#include "src/layer/moe_sft_layer.hpp"
#include "src/layer/tensor_parallel_layer.hpp"
#include "src/layer/packed_experts.hpp"
#include "src/lora/lora_view.hpp"
#include "src/lora/held_adapter.hpp"
#include "src/lora/peft_adapter.hpp"
#include "src/model/checkpoint.hpp"
#include "src/model/finite_check.hpp"
#include "src/model/tensor_names.hpp"
#include "src/quant/checkpoint_fingerprint.hpp"
#include "src/quant/mxfp4_checkpoint.hpp"
#include "src/quant/numa_slices.hpp"
#include "src/quant/quantize.hpp"
#include "src/quant/quantized_file.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe {
namespace {

// Bounds that keep every size product far inside 64 bits and every row count inside int.
constexpr int kMaxDim = 1 << 17;
constexpr int kMaxTokens = 1 << 20;

void check_config(const MoeLayerConfig& c) {
  auto bad = [](const std::string& m) { fail(ErrorKind::invalid_argument, "MoeLayerConfig: " + m); };
  if (c.num_experts <= 0 || c.num_experts > kMaxDim) bad("num_experts " + std::to_string(c.num_experts) + " must be in [1, 131072]");
  if (c.top_k <= 0 || c.top_k > c.num_experts)
    bad("top_k " + std::to_string(c.top_k) + " must be in [1, num_experts = " + std::to_string(c.num_experts) + "]");
  if (c.hidden <= 0 || c.hidden > kMaxDim || c.intermediate <= 0 || c.intermediate > kMaxDim)
    bad("hidden " + std::to_string(c.hidden) + " and intermediate " + std::to_string(c.intermediate) + " must be in [1, 131072]");
  if (c.max_tokens <= 0 || c.max_tokens > kMaxTokens)
    bad("max_tokens " + std::to_string(c.max_tokens) + " must be in [1, " + std::to_string(kMaxTokens) + "]");
  if (c.lora_rank < 0 || c.lora_rank > std::min(c.hidden, c.intermediate))
    bad("lora_rank " + std::to_string(c.lora_rank) + " must be in [0, min(hidden, intermediate)]");
  if (c.lora_rank > 0 && !std::isfinite(c.lora_alpha)) bad("lora_alpha must be finite");
  if (c.max_cache_depth < 0 || c.max_cache_depth > 1024)
    bad("max_cache_depth " + std::to_string(c.max_cache_depth) + " must be in [0, 1024]");
  if (c.weight_type != WeightType::bf16 && c.weight_type != WeightType::int8 && c.weight_type != WeightType::int4 &&
      c.weight_type != WeightType::mxfp4)
    bad("weight_type " + std::to_string(static_cast<int>(c.weight_type)) + " is not bf16, int8, int4 or mxfp4");
  if (c.weight_type == WeightType::int4 && c.group_size != 32 && c.group_size != 64 && c.group_size != 128)
    bad("group_size " + std::to_string(c.group_size) + " must be 32, 64 or 128 for int4 weights");
  if (c.numa_nodes < 0 || c.numa_nodes > 1024)
    bad("numa_nodes " + std::to_string(c.numa_nodes) + " must be in [0, 1024] (0: the machine's NUMA nodes)");
  if (c.backward_weight_copy && c.weight_type != WeightType::bf16)
    bad(std::string("backward_weight_copy needs bf16 weights, not ") + weight_type_name(c.weight_type) +
        " (training through int8/int4/mxfp4 weights dequantizes them per k-block instead)");
  if (!valid_swiglu_limit(c.swiglu_limit))
    bad("swiglu_limit " + std::to_string(c.swiglu_limit) + " must be 0 (no clamp) or a finite value > 0");
  if (!valid_swiglu_alpha(c.swiglu_alpha))
    bad("swiglu_alpha " + std::to_string(c.swiglu_alpha) + " must be a finite value > 0 (1: the plain SwiGLU)");
  if (!valid_swiglu_up_offset(c.swiglu_up_offset))
    bad("swiglu_up_offset " + std::to_string(c.swiglu_up_offset) + " must be finite (0: the plain SwiGLU)");
}

// What the experts compute, as the config says.
MoeShape shape_of(const MoeLayerConfig& c) {
  MoeShape s{c.hidden, c.intermediate, c.num_experts, c.top_k, static_cast<float>(c.swiglu_limit)};
  s.swiglu_alpha = static_cast<float>(c.swiglu_alpha);
  s.swiglu_up_offset = static_cast<float>(c.swiglu_up_offset);
  return s;
}

// Biases are refused as weights are when not finite, naming the expert.
void check_finite_biases(const ExpertWeightsView& w) {
  const MoeShape& s = w.shape;
  for (Projection p : kProjections) {
    const bf16* b = p == Projection::gate ? w.gate_bias : p == Projection::up ? w.up_bias : w.down_bias;
    if (!b) continue;
    const std::size_t n = static_cast<std::size_t>(projection_out(s, p));
    for (int e = 0; e < s.num_experts; ++e)
      require_finite(b + n * static_cast<std::size_t>(e), n, "MoeLayer: expert " + std::to_string(e) + " " + projection_name(p) + " bias");
  }
}

// Non-finite weights would poison every token routed to that expert: refuse them, naming the
// lowest bad expert whatever the thread count.
void check_finite_weights(const ExpertWeightsView& w, numa::ThreadPool& pool) {
  const int items = 3 * w.shape.num_experts;
  const std::size_t n = static_cast<std::size_t>(w.shape.hidden) * w.shape.intermediate;
  std::vector<char> bad(static_cast<std::size_t>(items), 0);
  pool.parallel_for(static_cast<std::size_t>(items), [&](std::size_t i, int) {
    const bf16* v = w.projection(kProjections[i % 3], static_cast<int>(i / 3));
    bf16 any = 0;
    for (std::size_t j = 0; j < n; ++j) any |= static_cast<bf16>(bf16_is_finite(v[j]) ? 0 : 1);
    bad[i] = static_cast<char>(any);
  });
  for (int i = 0; i < items; ++i)
    if (bad[static_cast<std::size_t>(i)]) {
      Projection p = kProjections[static_cast<std::size_t>(i % 3)];
      require_finite(w.projection(p, i / 3), n,
                     "MoeLayer: expert " + std::to_string(i / 3) + " " + projection_name(p) + " weight");
    }
}

}  // namespace

struct MoeLayer::Impl {
  Runtime::Impl& rt;
  MoeLayerConfig cfg;
  ModelConfig model;      // shape and MoE layers, for adapters
  int model_layer = -1;   // index in the model when known
  float scale = 0;
  std::unique_ptr<TensorParallelLayer> sft;  // one slice per NUMA node; one node: the plain layer
  std::unique_ptr<HeldAdapter> adapter;  // f32 or bf16, as AdapterStorage asks (held_adapter.hpp)
  int adapter_layer = -1;                // the model index the adapter was loaded at
  // A checkpoint layer's expert modules ("model.layers.3.mlp.experts.{E}.gate_proj"), for
  // save_peft_adapter's key names; checkpoint_stacked: transformers v5's stacked experts.
  std::array<std::string, 3> checkpoint_modules;
  bool checkpoint_stacked = false;
  std::vector<float> out_f32, grad_out_f32, grad_in_f32;  // bf16 callers' f32 side, grown on demand

  Impl(Runtime::Impl& r, const MoeLayerConfig& c) : rt(r), cfg(c) {}

  const kernels::KernelTable& kt() const { return kernels::kernel_table(rt.isa); }
  std::size_t hidden_elems(int tokens) const { return static_cast<std::size_t>(tokens) * cfg.hidden; }

  void run(const std::function<void()>& fn) { rt.queue.run_now(fn, this); }
  Runtime::Ticket submit(std::function<void()> fn) { return rt.queue.submit(std::move(fn), this); }

  void to_bf16(const float* src, int tokens, bf16* dst) {
    const std::size_t row = static_cast<std::size_t>(cfg.hidden);
    auto convert = kt().convert_to_bf16;
    rt.pool->parallel_for(static_cast<std::size_t>(tokens), [&](std::size_t t, int) { convert(src + t * row, row, 1.0f, dst + t * row); },
                          16);
  }
  void to_f32(const bf16* src, int tokens, float* dst) {
    const std::size_t row = static_cast<std::size_t>(cfg.hidden);
    rt.pool->parallel_for(static_cast<std::size_t>(tokens), [&](std::size_t t, int) {
      for (std::size_t i = t * row; i < (t + 1) * row; ++i) dst[i] = bf16_to_float(src[i]);
    }, 16);
  }

  void check_batch(const char* who, int tokens, int top_k, const void* x, const void* ids, const void* w, const void* out) const {
    std::string where = std::string("MoeLayer::") + who + ": ";
    if (tokens < 0 || tokens > cfg.max_tokens)
      fail(ErrorKind::invalid_argument, where + "tokens " + std::to_string(tokens) + " must be in [0, max_tokens = " +
                                            std::to_string(cfg.max_tokens) + "]");
    if (top_k <= 0 || top_k > cfg.top_k)
      fail(ErrorKind::invalid_argument, where + "top_k " + std::to_string(top_k) + " must be in [1, " + std::to_string(cfg.top_k) +
                                            "] (the config's top_k)");
    if (tokens > 0 && (!x || !ids || !w || !out))
      fail(ErrorKind::invalid_argument, where + "input, expert_ids, weights and output must not be null");
  }

  void forward(const char* who, int tokens, int top_k, const bf16* x, const std::int64_t* ids, const float* w, void* out,
               bool out_bf16, bool save) {
    check_batch(who, tokens, top_k, x, ids, w, out);
    float* y = static_cast<float*>(out);
    if (out_bf16) {
      grow_to(out_f32, hidden_elems(tokens));
      y = out_f32.data();
    }
    sft->forward_sft(tokens, top_k, x, ids, w, y, save);
    if (out_bf16) to_bf16(y, tokens, static_cast<bf16*>(out));
  }

  void backward(const void* grad_out, bool in_bf16, void* grad_in, bool gi_bf16, const LayerLoraGrad& grads, bool accumulate) {
    const int tokens = sft->tokens_of_newest_saved();  // Error(state) on an empty stack
    if (tokens > 0 && (!grad_out || !grad_in))
      fail(ErrorKind::invalid_argument, "MoeLayer::backward: grad_output and grad_input must not be null");
    for (Projection p : kProjections) {
      const LoraDType d = grads[static_cast<int>(p)].dtype;
      if (d != LoraDType::f32 && d != LoraDType::bf16)
        fail(ErrorKind::invalid_argument, std::string("MoeLayer::backward: LoRA gradients of ") + projection_name(p) +
                                              ": unknown element type " + std::to_string(static_cast<int>(d)) + " (f32 or bf16)");
    }
    const float* go = static_cast<const float*>(grad_out);
    if (in_bf16) {
      grow_to(grad_out_f32, hidden_elems(tokens));
      to_f32(static_cast<const bf16*>(grad_out), tokens, grad_out_f32.data());
      go = grad_out_f32.data();
    }
    float* gi = static_cast<float*>(grad_in);
    if (gi_bf16) {
      grow_to(grad_in_f32, hidden_elems(tokens));
      gi = grad_in_f32.data();
    }
    sft->backward(go, gi, grads, accumulate);
    if (gi_bf16) to_bf16(gi, tokens, static_cast<bf16*>(grad_in));
  }

  LayerLoraView view_of(const LoraWeights& w) const {
    const void* a[3] = {w.gate_a, w.up_a, w.down_a};
    const void* b[3] = {w.gate_b, w.up_b, w.down_b};
    LayerLoraView v;
    for (int i = 0; i < 3; ++i) {
      Projection p = kProjections[static_cast<std::size_t>(i)];
      if (!a[i] && !b[i]) continue;
      std::string where = std::string("MoeLayer::update_lora_weights: LoRA of ") + projection_name(p) + ": ";
      if (!a[i] || !b[i]) fail(ErrorKind::invalid_argument, where + (a[i] ? "A is given but B is null" : "B is given but A is null"));
      if (cfg.lora_rank == 0)
        fail(ErrorKind::invalid_argument, where + "the layer was built with lora_rank 0; set MoeLayerConfig::lora_rank");
      auto& d = v[p];
      d.rank = cfg.lora_rank;
      d.in = projection_in(model.shape, p);
      d.out = projection_out(model.shape, p);
      d.a = a[i];
      d.b = b[i];
      d.dtype = w.dtype;
      d.uniform_scale = scale;
    }
    return v;
  }

  void require_empty_cache(const char* who) const {
    if (sft->cached_forwards() > 0)
      fail(ErrorKind::state, std::string("MoeLayer::") + who + ": " + std::to_string(sft->cached_forwards()) +
                                 " saved forward(s) still use the current LoRA; run their backward first");
  }

  void load_adapter(const std::string& path, int layer, AdapterStorage storage) {
    require_empty_cache("load_adapter");
    if (layer < 0) layer = model_layer;
    if (layer < 0)
      fail(ErrorKind::invalid_argument, "MoeLayer::load_adapter: " + path + ": pass the layer's index in the model (the layer was "
                                                                           "built from memory and does not know it)");
    auto loaded = std::make_unique<HeldAdapter>(load_layer_lora(path, model, layer), storage);
    // Validates (rank within lora_rank). The adapter is the layer's and nothing writes it while
    // it is loaded, so forward packs it once.
    sft->update_lora_weights(loaded->view(), /*held=*/true);
    adapter = std::move(loaded);
    adapter_layer = layer;
  }
};

namespace {

ModelConfig model_of(const MoeLayerConfig& c) {
  ModelConfig m;
  m.shape = shape_of(c);
  // A layer built from memory does not know the model's depth: every index up to a generous
  // bound is taken as a MoE layer, so that an adapter covering many layers opens for any one.
  m.num_layers = 1024;
  for (int i = 0; i < m.num_layers; ++i) m.moe_layers.push_back(i);
  return m;
}

// `cfg` is checked by the callers, before anything is loaded; checkpoint loads check finiteness
// tensor by tensor as they read, so only the caller's memory is scanned here. `quantized`, when
// given, holds the experts already quantized (w is then not read); otherwise int8/int4/mxfp4 layers
// quantize w here.
std::unique_ptr<MoeLayer::Impl> build(Runtime& runtime, const MoeLayerConfig& cfg, ExpertWeightsView w, ModelConfig model,
                                      int model_layer, std::unique_ptr<HeldAdapter> adapter, bool weights_checked,
                                      const quant::QuantizedExperts* quantized = nullptr) {
  Runtime::Impl& rt = runtime.impl();
  // The config says what the experts compute; `quantized` carries the same limit (quantized from
  // w, or load_quantized_layer given the model's shape).
  w.shape = shape_of(cfg);
  if (!weights_checked && !quantized) check_finite_weights(w, *rt.pool);
  if (!weights_checked) check_finite_biases(w);
  quant::QuantizedExperts made;
  if (!quantized && cfg.weight_type != WeightType::bf16) {
    made = quant::quantize_experts(w, cfg.weight_type, cfg.group_size, rt.pool);
    quantized = &made;
  }
  auto m = std::make_unique<MoeLayer::Impl>(rt, cfg);
  m->model = std::move(model);
  m->model_layer = model_layer;
  m->scale = static_cast<float>(lora_scaling(cfg.lora_alpha, cfg.lora_rank, cfg.use_rslora));
  SftLayerOptions opt;
  opt.max_tokens = cfg.max_tokens;
  opt.max_cache_depth = cfg.max_cache_depth;
  opt.max_lora_rank = cfg.lora_rank;
  opt.max_top_k = cfg.top_k;
  opt.backward_weight_copy = cfg.backward_weight_copy;
  LayerLoraView view = adapter ? adapter->view() : LayerLoraView{};
  numa::NodeGroup& nodes = node_group_for(*rt.pool, cfg.numa_nodes);
  m->cfg.numa_nodes = nodes.size();
  const MoeShape shape = quantized ? quantized->shape : w.shape;
  const WeightType type = quantized ? quantized->type : WeightType::bf16;
  const int group = quantized && is_four_bit_weight_type(quantized->type) ? quantized->group : cfg.group_size;
  m->cfg.weight_type = type;
  m->cfg.group_size = group;
  m->sft = std::make_unique<TensorParallelLayer>(
      shape, type, group, nodes, rt.isa, opt,
      [&](quant::IntermediateSlice s, numa::ThreadPool& pool, int node) {
        if (!quantized) return PackedExpertWeights::pack_slice(w, s, pool, node);
        return PackedExpertWeights::pack_quantized_slice(*quantized, s, pool, node);
      },
      view);
  if (adapter) m->sft->update_lora_weights(view, /*held=*/true);  // the layer's own adapter: packed once
  m->adapter = std::move(adapter);
  return m;
}

// The names a checkpoint layer's experts are stored under, which a PEFT adapter for the model
// builds its keys from; the layer index its adapter was loaded at.
std::unique_ptr<MoeLayer::Impl> with_checkpoint_names(std::unique_ptr<MoeLayer::Impl> m, const Checkpoint& ckpt, int layer) {
  const auto refs = ckpt.expert_tensors(layer);
  for (Projection p : kProjections) {
    const auto& first = refs[static_cast<int>(p)].front();
    if (first.stacked()) {
      m->checkpoint_stacked = true;
      continue;
    }
    std::string module = expert_key_template(first.name, 0);
    const std::string suffix = ".weight";
    if (module.size() > suffix.size() && module.compare(module.size() - suffix.size(), suffix.size(), suffix) == 0)
      module.resize(module.size() - suffix.size());
    m->checkpoint_modules[static_cast<int>(p)] = module;
  }
  if (m->adapter) m->adapter_layer = layer;
  return m;
}

}  // namespace

MoeLayer::MoeLayer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MoeLayer::MoeLayer(Runtime& runtime, const MoeLayerConfig& config, const ExpertWeightsRef& weights) {
  check_config(config);
  if (!weights.gate || !weights.up || !weights.down)
    fail(ErrorKind::invalid_argument, "MoeLayer: gate, up and down weights must not be null");
  const std::size_t per = static_cast<std::size_t>(config.hidden) * static_cast<std::size_t>(config.intermediate);
  const std::size_t strides[3] = {weights.gate_stride, weights.up_stride, weights.down_stride};
  for (Projection p : kProjections)
    if (const std::size_t st = strides[static_cast<int>(p)]; st != 0 && st < per)
      fail(ErrorKind::invalid_argument, std::string("MoeLayer: ") + projection_name(p) + "_stride is " + std::to_string(st) +
                                            " elements, less than one expert's matrix (hidden x intermediate = " + std::to_string(per) +
                                            "), so experts would overlap; 0 means dense");
  ExpertWeightsView w{shape_of(config), weights.gate, weights.up, weights.down, weights.gate_stride, weights.up_stride, weights.down_stride};
  w.gate_bias = weights.gate_bias;
  w.up_bias = weights.up_bias;
  w.down_bias = weights.down_bias;
  impl_ = build(runtime, config, w, model_of(config), -1, nullptr, /*weights_checked=*/false);
}

MoeLayer MoeLayer::from_checkpoint(Runtime& runtime, const std::string& model_dir, int layer, const CheckpointLayerOptions& options) {
  Checkpoint ckpt = Checkpoint::open(model_dir);
  const ModelConfig& model = ckpt.config();
  std::unique_ptr<HeldAdapter> adapter;
  if (!options.adapter.empty())
    adapter = std::make_unique<HeldAdapter>(load_layer_lora(options.adapter, model, layer), options.adapter_storage);
  MoeLayerConfig cfg;
  cfg.num_experts = model.shape.num_experts;
  cfg.top_k = model.shape.top_k;
  cfg.hidden = model.shape.hidden;
  cfg.intermediate = model.shape.intermediate;
  cfg.max_tokens = options.max_tokens;
  cfg.max_cache_depth = options.max_cache_depth;
  cfg.lora_rank = std::max(options.lora_rank, adapter ? adapter->view().max_rank() : 0);
  cfg.lora_alpha = options.lora_alpha;  // for sets given as LoraWeights; adapters carry their own scales
  cfg.use_rslora = options.use_rslora;
  cfg.numa_nodes = options.numa_nodes;
  cfg.weight_type = options.weight_type;
  cfg.group_size = options.group_size;
  cfg.backward_weight_copy = options.backward_weight_copy;
  cfg.swiglu_limit = model.shape.swiglu_limit;
  cfg.swiglu_alpha = model.shape.swiglu_alpha;
  cfg.swiglu_up_offset = model.shape.swiglu_up_offset;
  check_config(cfg);
  if (!options.quantized_dir.empty()) {
    // Checked against this checkpoint (shape and fingerprint), never re-quantized; the bf16
    // experts are not read at all.
    quant::QuantizedExperts q =
        quant::load_quantized_layer(options.quantized_dir, layer, model.shape, quant::checkpoint_fingerprint(ckpt));
    if (options.weight_type != WeightType::bf16 && options.weight_type != q.type)
      fail(ErrorKind::invalid_argument, "MoeLayer::from_checkpoint: " + options.quantized_dir + " holds " + weight_type_name(q.type) +
                                            " weights but weight_type " + weight_type_name(options.weight_type) + " was asked for");
    if (options.weight_type == WeightType::int4 && q.type == WeightType::int4 && options.group_size != q.group)
      fail(ErrorKind::invalid_argument, "MoeLayer::from_checkpoint: " + options.quantized_dir + " has int4 group size " +
                                            std::to_string(q.group) + " but group_size " + std::to_string(options.group_size) +
                                            " was asked for");
    // The experts' biases (gpt-oss) are not quantized and not in the directory: the checkpoint's.
    ExpertWeights biases;
    biases.shape = model.shape;
    ckpt.load_layer_biases(layer, biases);
    q.biases = ExpertBiases::of_view(biases.view());
    return MoeLayer(with_checkpoint_names(build(runtime, cfg, ExpertWeightsView{model.shape, nullptr, nullptr, nullptr}, model,
                                                layer, std::move(adapter), /*weights_checked=*/true, &q),
                                          ckpt, layer));
  }
  if (options.weight_type == WeightType::mxfp4) {
    // MXFP4 experts (gpt-oss's hub files) are taken as stored: no bf16 copy, the exact values.
    quant::QuantizedExperts q;
    if (quant::read_mxfp4_layer(ckpt, layer, q, runtime.impl().pool))
      return MoeLayer(with_checkpoint_names(build(runtime, cfg, ExpertWeightsView{model.shape, nullptr, nullptr, nullptr}, model, layer,
                                                  std::move(adapter), /*weights_checked=*/true, &q),
                                            ckpt, layer));
  }
  ExpertWeights experts = ckpt.load_layer_experts(layer);
  return MoeLayer(
      with_checkpoint_names(build(runtime, cfg, experts.view(), model, layer, std::move(adapter), /*weights_checked=*/true), ckpt, layer));
}

MoeLayer::~MoeLayer() {
  if (impl_) impl_->rt.queue.drain(impl_.get());
}
MoeLayer::MoeLayer(MoeLayer&&) noexcept = default;
MoeLayer& MoeLayer::operator=(MoeLayer&& other) noexcept {
  if (this != &other) {
    if (impl_) impl_->rt.queue.drain(impl_.get());
    impl_ = std::move(other.impl_);
  }
  return *this;
}

const MoeLayerConfig& MoeLayer::config() const { return impl_->cfg; }
double MoeLayer::lora_scale() const { return impl_->scale; }
const LayerLoraView& MoeLayer::lora() const { return impl_->sft->lora(); }
LayerPeftStackedKeys MoeLayer::adapter_stacked_keys() const {
  Impl* m = impl_.get();
  LayerPeftStackedKeys out;
  m->run([m, &out] {  // after the queued tasks, one of which may load or unload the adapter
    if (m->adapter) out = m->adapter->stacked_keys();
  });
  return out;
}
int MoeLayer::cached_forwards() const { return impl_->sft->cached_forwards(); }
std::size_t MoeLayer::cache_bytes() const { return impl_->sft->cache_bytes(); }
std::size_t MoeLayer::weight_copy_bytes() const { return impl_->sft->weight_copy_bytes(); }
std::size_t MoeLayer::weight_bytes() const { return impl_->sft->weight_bytes(); }

void MoeLayer::forward(int tokens, int top_k, const bf16* x, const std::int64_t* ids, const float* w, bf16* out) {
  Impl* m = impl_.get();
  m->run([=] { m->forward("forward", tokens, top_k, x, ids, w, out, true, false); });
}
void MoeLayer::forward(int tokens, int top_k, const bf16* x, const std::int64_t* ids, const float* w, float* out) {
  Impl* m = impl_.get();
  m->run([=] { m->forward("forward", tokens, top_k, x, ids, w, out, false, false); });
}
void MoeLayer::forward_sft(int tokens, int top_k, const bf16* x, const std::int64_t* ids, const float* w, bf16* out, bool save) {
  Impl* m = impl_.get();
  m->run([=] { m->forward("forward_sft", tokens, top_k, x, ids, w, out, true, save); });
}
void MoeLayer::forward_sft(int tokens, int top_k, const bf16* x, const std::int64_t* ids, const float* w, float* out, bool save) {
  Impl* m = impl_.get();
  m->run([=] { m->forward("forward_sft", tokens, top_k, x, ids, w, out, false, save); });
}

namespace {
LayerLoraGrad grad_of(const LoraGrads& g) {
  LayerLoraGrad v;
  v[0].a = g.gate_a, v[0].b = g.gate_b;
  v[1].a = g.up_a, v[1].b = g.up_b;
  v[2].a = g.down_a, v[2].b = g.down_b;
  for (auto& p : v) p.dtype = g.dtype;
  return v;
}
}  // namespace

void MoeLayer::backward(const bf16* grad_output, bf16* grad_input, const LoraGrads& grads, bool accumulate) {
  Impl* m = impl_.get();
  LayerLoraGrad g = grad_of(grads);
  m->run([=] { m->backward(grad_output, true, grad_input, true, g, accumulate); });
}
void MoeLayer::backward(const float* grad_output, float* grad_input, const LoraGrads& grads, bool accumulate) {
  backward(grad_output, grad_input, grad_of(grads), accumulate);
}
void MoeLayer::backward(const float* grad_output, float* grad_input, const LayerLoraGrad& grads, bool accumulate) {
  Impl* m = impl_.get();
  m->run([=] { m->backward(grad_output, false, grad_input, false, grads, accumulate); });
}

void MoeLayer::update_lora_weights(const LoraWeights& weights) { update_lora_weights(impl_->view_of(weights)); }
void MoeLayer::update_lora_weights(const LayerLoraView& view) {
  Impl* m = impl_.get();
  m->run([=] { m->sft->update_lora_weights(view); });
}
void MoeLayer::load_adapter(const std::string& path, int layer, AdapterStorage storage) {
  Impl* m = impl_.get();
  m->run([=] { m->load_adapter(path, layer, storage); });
}
void MoeLayer::unload_adapter() {
  Impl* m = impl_.get();
  m->run([=] {
    m->require_empty_cache("unload_adapter");
    m->sft->update_lora_weights({});
    m->adapter.reset();
  });
}

Runtime::Ticket MoeLayer::submit_forward(int tokens, int top_k, const bf16* x, const std::int64_t* ids, const float* w, bf16* out) {
  Impl* m = impl_.get();
  m->check_batch("submit_forward", tokens, top_k, x, ids, w, out);
  return m->submit([=] { m->forward("forward", tokens, top_k, x, ids, w, out, true, false); });
}
Runtime::Ticket MoeLayer::submit_forward(int tokens, int top_k, const bf16* x, const std::int64_t* ids, const float* w, float* out) {
  Impl* m = impl_.get();
  m->check_batch("submit_forward", tokens, top_k, x, ids, w, out);
  return m->submit([=] { m->forward("forward", tokens, top_k, x, ids, w, out, false, false); });
}
Runtime::Ticket MoeLayer::submit_forward_sft(int tokens, int top_k, const bf16* x, const std::int64_t* ids, const float* w, bf16* out,
                                             bool save) {
  Impl* m = impl_.get();
  m->check_batch("submit_forward_sft", tokens, top_k, x, ids, w, out);
  return m->submit([=] { m->forward("forward_sft", tokens, top_k, x, ids, w, out, true, save); });
}
Runtime::Ticket MoeLayer::submit_forward_sft(int tokens, int top_k, const bf16* x, const std::int64_t* ids, const float* w, float* out,
                                             bool save) {
  Impl* m = impl_.get();
  m->check_batch("submit_forward_sft", tokens, top_k, x, ids, w, out);
  return m->submit([=] { m->forward("forward_sft", tokens, top_k, x, ids, w, out, false, save); });
}
Runtime::Ticket MoeLayer::submit_backward(const bf16* grad_output, bf16* grad_input, const LoraGrads& grads, bool accumulate) {
  Impl* m = impl_.get();
  LayerLoraGrad g = grad_of(grads);
  return m->submit([=] { m->backward(grad_output, true, grad_input, true, g, accumulate); });
}
Runtime::Ticket MoeLayer::submit_backward(const float* grad_output, float* grad_input, const LoraGrads& grads, bool accumulate) {
  Impl* m = impl_.get();
  LayerLoraGrad g = grad_of(grads);
  return m->submit([=] { m->backward(grad_output, false, grad_input, false, g, accumulate); });
}
Runtime::Ticket MoeLayer::submit_update_lora_weights(const LayerLoraView& view) {
  Impl* m = impl_.get();
  return m->submit([=] { m->sft->update_lora_weights(view); });
}

LayerPeftState layer_peft_state(const MoeLayer& layer) {
  MoeLayer::Impl* m = layer.impl_.get();
  LayerPeftState st;
  m->run([m, &st] {  // after the queued tasks, which may swap the set or load an adapter
    st.view = m->sft->lora();
    st.num_experts = m->cfg.num_experts;
    st.index = m->model_layer;
    st.checkpoint_modules = m->checkpoint_modules;
    st.checkpoint_stacked = m->checkpoint_stacked;
    if (m->adapter) {
      st.has_adapter = true;
      if (st.index < 0) st.index = m->adapter_layer;
      const LoadedLora& loaded = m->adapter->loaded();
      st.adapter.key_template_a = loaded.key_template_a;
      st.adapter.key_template_b = loaded.key_template_b;
      st.adapter.stacked = loaded.stacked;
      st.adapter.adapter_config = loaded.adapter_config;
      const LayerLoraView& held = m->adapter->view();
      for (Projection p : kProjections) {
        const int i = static_cast<int>(p);
        st.adapter_rank[i] = held[p].rank;
        st.adapter_expert_rank[i] = m->adapter->expert_rank(p);
        st.adapter_scale[i].assign(static_cast<std::size_t>(m->cfg.num_experts), 0.0f);
        for (int e = 0; e < m->cfg.num_experts; ++e)
          if (held[p].active(e)) st.adapter_scale[i][static_cast<std::size_t>(e)] = held[p].scale_of(e);
      }
    }
  });
  return st;
}

}  // namespace tilemoe
