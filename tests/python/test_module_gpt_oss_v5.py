"""gpt-oss's experts against transformers v5's GptOssExperts (an outside oracle; the device machine
has it, elsewhere this test is SKIPPED): its SwiGLU ((clamp(up) + 1) * g * sigmoid(1.702 g), g =
min(gate, 7)) with the experts' biases, on a tiny random layer whose inputs put a few per cent of
the gates and ups past the clamp.
- forward: tilemoe.MoELayer given the experts de-interleaved and transposed to Hugging Face's W x
  orientation (gate = gate_up_proj[..., ::2]ᵀ, up = [..., 1::2]ᵀ) and the biases split the same way
  gives GptOssExperts' output within 1e-2, split over 2 nodes too; int8 weights (W8A8) within 5e-2
  of it, where the plain SwiGLU without biases is more than 0.2 off; mxfp4 weights on a module whose
  weights are MXFP4 values (as the hub's gpt-oss) within 1e-2 of it;
- backward: MoELoRA on the layer against PyTorch's autograd through GptOssExperts itself whose
  parameters are W + s B A (the LoRA delta interleaved as gate_up_proj is): grad_input and every
  LoRA factor's gradient within 2e-2.

Usage: test_module_gpt_oss_v5.py <tests/data> <cmake> <build dir>. Exits 77 (SKIPPED) without torch or transformers >= 5.
"""
import sys

try:
    import numpy as np  # noqa: F401  (tilemoe needs it)
    import torch
    import transformers
except ImportError as e:
    print(f"{e}: transformers v5 is not installed here: skipped")
    sys.exit(77)
if int(transformers.__version__.split(".")[0]) < 5:
    print(f"transformers {transformers.__version__}: this test needs v5: skipped")
    sys.exit(77)
try:
    from transformers.models.gpt_oss.configuration_gpt_oss import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts
except ImportError as e:
    print(f"{e}: this transformers has no gpt_oss: skipped")
    sys.exit(77)

import tilemoe
from tilemoe.torch import MoELoRA
from checks import expect, rel, finish

E, K, H, I, T, R = 6, 2, 72, 40, 23, 4
FACTORS = ("gate_a", "gate_b", "up_a", "up_b", "down_a", "down_b")
gen = torch.Generator().manual_seed(7)


def bf16_round(t):
    return t.to(torch.bfloat16).float()


config = GptOssConfig(hidden_size=H, intermediate_size=I, num_local_experts=E, num_experts_per_tok=K, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16)
experts = GptOssExperts(config).float()
with torch.no_grad():
    experts.gate_up_proj.copy_(bf16_round(torch.randn(E, H, 2 * I, generator=gen) / H ** 0.5))
    experts.gate_up_proj_bias.copy_(bf16_round(torch.randn(E, 2 * I, generator=gen) * 0.5))
    experts.down_proj.copy_(bf16_round(torch.randn(E, I, H, generator=gen) / I ** 0.5))
    experts.down_proj_bias.copy_(bf16_round(torch.randn(E, H, generator=gen) * 0.1))
expect(abs(experts.alpha - 1.702) < 1e-6 and experts.limit == 7.0, f"GptOssExperts: alpha {experts.alpha}, limit {experts.limit}")

x = bf16_round(torch.randn(T, H, generator=gen) * 3.5)  # gates of std ~3.5: a few per cent past 7
scores = torch.randn(T, E, generator=gen)
top, ids = torch.topk(scores, K, dim=1)
ids = ids.contiguous()
w = torch.softmax(top, dim=1).contiguous()

gup, gub = experts.gate_up_proj.detach(), experts.gate_up_proj_bias.detach()
gate = gup[:, :, 0::2].transpose(1, 2).contiguous().to(torch.bfloat16)
up = gup[:, :, 1::2].transpose(1, 2).contiguous().to(torch.bfloat16)
down = experts.down_proj.detach().transpose(1, 2).contiguous().to(torch.bfloat16)
biases = dict(gate_bias=gub[:, 0::2].contiguous().to(torch.bfloat16), up_bias=gub[:, 1::2].contiguous().to(torch.bfloat16),
              down_bias=experts.down_proj_bias.detach().contiguous().to(torch.bfloat16))
g_all = x @ gup[:, :, 0::2] + gub[:, None, 0::2]
clamped = float(((g_all > 7).float().mean()))
print(f"gates past the limit: {clamped:.3f}")
expect(0.005 < clamped < 0.2, f"the inputs put {clamped:.3f} of the gates past 7; the test wants a few per cent")


def layer(weights="bf16", nodes=1):
    cfg = tilemoe.MoEConfig(num_experts=E, top_k=K, hidden=H, intermediate=I, max_tokens=T, lora_rank=R, lora_alpha=2.0 * R,
                            max_cache_depth=1, weight_type=weights, numa_nodes=nodes, swiglu_limit=7.0, swiglu_alpha=1.702,
                            swiglu_up_offset=1.0)
    return tilemoe.MoELayer(cfg, gate, up, down, **biases)


