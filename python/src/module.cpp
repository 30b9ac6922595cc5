// tilemoe._tilemoe: the compiled half of the `tilemoe` package (python/tilemoe/__init__.py
// re-exports it with the pure-Python half).
#include "bindings.hpp"
#include "errors.hpp"

PYBIND11_MODULE(_tilemoe, m) {
  m.doc() = "tilemoe: MoE routed experts on the CPU, with per-expert LoRA fine-tuning";
  tilemoe::binding::register_errors(m);
  tilemoe::binding::bind_runtime(m);
  tilemoe::binding::bind_layer(m);
  tilemoe::binding::bind_optim(m);
  tilemoe::binding::bind_save(m);
}
