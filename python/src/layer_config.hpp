#pragma once
// tilemoe.MoEConfig (python/tilemoe/config.py) <-> tilemoe::MoeLayerConfig. Range checks stay with
// the runtime, whose messages name the field; here only types and names are checked.
#include <pybind11/pybind11.h>

#include "tilemoe/moe_layer.hpp"

namespace tilemoe::binding {

namespace py = pybind11;

struct LayerSetup {
  MoeLayerConfig config;
  int threads = 0;  // the runtime's worker threads; 0: one per core
};

LayerSetup layer_setup_from_py(py::handle config);
py::object config_to_py(const MoeLayerConfig& config, int threads);

}  // namespace tilemoe::binding
