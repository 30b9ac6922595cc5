"""tilemoe: the routed experts of Mixture-of-Experts layers on the CPU (AMX / AVX512-BF16), with
per-expert LoRA fine-tuning.

    import tilemoe
    layer = tilemoe.MoELayer.from_checkpoint("DeepSeek-V2-Lite", 3, adapter="my-lora")
    out = layer.forward(x, expert_ids, weights)            # torch tensors or numpy arrays

    from tilemoe.torch import MoELoRA                       # LoRA as torch Parameters, with autograd
    moe = MoELoRA(layer)

See MoELayer's and MoELoRA's docstrings; `python3 -m tilemoe.train_demo` and `python3 -m
tilemoe.bench` run the demo and the bench.
"""
from ._tilemoe import (BadFileError, Error, InvalidArgumentError, MoELayer, Runtime, StateError, Task,
                       UnsupportedError, save_peft_adapter)
from .bf16 import bf16_to_float32, float32_to_bf16
from .config import MoEConfig

__all__ = ["MoEConfig", "MoELayer", "Runtime", "Task", "save_peft_adapter", "Error", "InvalidArgumentError", "BadFileError",
           "UnsupportedError", "StateError", "float32_to_bf16", "bf16_to_float32"]
