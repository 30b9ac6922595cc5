#pragma once
// tilemoe.MoELayer: a tilemoe::MoeLayer driven from Python. Arguments are checked here (numpy
// arrays or torch tensors, read and written in place) and the GIL is released while the runtime
// works. The submit_* forms return a Task; what a task reads or writes stays alive until a wait
// or sync sees it finished.
//
// Backward reads as many grad_output rows, and writes LoRA gradients of the ranks, that its saved
// forward had; the C++ call cannot check buffers against that. So the binding keeps its own copy
// of the layer's saved-forward stack (tokens, LoRA ranks, and the LoRA arrays the forward read),
// checks every call against it, and checks before queuing everything the runtime would refuse,
// so that the copy stays true. Calls that change the stack or the LoRA set are serialised by
// state_mu_, so the copy's order is the queue's order. If a queued task of the layer fails anyway,
// the copy is no longer trusted: such calls raise StateError until sync() drops the saved forwards.
#include <pybind11/pybind11.h>

#include <array>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "lora_args.hpp"
#include "py_runtime.hpp"
#include "tilemoe/moe_layer.hpp"

namespace tilemoe::binding {

namespace py = pybind11;

// A queued call: wait() returns its result (the output array, grad_input, or None) or raises its
// error.
struct Task {
  std::shared_ptr<PyRuntime> runtime;
  Runtime::Ticket ticket = 0;
  py::object result;

  py::object wait();
};

// Where a layer came from, for naming its LoRA the way PEFT does (tilemoe/naming.py).
struct LayerOrigin {
  std::optional<std::string> model_dir, adapter;
  std::optional<int> layer_index;
};

using LoraFactors = std::array<py::object, 6>;  // gate_a, gate_b, up_a, up_b, down_a, down_b

class PyLayer {
 public:
  // biases: gate_bias, up_bias [E, I] and down_bias [E, H] (bf16), each None for none.
  PyLayer(std::shared_ptr<PyRuntime> runtime, py::handle config, py::handle gate, py::handle up, py::handle down,
          std::optional<int> layer_index, const std::array<py::object, 3>& biases = {});
  PyLayer(std::shared_ptr<PyRuntime> runtime, const std::string& model_dir, int layer, const CheckpointLayerOptions& options);
  ~PyLayer();

  py::object forward(py::handle x, py::handle ids, py::handle weights, py::handle out);
  py::object forward_sft(py::handle x, py::handle ids, py::handle weights, py::handle out, bool save);
  py::object backward(py::handle grad_output, py::handle grad_input, py::handle grads, bool accumulate);
  void update_lora_weights(const LoraFactors& factors, py::handle scales, py::handle present);

  Task submit_forward(py::handle x, py::handle ids, py::handle weights, py::handle out);
  Task submit_forward_sft(py::handle x, py::handle ids, py::handle weights, py::handle out, bool save);
  Task submit_backward(py::handle grad_output, py::handle grad_input, py::handle grads, bool accumulate);
  Task submit_update_lora_weights(const LoraFactors& factors, py::handle scales, py::handle present);
  // The runtime's sync; if a queued task of this layer failed, also drops its saved forwards.
  void sync();

  void load_adapter(const std::string& path, std::optional<int> layer, AdapterStorage storage);
  void unload_adapter();
  py::dict lora_weights();  // copies of the set in use, per projection
  // MoeLayer::adapter_stacked_keys, the stacked projections only, while the adapter's set is in use.
  py::dict adapter_stacked_keys();

  // For the bench: `iterations` calls of MoeLayer::forward from C++, seconds per call.
  double time_forward(py::handle x, py::handle ids, py::handle weights, py::handle out, int iterations);

  const MoeLayerConfig& config() const { return layer_->config(); }
  const MoeLayer& layer() const { return *layer_; }
  double lora_scale() const { return layer_->lora_scale(); }
  std::shared_ptr<PyRuntime> runtime() const { return runtime_; }
  const LayerOrigin& origin() const { return origin_; }
  LoraRanks lora_ranks() const { return current_.ranks; }
  int saved_forwards() const { return static_cast<int>(saved_.size()); }
  std::size_t cache_bytes() const { return layer_->cache_bytes(); }
  std::size_t weight_bytes() const { return layer_->weight_bytes(); }

 private:
  struct Batch;
  struct Grads;
  struct LoraSet {
    LoraRanks ranks{};
    py::object keepalive;  // the caller's arrays; None for an adapter the layer holds
  };
  struct SavedForward {
    int tokens = 0;
    LoraSet lora;
  };

  Batch batch_arg(py::handle x, py::handle ids, py::handle weights, py::handle out) const;
  Grads grads_arg(const char* who, py::handle grad_output, py::handle grad_input, py::handle grads);
  LoraSetArg checked_lora_set(const LoraFactors& factors, py::handle scales, py::handle present) const;

  // GIL held; released while blocked.
  std::unique_lock<std::mutex> lock_state();
  // With state_mu_: false once a queued task of this layer may have failed; require_ raises
  // StateError then.
  bool stack_trusted();
  void require_trusted_stack(const char* who);
  void require_room_to_save(const char* who) const;
  // With state_mu_, GIL released: the runtime's saved-forward count once every queued task has run.
  int cached_forwards_in_order();
  // With state_mu_: pops every saved forward of the runtime's stack (their gradients are dropped).
  void drop_saved_forwards();

  std::shared_ptr<PyRuntime> runtime_;
  std::unique_ptr<MoeLayer> layer_;
  LayerOrigin origin_;

  // With state_mu_ and the GIL held:
  std::mutex state_mu_;
  LoraSet current_;
  std::vector<SavedForward> saved_;
  std::vector<Runtime::Ticket> unconfirmed_;  // this layer's queued tasks not yet known to have succeeded
  bool untrusted_ = false;
};

}  // namespace tilemoe::binding