with torch.no_grad():
    want = experts(x, ids, w)
    for nodes in (1, 2):
        got = layer(nodes=nodes).forward(x.to(torch.bfloat16), ids, w)
        err = rel(got, want)
        print(f"forward, {nodes} node(s): {err:.2e}")
        expect(err <= 1e-2, f"forward on {nodes} node(s): {err:.2e} from GptOssExperts")
    # int8 (W8A8): the quantization's error on top.
    q = layer("int8")
    got = q.forward(x.to(torch.bfloat16), ids, w)
    err = rel(got, want)
    print(f"forward, int8 weights: {err:.2e} from the bf16 module")
    expect(err <= 5e-2, f"int8 forward: {err:.2e} from GptOssExperts")
    # MXFP4 as the hub ships gpt-oss: the module given weights that are E2M1 values times a power of
    # two per 32 inputs (dequantized exactly, as transformers does); tilemoe's mxfp4 layer holds those
    # very values (4.25 bits a weight) and multiplies them with bf16 activations.
    e2m1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])

    def mxfp4_values(n_in, n_out):  # [E, n_in, n_out], groups of 32 along n_in
        codes = torch.randint(0, 16, (E, n_in, n_out), generator=gen)
        exps = torch.randint(-8, -2, (E, (n_in + 31) // 32, n_out), generator=gen).float()
        return e2m1[codes] * torch.exp2(exps.repeat_interleave(32, dim=1)[:, :n_in])

    mx_experts = GptOssExperts(config).float()
    mx_experts.gate_up_proj.copy_(mxfp4_values(H, 2 * I))
    mx_experts.gate_up_proj_bias.copy_(experts.gate_up_proj_bias)
    mx_experts.down_proj.copy_(mxfp4_values(I, H))
    mx_experts.down_proj_bias.copy_(experts.down_proj_bias)
    mgu = mx_experts.gate_up_proj
    mx_cfg = tilemoe.MoEConfig(num_experts=E, top_k=K, hidden=H, intermediate=I, max_tokens=T, weight_type="mxfp4",
                               swiglu_limit=7.0, swiglu_alpha=1.702, swiglu_up_offset=1.0)
    mx_layer = tilemoe.MoELayer(mx_cfg, mgu[:, :, 0::2].transpose(1, 2).contiguous().to(torch.bfloat16),
                                mgu[:, :, 1::2].transpose(1, 2).contiguous().to(torch.bfloat16),
                                mx_experts.down_proj.transpose(1, 2).contiguous().to(torch.bfloat16), **biases)
    err = rel(mx_layer.forward(x.to(torch.bfloat16), ids, w), mx_experts(x, ids, w))
    print(f"forward, mxfp4 weights: {err:.2e} from the module on the same MXFP4 values")
    expect(err <= 1e-2, f"mxfp4 forward: {err:.2e} from GptOssExperts on its MXFP4 values")
    # Without the form or the biases the layer would be far off: the check above can fail.
    plain = tilemoe.MoELayer(tilemoe.MoEConfig(num_experts=E, top_k=K, hidden=H, intermediate=I, max_tokens=T), gate, up, down)
    expect(rel(plain.forward(x.to(torch.bfloat16), ids, w), want) > 0.2, "the plain SwiGLU is as close: the test checks nothing")

# Backward through LoRA: MoELoRA against autograd through GptOssExperts with W + s B A.
lay = layer()
m = MoELoRA(lay)
with torch.no_grad():
    for p in m.parameters():
        p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
flat = {k: v.detach().clone() for k, v in m.flat_lora().items()}
probe = torch.randn(T, H, generator=gen)
xg = x.clone().requires_grad_()
(m(xg, ids, w).float() * probe).sum().backward()
params = dict(m.named_parameters())


def stacked_grad(key):
    i, factor = FACTORS.index(key) // 2, key[-1].upper()
    ps = [params[m.naming.key(e, i, factor)] for e in range(E)]
    return torch.stack([p.grad if p.grad is not None else torch.zeros_like(p) for p in ps])


ref = {k: v.clone().requires_grad_() for k, v in flat.items()}
s = 2.0  # lora_alpha / r
dg = s * ref["gate_b"] @ ref["gate_a"]  # [E, I, H]
du = s * ref["up_b"] @ ref["up_a"]
dd = s * ref["down_b"] @ ref["down_a"]  # [E, H, I]
delta = torch.stack([dg.transpose(1, 2), du.transpose(1, 2)], dim=-1).reshape(E, H, 2 * I)  # gate, up interleaved
xr = x.clone().requires_grad_()
out = torch.func.functional_call(experts, {"gate_up_proj": gup + delta, "gate_up_proj_bias": gub,
                                           "down_proj": experts.down_proj.detach() + dd.transpose(1, 2),
                                           "down_proj_bias": experts.down_proj_bias.detach()}, (xr, ids, w))
(out * probe).sum().backward()
err = rel(xg.grad, xr.grad)
print(f"grad_input: {err:.2e}")
expect(err <= 2e-2, f"grad_input: {err:.2e} from autograd through GptOssExperts")
for key in FACTORS:
    err = rel(stacked_grad(key), ref[key].grad)
    print(f"{key} gradient: {err:.2e}")
    expect(err <= 2e-2, f"{key} gradient: {err:.2e} from autograd through GptOssExperts")

finish("gpt-oss experts: forward and LoRA backward as transformers' GptOssExperts")
