"""Every PyTorch + PEFT fixture case (tests/data) through the Python module: MoELayer with numpy
arrays (synchronous) and torch tensors (submitted tasks), and tilemoe.torch.MoELoRA through
autograd. Outputs and grad_input within 1e-2, every LoRA gradient within 2e-2 (norm-wise, as the
C++ tests), experts no token reached with zero (MoELayer) or no (MoELoRA) gradient; MoELoRA's
parameters are the adapter's tensors under the adapter's own keys, and save_pretrained writes an
adapter the runtime loads back to the same outputs.

Usage: test_module_fixtures.py <tests/data>. Exits 77 (SKIPPED) without numpy or torch.
"""
import json
import os
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError:
    print("numpy or torch is not installed (apt install python3-numpy python3-torch): skipped")
    sys.exit(77)

import tilemoe
from tilemoe import safetensors_io
from tilemoe.naming import naming_of
from tilemoe.torch import MoELoRA
from checks import expect, rel, finish

DATA = sys.argv[1]
PROJ = ("gate", "up", "down")


def check_lora_grads(where, naming, grad_of, ref, num_experts):
    """grad_of(expert, projection index, "A"/"B") -> array or None; returns how many were compared."""
    compared = 0
    for e in range(num_experts):
        for i in range(3):
            for factor in ("A", "B"):
                key = "grad." + naming.key(e, i, factor)
                got = grad_of(e, i, factor)
                if key in ref:
                    err = rel(got, ref[key])
                    expect(err <= 2e-2, f"{where}: {key} error {err:.2e}")
                    compared += 1
                else:
                    expect(got is None or not np.any(got), f"{where}: {key}: no token reached the expert, yet a gradient")
    expect(compared > 0, f"{where}: no LoRA gradient compared")
    return compared


def through_layer_numpy(case, layer_index, ref, p):
    layer = tilemoe.MoELayer.from_checkpoint(f"{DATA}/{case}/model", layer_index, adapter=f"{DATA}/{case}/adapter",
                                             max_tokens=64)
    naming = naming_of(layer)
    x = tilemoe.float32_to_bf16(ref[p + "input"])
    ids = np.ascontiguousarray(ref[p + "expert_ids"], dtype=np.int64)
    w = np.ascontiguousarray(ref[p + "weights"], dtype=np.float32)
    go = np.ascontiguousarray(ref[p + "grad_output"], dtype=np.float32)
    out = np.zeros((x.shape[0], x.shape[1]), np.float32)
    layer.forward_sft(x, ids, w, out)
    lora = layer.lora_weights()
    grads = {f"{n}_{f}": np.full_like(lora[n][f], np.nan) for n in PROJ for f in ("a", "b")}  # all overwritten
    dx = layer.backward(go, None, grads)
    where = f"{case} layer {layer_index} (MoELayer, numpy)"
    e_out, e_dx = rel(out, ref[p + "output"]), rel(dx, ref[p + "grad_input"])
    print(f"{where}: output {e_out:.2e}, grad_input {e_dx:.2e}")
    expect(e_out <= 1e-2, f"{where}: output error {e_out:.2e}")
    expect(e_dx <= 1e-2, f"{where}: grad_input error {e_dx:.2e}")
    n = check_lora_grads(where, naming, lambda e, i, f: grads[f"{PROJ[i]}_{f.lower()}"][e], ref, layer.config.num_experts)
    print(f"{where}: {n} LoRA gradients within 2e-2")
    expect(layer.saved_forwards == 0, f"{where}: backward popped the saved forward")


def through_layer_tasks(case, layer_index, ref, p):
    """Submitted forward_sft and backward on torch tensors, bf16 grad_output and grad_input."""
    layer = tilemoe.MoELayer.from_checkpoint(f"{DATA}/{case}/model", layer_index, adapter=f"{DATA}/{case}/adapter",
                                             max_tokens=64)
    x = torch.from_numpy(ref[p + "input"]).to(torch.bfloat16)
    ids, w = torch.from_numpy(ref[p + "expert_ids"]), torch.from_numpy(ref[p + "weights"])
    go = torch.from_numpy(ref[p + "grad_output"]).to(torch.bfloat16)
    forward = layer.submit_forward_sft(x, ids, w, torch.empty(x.shape[0], x.shape[1]))
    backward = layer.submit_backward(go)
    out, dx = forward.wait(), backward.wait()
    where = f"{case} layer {layer_index} (MoELayer tasks, torch)"
    e_out, e_dx = rel(out.numpy(), ref[p + "output"]), rel(dx.float().numpy(), ref[p + "grad_input"])
    print(f"{where}: output {e_out:.2e}, bf16 grad_input {e_dx:.2e}")
    expect(dx.dtype == torch.bfloat16, f"{where}: grad_input takes grad_output's dtype")
    expect(e_out <= 1e-2, f"{where}: output error {e_out:.2e}")
    expect(e_dx <= 1e-2, f"{where}: grad_input error {e_dx:.2e}")


