#include "py_layer.hpp"

#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <utility>

#include "errors.hpp"
#include "layer_config.hpp"
#include "tensor_arg.hpp"
#include "tilemoe/error.hpp"

namespace tilemoe::binding {

struct PyLayer::Batch {
  int tokens = 0, top_k = 0;
  const bf16* x = nullptr;
  const std::int64_t* ids = nullptr;
  const float* weights = nullptr;
  void* out = nullptr;
  bool out_bf16 = false;
  py::object out_obj;
};

struct PyLayer::Grads {
  const void* grad_output = nullptr;
  void* grad_input = nullptr;
  bool bf16 = false;
  LayerLoraGrad lora{};
  py::object grad_input_obj;
  py::list refs;
};

namespace {

int checked_int(std::int64_t v, const char* what) {
  if (v > INT_MAX) value_error(std::string(what) + " " + std::to_string(v) + " is too large");
  return static_cast<int>(v);
}

// The runtime refuses ids >= num_experts at run time; a queued task must not fail (py_layer.hpp),
// so they are refused here, with the runtime's words.
void check_expert_ids(const std::int64_t* ids, int tokens, int top_k, int num_experts) {
  const std::size_t n = static_cast<std::size_t>(tokens) * top_k;
  for (std::size_t i = 0; i < n; ++i)
    if (ids[i] >= num_experts)
      value_error("expert_ids[" + std::to_string(i / top_k) + "][" + std::to_string(i % top_k) + "] = " + std::to_string(ids[i]) +
                  " is out of range: this layer has " + std::to_string(num_experts) +
                  " experts (ids < 0 mark experts that run elsewhere)");
}

// What LayerLoraView validation would refuse at run time.
void check_scales_finite(const LayerLoraView& view, int num_experts) {
  for (Projection p : kProjections) {
    const auto& v = view[p];
    for (int e = 0; e < num_experts && v.rank > 0; ++e)
      if (v.active(e) && !std::isfinite(v.scale_of(e)))
        value_error(std::string("scales: LoRA of ") + projection_name(p) + ", expert " + std::to_string(e) +
                    " has a non-finite scale");
  }
}

py::object set_keepalive_or_none(const py::object& o) { return o ? o : py::none(); }

}  // namespace

py::object Task::wait() {
  runtime->wait(ticket);
  return result;
}

PyLayer::PyLayer(std::shared_ptr<PyRuntime> runtime, py::handle config, py::handle gate, py::handle up, py::handle down,
                 std::optional<int> layer_index, const std::array<py::object, 3>& biases)
    : runtime_(std::move(runtime)) {
  const LayerSetup setup = layer_setup_from_py(config);
  const MoeLayerConfig& c = setup.config;
  TensorArg g = tensor_arg(gate, "gate", Access::read, {DType::bf16}), d = tensor_arg(down, "down", Access::read, {DType::bf16});
  d.require_shape({c.num_experts, c.hidden, c.intermediate});
  ExpertWeightsRef w;
  if (up.is_none()) {  // gate is gate and up stacked, [E, 2I, H] (w13, transformers v5's gate_up_proj)
    g.require_shape({c.num_experts, 2 * static_cast<std::int64_t>(c.intermediate), c.hidden});
    w = ExpertWeightsRef::stacked_gate_up(static_cast<const bf16*>(g.data), static_cast<const bf16*>(d.data), c.hidden, c.intermediate);
  } else {
    TensorArg u = tensor_arg(up, "up", Access::read, {DType::bf16});
    g.require_shape({c.num_experts, c.intermediate, c.hidden});
    u.require_shape({c.num_experts, c.intermediate, c.hidden});
    w = ExpertWeightsRef{static_cast<const bf16*>(g.data), static_cast<const bf16*>(u.data), static_cast<const bf16*>(d.data)};
  }
  const char* bias_names[3] = {"gate_bias", "up_bias", "down_bias"};
  const bf16** bias_slots[3] = {&w.gate_bias, &w.up_bias, &w.down_bias};
  for (int i = 0; i < 3; ++i) {
    if (!biases[static_cast<std::size_t>(i)] || biases[static_cast<std::size_t>(i)].is_none()) continue;
    TensorArg b = tensor_arg(biases[static_cast<std::size_t>(i)], bias_names[i], Access::read, {DType::bf16});
    b.require_shape({c.num_experts, i == 2 ? c.hidden : c.intermediate});
    *bias_slots[i] = static_cast<const bf16*>(b.data);
  }
  {
    py::gil_scoped_release release;
    layer_ = std::make_unique<MoeLayer>(runtime_->runtime(), c, w);  // packs: the arrays are not kept
  }
  origin_.layer_index = layer_index;
  current_.keepalive = py::none();
}

PyLayer::PyLayer(std::shared_ptr<PyRuntime> runtime, const std::string& model_dir, int layer, const CheckpointLayerOptions& options)
    : runtime_(std::move(runtime)) {
  {
    py::gil_scoped_release release;
    layer_ = std::make_unique<MoeLayer>(MoeLayer::from_checkpoint(runtime_->runtime(), model_dir, layer, options));
  }
  origin_.model_dir = model_dir;
  origin_.layer_index = layer;
  if (!options.adapter.empty()) origin_.adapter = options.adapter;
  current_.ranks = ranks_of(layer_->lora());  // nothing is queued yet
  current_.keepalive = py::none();
}

PyLayer::~PyLayer() {
  {
    py::gil_scoped_release release;
    layer_.reset();  // waits for the layer's queued tasks
  }
  saved_.clear();  // with the GIL: these hold Python objects
}

std::unique_lock<std::mutex> PyLayer::lock_state() {
  std::unique_lock<std::mutex> lock(state_mu_, std::try_to_lock);
  if (!lock.owns_lock()) {
    py::gil_scoped_release release;  // the holder may need the GIL to finish
    lock.lock();
  }
  return lock;
}

PyLayer::Batch PyLayer::batch_arg(py::handle x, py::handle ids, py::handle weights, py::handle out) const {
  const MoeLayerConfig& c = layer_->config();
  TensorArg X = tensor_arg(x, "x", Access::read, {DType::bf16});
  X.require_shape({-1, c.hidden});
  TensorArg I = tensor_arg(ids, "expert_ids", Access::read, {DType::i64});
  I.require_shape({X.dim(0), -1});
  TensorArg W = tensor_arg(weights, "weights", Access::read, {DType::f32});
  W.require_shape({X.dim(0), I.dim(1)});

  Batch b;
  b.tokens = checked_int(X.dim(0), "tokens");
  b.top_k = checked_int(I.dim(1), "top_k");
  if (b.tokens > c.max_tokens)
    value_error("x: " + std::to_string(b.tokens) + " tokens; the layer takes at most max_tokens = " + std::to_string(c.max_tokens));
  if (b.top_k < 1 || b.top_k > c.top_k)
    value_error("expert_ids: " + std::to_string(b.top_k) + " slots per token; the layer takes 1 to top_k = " + std::to_string(c.top_k));
  b.x = static_cast<const bf16*>(X.data);
  b.ids = static_cast<const std::int64_t*>(I.data);
  b.weights = static_cast<const float*>(W.data);
  check_expert_ids(b.ids, b.tokens, b.top_k, c.num_experts);

  if (out.is_none()) {
    b.out_obj = new_array(X.is_torch, DType::bf16, {X.dim(0), c.hidden});
    out = b.out_obj;
  } else {
    b.out_obj = py::reinterpret_borrow<py::object>(out);
  }
  TensorArg O = tensor_arg(out, "out", Access::write, {DType::bf16, DType::f32});
  O.require_shape({X.dim(0), c.hidden});
  b.out = O.data;
  b.out_bf16 = O.dtype == DType::bf16;
  return b;
}

PyLayer::Grads PyLayer::grads_arg(const char* who, py::handle grad_output, py::handle grad_input, py::handle grads) {
  if (saved_.empty())
    throw Error(ErrorKind::state, std::string("MoELayer.") + who + ": no saved forward: backward needs a forward_sft with "
                                      "save_for_backward=True before it");
  const SavedForward& top = saved_.back();
  const MoeLayerConfig& c = layer_->config();
  Grads g;
  TensorArg GO = tensor_arg(grad_output, "grad_output", Access::read, {DType::bf16, DType::f32});
  GO.require_shape({top.tokens, c.hidden});
  if (grad_input.is_none()) {
    g.grad_input_obj = new_array(GO.is_torch, GO.dtype, GO.shape);
    grad_input = g.grad_input_obj;
  } else {
    g.grad_input_obj = py::reinterpret_borrow<py::object>(grad_input);
  }
  TensorArg GI = tensor_arg(grad_input, "grad_input", Access::write, {DType::bf16, DType::f32});
  if (GI.dtype != GO.dtype)
    type_error(std::string("grad_input: dtype ") + dtype_name(GI.dtype, GI.is_torch) + ", expected grad_output's " +
               dtype_name(GO.dtype, GO.is_torch));
  GI.require_shape({top.tokens, c.hidden});
  g.grad_output = GO.data;
  g.grad_input = GI.data;
  g.bf16 = GO.dtype == DType::bf16;
  g.lora = lora_grads_arg(c, top.lora.ranks, grads, g.refs);
  g.refs.append(grad_output);
  g.refs.append(g.grad_input_obj);
  return g;
}

LoraSetArg PyLayer::checked_lora_set(const LoraFactors& factors, py::handle scales, py::handle present) const {
  LoraSetArg set = lora_set_arg(layer_->config(), factors, scales, present);
  check_scales_finite(set.view, layer_->config().num_experts);
  return set;
}

bool PyLayer::stack_trusted() {
  std::vector<Runtime::Ticket> still;
  for (Runtime::Ticket t : unconfirmed_) {
    if (runtime_->may_have_failed(t)) untrusted_ = true;
    else if (t > runtime_->done_through()) still.push_back(t);
  }
  unconfirmed_ = untrusted_ ? std::vector<Runtime::Ticket>{} : std::move(still);
  return !untrusted_;
}

void PyLayer::require_trusted_stack(const char* who) {
  if (!stack_trusted())
    throw Error(ErrorKind::state, std::string("MoELayer.") + who + ": a queued task of this layer failed (reported by wait or "
                                      "sync), so which forwards it saved is unknown; call layer.sync(), which drops them");
}

void PyLayer::require_room_to_save(const char* who) const {
  const int depth = layer_->config().max_cache_depth;
  if (depth == 0)
    throw Error(ErrorKind::state, std::string("MoELayer.") + who + ": this layer saves no forwards (max_cache_depth 0, built "
                                      "for inference): build it with max_cache_depth >= 1 to train");
  if (static_cast<int>(saved_.size()) >= depth)
    throw Error(ErrorKind::state, std::string("MoELayer.") + who + ": the forward cache stack is full (max_cache_depth " +
                                      std::to_string(depth) + "): run backward for a saved forward first, or build the layer "
                                      "with a deeper cache");
}

py::object PyLayer::forward(py::handle x, py::handle ids, py::handle weights, py::handle out) {
  Batch b = batch_arg(x, ids, weights, out);
  const auto mark = runtime_->last_ticket();
  {
    py::gil_scoped_release release;
    if (b.out_bf16) layer_->forward(b.tokens, b.top_k, b.x, b.ids, b.weights, static_cast<bf16*>(b.out));
    else layer_->forward(b.tokens, b.top_k, b.x, b.ids, b.weights, static_cast<float*>(b.out));
  }
  runtime_->finished_through(mark);
  return b.out_obj;
}

py::object PyLayer::forward_sft(py::handle x, py::handle ids, py::handle weights, py::handle out, bool save) {
  if (!save) return forward(x, ids, weights, out);
  Batch b = batch_arg(x, ids, weights, out);
  auto lock = lock_state();
  require_trusted_stack("forward_sft");
  require_room_to_save("forward_sft");
  const auto mark = runtime_->last_ticket();
  {
    py::gil_scoped_release release;
    if (b.out_bf16) layer_->forward_sft(b.tokens, b.top_k, b.x, b.ids, b.weights, static_cast<bf16*>(b.out), true);
    else layer_->forward_sft(b.tokens, b.top_k, b.x, b.ids, b.weights, static_cast<float*>(b.out), true);
  }
  runtime_->finished_through(mark);
  saved_.push_back({b.tokens, current_});
  return b.out_obj;
}

py::object PyLayer::backward(py::handle grad_output, py::handle grad_input, py::handle grads, bool accumulate) {
  auto lock = lock_state();
  require_trusted_stack("backward");
  Grads g = grads_arg("backward", grad_output, grad_input, grads);
  const auto mark = runtime_->last_ticket();
  {
    py::gil_scoped_release release;
    if (g.bf16) {
      LoraGrads lg{g.lora[0].a, g.lora[0].b, g.lora[1].a, g.lora[1].b, g.lora[2].a, g.lora[2].b, lora_grads_dtype(g.lora)};
      layer_->backward(static_cast<const bf16*>(g.grad_output), static_cast<bf16*>(g.grad_input), lg, accumulate);
    } else {
      layer_->backward(static_cast<const float*>(g.grad_output), static_cast<float*>(g.grad_input), g.lora, accumulate);
    }
  }
  runtime_->finished_through(mark);
  saved_.pop_back();
  return g.grad_input_obj;
}

void PyLayer::update_lora_weights(const LoraFactors& factors, py::handle scales, py::handle present) {
  LoraSetArg set = checked_lora_set(factors, scales, present);
  auto lock = lock_state();
  require_trusted_stack("update_lora_weights");
  const auto mark = runtime_->last_ticket();
  {
    py::gil_scoped_release release;
    layer_->update_lora_weights(set.view);
  }
  runtime_->finished_through(mark);
  current_ = {ranks_of(set.view), std::move(set.keepalive)};  // the old set lives on in saved forwards that read it
}

Task PyLayer::submit_forward(py::handle x, py::handle ids, py::handle weights, py::handle out) {
  Batch b = batch_arg(x, ids, weights, out);
  stack_trusted();  // forgets the tickets known done, so a server that only submits forwards keeps none
  Runtime::Ticket t = b.out_bf16
                          ? layer_->submit_forward(b.tokens, b.top_k, b.x, b.ids, b.weights, static_cast<bf16*>(b.out))
                          : layer_->submit_forward(b.tokens, b.top_k, b.x, b.ids, b.weights, static_cast<float*>(b.out));
  runtime_->keep_until_done(t, py::make_tuple(x, ids, weights, b.out_obj));
  unconfirmed_.push_back(t);  // were it to fail, the layer's later tasks would not run
  return Task{runtime_, t, b.out_obj};
}

Task PyLayer::submit_forward_sft(py::handle x, py::handle ids, py::handle weights, py::handle out, bool save) {
  if (!save) return submit_forward(x, ids, weights, out);
  Batch b = batch_arg(x, ids, weights, out);
  auto lock = lock_state();
  require_trusted_stack("submit_forward_sft");
  require_room_to_save("submit_forward_sft");
  Runtime::Ticket t =
      b.out_bf16 ? layer_->submit_forward_sft(b.tokens, b.top_k, b.x, b.ids, b.weights, static_cast<bf16*>(b.out), true)
                 : layer_->submit_forward_sft(b.tokens, b.top_k, b.x, b.ids, b.weights, static_cast<float*>(b.out), true);
  runtime_->keep_until_done(t, py::make_tuple(x, ids, weights, b.out_obj));
  unconfirmed_.push_back(t);
  saved_.push_back({b.tokens, current_});
  return Task{runtime_, t, b.out_obj};
}

Task PyLayer::submit_backward(py::handle grad_output, py::handle grad_input, py::handle grads, bool accumulate) {
  auto lock = lock_state();
  require_trusted_stack("submit_backward");
  Grads g = grads_arg("submit_backward", grad_output, grad_input, grads);
  LoraGrads lg{g.lora[0].a, g.lora[0].b, g.lora[1].a, g.lora[1].b, g.lora[2].a, g.lora[2].b, lora_grads_dtype(g.lora)};
  Runtime::Ticket t =
      g.bf16 ? layer_->submit_backward(static_cast<const bf16*>(g.grad_output), static_cast<bf16*>(g.grad_input), lg, accumulate)
             : layer_->submit_backward(static_cast<const float*>(g.grad_output), static_cast<float*>(g.grad_input), lg, accumulate);
  g.refs.append(set_keepalive_or_none(saved_.back().lora.keepalive));  // the LoRA its forward read
  runtime_->keep_until_done(t, g.refs);
  unconfirmed_.push_back(t);
  saved_.pop_back();
  return Task{runtime_, t, g.grad_input_obj};
}

Task PyLayer::submit_update_lora_weights(const LoraFactors& factors, py::handle scales, py::handle present) {
  LoraSetArg set = checked_lora_set(factors, scales, present);
  auto lock = lock_state();
  require_trusted_stack("submit_update_lora_weights");
  Runtime::Ticket t = layer_->submit_update_lora_weights(set.view);
  // Tasks queued before it still read the old set.
  runtime_->keep_until_done(t, py::make_tuple(set_keepalive_or_none(current_.keepalive), set.keepalive));
  unconfirmed_.push_back(t);
  current_ = {ranks_of(set.view), std::move(set.keepalive)};
  return Task{runtime_, t, py::none()};
}

int PyLayer::cached_forwards_in_order() {
  int n = 0;
  MoeLayer* layer = layer_.get();
  Runtime& rt = runtime_->runtime();
  py::gil_scoped_release release;
  rt.wait(rt.submit([&n, layer] { n = layer->cached_forwards(); }));
  return n;
}

void PyLayer::drop_saved_forwards() {
  const MoeLayerConfig& c = layer_->config();
  const int n = cached_forwards_in_order();
  py::gil_scoped_release release;
  // Each pop reads as many rows as its forward saved: give the most any forward can have.
  std::vector<float> zeros(static_cast<std::size_t>(c.max_tokens) * c.hidden, 0.0f), scratch(zeros.size());
  for (int i = 0; i < n; ++i) layer_->backward(zeros.data(), scratch.data(), LoraGrads{}, false);
}

void PyLayer::sync() {
  auto recover = [this] {
    auto lock = lock_state();
    if (stack_trusted()) return;
    drop_saved_forwards();
    saved_.clear();
    untrusted_ = false;
  };
  try {
    runtime_->sync();
  } catch (...) {
    recover();
    throw;
  }
  recover();
}

void PyLayer::load_adapter(const std::string& path, std::optional<int> layer, AdapterStorage storage) {
  auto lock = lock_state();
  require_trusted_stack("load_adapter");
  if (!saved_.empty())
    throw Error(ErrorKind::state, "MoELayer.load_adapter: " + std::to_string(saved_.size()) +
                                      " saved forward(s) still use the current LoRA; run their backward first");
  const auto mark = runtime_->last_ticket();
  {
    py::gil_scoped_release release;
    // A layer made from memory with layer_index knows its index here only.
    layer_->load_adapter(path, layer ? *layer : origin_.layer_index.value_or(-1), storage);
  }
  runtime_->finished_through(mark);
  current_ = {ranks_of(layer_->lora()), py::none()};
  origin_.adapter = path;
  if (layer) origin_.layer_index = layer;
}

void PyLayer::unload_adapter() {
  auto lock = lock_state();
  require_trusted_stack("unload_adapter");
  if (!saved_.empty())
    throw Error(ErrorKind::state, "MoELayer.unload_adapter: " + std::to_string(saved_.size()) +
                                      " saved forward(s) still use the current LoRA; run their backward first");
  const auto mark = runtime_->last_ticket();
  {
    py::gil_scoped_release release;
    layer_->unload_adapter();
  }
  runtime_->finished_through(mark);
  current_ = {LoraRanks{}, py::none()};
  origin_.adapter.reset();
}

py::dict PyLayer::adapter_stacked_keys() {
  auto lock = lock_state();
  py::dict out;
  if (!current_.keepalive.is_none()) return out;  // the caller's arrays are in use, not the adapter
  const auto mark = runtime_->last_ticket();
  LayerPeftStackedKeys keys;
  {
    py::gil_scoped_release release;
    keys = layer_->adapter_stacked_keys();
  }
  runtime_->finished_through(mark);
  for (Projection p : kProjections) {
    const PeftStackedKeys& k = keys[static_cast<int>(p)];
    if (k.empty()) continue;
    py::dict d;
    d["key_a"] = k.key_a;
    d["key_b"] = k.key_b;
    d["first_row"] = k.first_row;
    d["b_rows"] = k.b_rows;
    d["row_step"] = k.row_step;
    out[projection_name(p)] = d;
  }
  return out;
}

py::dict PyLayer::lora_weights() {
  auto lock = lock_state();  // no set change can be queued meanwhile
  cached_forwards_in_order();  // and those queued before have run
  const LayerLoraView& v = layer_->lora();
  const int E = layer_->config().num_experts;
  py::dict out;
  for (Projection p : kProjections) {
    const LoraProjectionView& l = v[p];
    if (l.rank == 0) continue;
    py::object a = new_array(false, DType::f32, {E, l.rank, l.in});
    py::object b = new_array(false, DType::f32, {E, l.out, l.rank});
    py::object scale = new_array(false, DType::f32, {E});
    py::object present = py::module_::import("numpy").attr("zeros")(E, py::arg("dtype") = "bool");
    // float32 copies, whatever the set's element type and strides (a window of larger arrays).
    auto* ad = static_cast<float*>(tensor_arg(a, "a", Access::write, {DType::f32}).data);
    auto* bd = static_cast<float*>(tensor_arg(b, "b", Access::write, {DType::f32}).data);
    auto copy_rows = [&](const void* first, std::size_t row_stride, int rows, int cols, float* dst) {
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) {
          const std::size_t at = static_cast<std::size_t>(r) * row_stride + static_cast<std::size_t>(c);
          dst[static_cast<std::size_t>(r) * cols + c] =
              l.dtype == LoraDType::bf16 ? bf16_to_float(static_cast<const bf16*>(first)[at]) : static_cast<const float*>(first)[at];
        }
    };
    for (int e = 0; e < E; ++e) {
      copy_rows(l.a_of(e), l.lda(), l.rank, l.in, ad + static_cast<std::size_t>(e) * l.rank * l.in);
      copy_rows(l.b_of(e), static_cast<std::size_t>(l.rank), l.out, l.rank, bd + static_cast<std::size_t>(e) * l.out * l.rank);
    }
    auto* s = static_cast<float*>(tensor_arg(scale, "scale", Access::write, {DType::f32}).data);
    auto* pr = static_cast<bool*>(tensor_arg(present, "present", Access::write, {DType::u8}).data);
    for (int e = 0; e < E; ++e) {
      s[e] = l.scale_of(e);
      pr[e] = l.active(e);
    }
    py::dict d;
    d["a"] = a;
    d["b"] = b;
    d["scale"] = scale;
    d["present"] = present;
    out[projection_name(p)] = d;
  }
  return out;
}

double PyLayer::time_forward(py::handle x, py::handle ids, py::handle weights, py::handle out, int iterations) {
  if (iterations < 1) value_error("iterations: must be >= 1");
  Batch b = batch_arg(x, ids, weights, out);
  py::gil_scoped_release release;
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) {
    if (b.out_bf16) layer_->forward(b.tokens, b.top_k, b.x, b.ids, b.weights, static_cast<bf16*>(b.out));
    else layer_->forward(b.tokens, b.top_k, b.x, b.ids, b.weights, static_cast<float*>(b.out));
  }
  std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  return elapsed.count() / iterations;
}

}  // namespace tilemoe::binding
