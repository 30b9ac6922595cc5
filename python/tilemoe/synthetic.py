"""Random layers and batches of real models' shapes, for the demo, the bench and the tests."""
import math

import torch

# hidden, intermediate, experts, top-k
SHAPES = {
    "tiny": (64, 32, 4, 2),
    "mini": (256, 128, 8, 2),
    "v2-lite": (2048, 1408, 64, 6),       # DeepSeek-V2-Lite
    "qwen3-30b": (2048, 768, 128, 8),     # Qwen3-30B-A3B
    "mixtral-8x7b": (4096, 14336, 8, 2),
}


def random_experts(num_experts, hidden, intermediate, generator=None):
    """gate, up [E, I, H] and down [E, H, I] in bf16, N(0, 1/fan_in) so activations stay near 1."""
    def normal(*shape):
        return (torch.randn(*shape, generator=generator) / math.sqrt(shape[-1])).to(torch.bfloat16)
    return normal(num_experts, intermediate, hidden), normal(num_experts, intermediate, hidden), \
        normal(num_experts, hidden, intermediate)


def random_batch(tokens, hidden, num_experts, top_k, generator=None):
    """x bf16 [T, H] ~ N(0, 1), top_k distinct expert ids per token (int64), softmax routing weights (f32)."""
    x = torch.randn(tokens, hidden, generator=generator).to(torch.bfloat16)
    scores = torch.randn(tokens, num_experts, generator=generator)
    top, ids = torch.topk(scores, top_k, dim=1)
    return x, ids.contiguous(), torch.softmax(top, dim=1).contiguous()


def random_lora(num_experts, hidden, intermediate, rank, std=0.1, generator=None):
    """A LoRA set {"gate_a": [E, r, H], "gate_b": [E, I, r], ..., "down_b": [E, H, r]} in float32."""
    dims = {"gate": (hidden, intermediate), "up": (hidden, intermediate), "down": (intermediate, hidden)}
    out = {}
    for name, (fan_in, fan_out) in dims.items():
        out[name + "_a"] = torch.randn(num_experts, rank, fan_in, generator=generator) / math.sqrt(fan_in)
        out[name + "_b"] = torch.randn(num_experts, fan_out, rank, generator=generator) * std
    return out