def through_moelora(case, layer_index, ref, p):
    layer = tilemoe.MoELayer.from_checkpoint(f"{DATA}/{case}/model", layer_index, adapter=f"{DATA}/{case}/adapter",
                                             max_tokens=64)
    m = MoELoRA(layer)
    params = dict(m.named_parameters())
    where = f"{case} layer {layer_index} (MoELoRA)"

    adapter = safetensors_io.read_tensors(f"{DATA}/{case}/adapter/adapter_model.safetensors")
    mine = {k: v for k, v in adapter.items() if f"layers.{layer_index}." in k}
    expect(set(params) == set(mine), f"{where}: parameter names are the adapter's keys")
    for k in set(params) & set(mine):
        expect(np.array_equal(params[k].detach().numpy(), mine[k]), f"{where}: {k} holds the adapter's values")
    expect(set(m.state_dict()) == set(params), f"{where}: state_dict is the LoRA parameters and nothing else")
    state = m.peft_state_dict()
    expect(set(state) == set(params) and all(torch.equal(state[k], params[k]) for k in params),
           f"{where}: peft_state_dict is the parameters under their PEFT keys")

    x = torch.from_numpy(ref[p + "input"]).requires_grad_()
    ids, w = torch.from_numpy(ref[p + "expert_ids"]), torch.from_numpy(ref[p + "weights"])
    y = m(x, ids, w)
    (y * torch.from_numpy(ref[p + "grad_output"])).sum().backward()
    e_out, e_dx = rel(y.detach().numpy(), ref[p + "output"]), rel(x.grad.numpy(), ref[p + "grad_input"])
    print(f"{where}: output {e_out:.2e}, grad_input {e_dx:.2e}")
    expect(e_out <= 1e-2, f"{where}: output error {e_out:.2e}")
    expect(e_dx <= 1e-2, f"{where}: grad_input error {e_dx:.2e}")

    def grad_of(e, i, f):
        g = params[m.naming.key(e, i, f)].grad
        return None if g is None else g.numpy()
    n = check_lora_grads(where, m.naming, grad_of, ref, layer.config.num_experts)
    print(f"{where}: {n} LoRA gradients within 2e-2")
    return m, x.detach(), ids, w


def save_pretrained_round_trip(case, layer_index, m, x, ids, w):
    """The module's state as a PEFT adapter directory, loaded by the runtime: the same outputs."""
    where = f"{case} layer {layer_index} (save_pretrained)"
    with torch.no_grad():
        for param in m.parameters():
            param.add_(0.01 * torch.randn(param.shape))  # not the fixture's values any more
        want = m(x, ids, w)
    with tempfile.TemporaryDirectory() as tmp:
        m.save_pretrained(tmp)
        config = json.load(open(os.path.join(tmp, "adapter_config.json")))
        expect(config["peft_type"] == "LORA", f"{where}: adapter_config.json is PEFT's")
        layer = tilemoe.MoELayer.from_checkpoint(f"{DATA}/{case}/model", layer_index, adapter=tmp, max_tokens=64)
        got = layer.forward(x.to(torch.bfloat16), ids, w, torch.empty(want.shape))
    err = rel(got.numpy(), want.numpy())
    print(f"{where}: the runtime on the saved adapter, difference {err:.2e}")
    expect(err <= 1e-6, f"{where}: outputs differ by {err:.2e}")


for case in ("deepseek_tiny", "mixtral_tiny", "original_moe_tiny"):
    spec = json.load(open(f"{DATA}/{case}/case.json"))["spec"]
    ref = safetensors_io.read_tensors(f"{DATA}/{case}/reference.safetensors")
    for layer_index in spec["layers"]:
        prefix = f"layer_{layer_index}."
        through_layer_numpy(case, layer_index, ref, prefix)
        through_layer_tasks(case, layer_index, ref, prefix)
        module, x, ids, w = through_moelora(case, layer_index, ref, prefix)
        if layer_index == spec["layers"][0]:
            save_pretrained_round_trip(case, layer_index, module, x, ids, w)

# A layer made from memory is named as DeepSeek/Qwen name experts, at the layer index it was given.
cfg = tilemoe.MoEConfig(num_experts=2, top_k=1, hidden=32, intermediate=32, lora_rank=2)
w = torch.zeros(2, 32, 32, dtype=torch.bfloat16)
names = list(dict(MoELoRA(tilemoe.MoELayer(cfg, w, w, w, layer_index=5)).named_parameters()))
expect(names[:2] == ["base_model.model.model.layers.5.mlp.experts.0.gate_proj.lora_A.weight",
                     "base_model.model.model.layers.5.mlp.experts.0.gate_proj.lora_B.weight"] and len(names) == 12,
       f"PEFT names of a layer made from memory: {names[:2]}")

finish("all fixture cases pass through MoELayer and MoELoRA")
