"""tilemoe.MoEConfig: the shape and limits of one MoE layer's routed experts."""
from dataclasses import dataclass
from typing import Optional

_WEIGHT_TYPES = ("bf16", "int8", "int4", "mxfp4")


@dataclass
class MoEConfig:
    """What tilemoe.MoELayer(config, gate, up, down) builds.

    num_experts, top_k, hidden, intermediate: the layer's shape (top_k: the most routing slots a
    call may pass). max_tokens: the largest batch of one call. lora_rank: the largest LoRA rank the
    layer accepts (0: no LoRA); lora_alpha and use_rslora give the scale of sets passed to
    update_lora_weights, alpha / r (or alpha / sqrt(r)); lora_alpha None means lora_rank (scale 1).
    max_cache_depth: forwards saved for backward at once (0: inference only). weight_type: "bf16", or "int8" / "int4" / "mxfp4"
    (quantized at construction: int8 one scale per output channel, int4 one per group_size
    inputs, 32, 64 or 128, mxfp4 E2M1 with a power-of-two scale per 32 inputs and bf16 activations,
    exact for weights that came from MXFP4 such as gpt-oss's; LoRA stays float; training through them is QLoRA). numa_nodes: NUMA nodes to split the layer over (1: none, 0: the
    machine's, more than it has: virtual nodes). threads: the runtime's worker threads, None or 0 for one per core.
    backward_weight_copy: backward reads a second copy of the bf16 weights packed transposed (twice
    the weight memory, a faster fine-tuning step) instead of repacking what it needs on every call.
    swiglu_limit: > 0, the experts clamp gate to at most it and up to [-it, it] before silu(gate) * up,
    LoRA included (DeepSeek-V4's clamped SwiGLU); 0: no clamp. A layer from a checkpoint takes its config.json's.
    swiglu_alpha, swiglu_up_offset: gpt-oss's SwiGLU, (up + offset) * gate * sigmoid(alpha * gate) after the
    clamps (gpt-oss: 1.702 and 1); 1.0 and 0.0: the plain silu(gate) * up. A checkpoint layer takes its model's.
    """

    num_experts: int
    top_k: int
    hidden: int
    intermediate: int
    max_tokens: int = 2048
    lora_rank: int = 0
    lora_alpha: Optional[float] = None
    use_rslora: bool = False
    max_cache_depth: int = 1
    weight_type: str = "bf16"
    group_size: int = 128
    numa_nodes: int = 1
    threads: Optional[int] = None
    backward_weight_copy: bool = False
    swiglu_limit: float = 0.0
    swiglu_alpha: float = 1.0
    swiglu_up_offset: float = 0.0

    def __post_init__(self):
        # Types here, ranges in the runtime: both name the field.
        for name in ("num_experts", "top_k", "hidden", "intermediate", "max_tokens", "lora_rank", "max_cache_depth",
                     "numa_nodes", "group_size"):
            _require_int(name, getattr(self, name))
        if self.threads is not None:
            _require_int("threads", self.threads)
        if self.lora_alpha is not None and (isinstance(self.lora_alpha, bool)
                                            or not isinstance(self.lora_alpha, (int, float))):
            raise TypeError(f"MoEConfig.lora_alpha: expected a float or None, got {type(self.lora_alpha).__name__}")
        for name in ("use_rslora", "backward_weight_copy"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"MoEConfig.{name}: expected a bool, got {type(getattr(self, name)).__name__}")
        for name in ("swiglu_limit", "swiglu_alpha", "swiglu_up_offset"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"MoEConfig.{name}: expected a float, got {type(value).__name__}")
        if self.weight_type not in _WEIGHT_TYPES:
            raise ValueError(f"MoEConfig.weight_type: {self.weight_type!r}; expected one of {', '.join(_WEIGHT_TYPES)}")


def _require_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"MoEConfig.{name}: expected an int, got {type(value).__name__}")
