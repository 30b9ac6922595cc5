"""The same experts as plain PyTorch modules: one module per expert, each projection a frozen Linear
with PEFT-style LoRA (lora_A, lora_B Linears, scale alpha / r), the routed tokens gathered per
expert as Hugging Face's MoE blocks do. The baseline of tilemoe.bench and the oracle of the tests;
the LoRA parameters have MoELoRA's names, so one's state_dict loads into the other."""
import torch

from .naming import PeftNaming


class LoraLinear(torch.nn.Module):
    """y = W x (+ b) + scale * B (A x), W and b frozen in `dtype`, A and B float32 as PEFT keeps adapters."""

    def __init__(self, weight, lora_a, lora_b, scale, dtype, bias=None):
        super().__init__()
        self.base_layer = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, dtype=dtype)
        self.base_layer.weight.data.copy_(weight)
        self.base_layer.weight.requires_grad_(False)
        if bias is not None:
            self.base_layer.bias.data.copy_(bias)
            self.base_layer.bias.requires_grad_(False)
        self.lora_A = torch.nn.Linear(lora_a.shape[1], lora_a.shape[0], bias=False)
        self.lora_B = torch.nn.Linear(lora_b.shape[1], lora_b.shape[0], bias=False)
        self.lora_A.weight.data.copy_(lora_a)
        self.lora_B.weight.data.copy_(lora_b)
        self.scale = scale

    def forward(self, x):
        lora = self.lora_B(self.lora_A(x.to(self.lora_A.weight.dtype))) * self.scale  # as PEFT casts
        return self.base_layer(x) + lora.to(x.dtype)


class Expert(torch.nn.Module):
    def __init__(self, projections, swiglu_limit=0.0, swiglu_alpha=1.0, swiglu_up_offset=0.0):
        super().__init__()
        for name, module in projections.items():
            self.add_module(name, module)
        self.names = list(projections)  # gate, up, down in that order
        self.swiglu_limit = swiglu_limit
        self.swiglu_alpha, self.swiglu_up_offset = swiglu_alpha, swiglu_up_offset

    def forward(self, x):
        gate, up, down = (getattr(self, n) for n in self.names)
        g, u = gate(x), up(x)
        if self.swiglu_limit > 0:  # DeepSeek-V4's and gpt-oss's clamped SwiGLU
            g = g.clamp(max=self.swiglu_limit)
            u = u.clamp(min=-self.swiglu_limit, max=self.swiglu_limit)
        if self.swiglu_alpha == 1.0 and self.swiglu_up_offset == 0.0:
            return down(torch.nn.functional.silu(g) * u)
        # gpt-oss's form, as GptOssExperts computes it.
        return down((u + self.swiglu_up_offset) * (g * torch.sigmoid(g * self.swiglu_alpha)))


class ReferenceMoE(torch.nn.Module):
    """gate, up [E, I, H], down [E, H, I] (any float dtype; used as `dtype`); lora: {"gate_a": [E, r, in],
    "gate_b": [E, out, r], ...} float32; scale: alpha / r; swiglu_limit, swiglu_alpha and swiglu_up_offset as
    MoEConfig's; biases: {"gate": [E, I], "up": [E, I], "down": [E, H]} (gpt-oss's; any may be missing). Parameters
    are named like MoELoRA's."""

    def __init__(self, gate, up, down, lora, scale, naming=None, dtype=torch.float32, swiglu_limit=0.0, swiglu_alpha=1.0,
                 swiglu_up_offset=0.0, biases=None):
        super().__init__()
        naming = naming or PeftNaming("base_model.model.model.layers.0.mlp.experts", ("gate_proj", "up_proj", "down_proj"))
        prefix, self.num_experts = naming.prefix, gate.shape[0]
        experts = torch.nn.ModuleList()
        for e in range(self.num_experts):
            projections = {}
            for i, (name, w) in enumerate((("gate", gate), ("up", up), ("down", down))):
                bias = (biases or {}).get(name)
                projections[naming.projections[i]] = LoraLinear(w[e].to(dtype), lora[name + "_a"][e], lora[name + "_b"][e],
                                                                 scale, dtype, None if bias is None else bias[e].to(dtype))
            experts.append(Expert(projections, swiglu_limit, swiglu_alpha, swiglu_up_offset))
        # The module path of PEFT's names ("base_model.model.model.layers.L.mlp.experts").
        node = self
        parts = prefix.split(".")
        for part in parts[:-1]:
            child = torch.nn.Module()
            node.add_module(part, child)
            node = child
        node.add_module(parts[-1], experts)
        self.experts_list = [experts]  # not a submodule twice: a plain list holding the ModuleList
        self.dtype = dtype

    def forward(self, x, expert_ids, weights):
        experts = self.experts_list[0]
        x2d = x.reshape(-1, x.shape[-1])
        ids = expert_ids.reshape(x2d.shape[0], -1)
        w = weights.reshape(x2d.shape[0], -1)
        xin = x2d.to(self.dtype)
        acc = torch.promote_types(self.dtype, torch.float32)
        out = torch.zeros(x2d.shape, dtype=acc)
        for e in range(self.num_experts):
            token, slot = torch.nonzero(ids == e, as_tuple=True)
            if token.numel() == 0:
                continue
            y = experts[e](xin[token]).to(acc) * w[token, slot, None]
            out = out.index_add(0, token, y)
        return out.to(x.dtype).reshape(x.shape)

    def lora_parameters(self):
        return [p for n, p in self.named_parameters() if ".lora_" in n]
