"""tilemoe.save_peft_adapter: the LoRA MoELayers use, written as a PEFT adapter directory.
- a layer made from memory with layer_index and the trainer's float32 arrays: keys at that index,
  the arrays bit for bit, adapter_config.json's r and lora_alpha the layer's; loaded back by
  another layer, the same output; (layer, index) items and Mixtral's names through the options;
- per-expert scales and coverage: alpha_pattern, no keys for uncovered experts; bfloat16 arrays
  written as BF16, or as float32 when asked;
- the fixture adapters held by checkpoint layers: their own keys and values back;
- bad items and options raise InvalidArgumentError naming them, and nothing is written.

Usage: test_module_save.py <tests/data> <cmake> <build dir>. Exits 77 (SKIPPED) without numpy or torch.
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
from checks import expect, finish

DATA = sys.argv[1]


E, K, H, I, T, R = 5, 2, 40, 27, 7, 3  # nothing a multiple of 16
gen = torch.Generator().manual_seed(11)


def make_layer(index=None):
    gate, up, down = ((torch.randn(E, rows, cols, generator=torch.Generator().manual_seed(seed)) * 0.1).to(torch.bfloat16)
                      for seed, rows, cols in ((1, I, H), (2, I, H), (3, H, I)))
    cfg = tilemoe.MoEConfig(num_experts=E, top_k=K, hidden=H, intermediate=I, max_tokens=T, lora_rank=R, lora_alpha=6.0)
    return tilemoe.MoELayer(cfg, gate, up, down, layer_index=index)


def factors(dtype=torch.float32):
    shapes = {"gate_a": (E, R, H), "gate_b": (E, I, R), "up_a": (E, R, H), "up_b": (E, I, R), "down_a": (E, R, I), "down_b": (E, H, R)}
    return {k: (torch.randn(*s, generator=gen) * 0.2).to(dtype) for k, s in shapes.items()}


x = torch.randn(T, H, generator=gen).to(torch.bfloat16)
ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)])
w = torch.softmax(torch.randn(T, K, generator=gen), dim=1)


def forward(layer):
    return torch.as_tensor(np.asarray(layer.forward(x, ids, w, torch.empty(T, H, dtype=torch.float32))))


def config_of(d):
    with open(os.path.join(d, "adapter_config.json")) as f:
        return json.load(f)


with tempfile.TemporaryDirectory() as tmp:
    # The trainer's float32 arrays on a layer that knows its index.
    layer = make_layer(index=3)
    f = factors()
    layer.update_lora_weights(**f)
    out = os.path.join(tmp, "trainer")
    st = tilemoe.save_peft_adapter(out, [layer])
    expect(st == {"layers": 1, "tensors": 6 * E, "bytes": 4 * sum(t.numel() for t in f.values())}, f"stats {st}")
    c = config_of(out)
    expect(c["r"] == R and c["lora_alpha"] == 6 and not c["rank_pattern"] and not c["alpha_pattern"], f"adapter_config.json {c}")
    tensors = safetensors_io.read_tensors(os.path.join(out, "adapter_model.safetensors"))
    for e in range(E):
        for name, proj in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            key = f"base_model.model.model.layers.3.mlp.experts.{e}.{proj}.lora_"
            expect(np.array_equal(tensors[key + "A.weight"], f[name + "_a"][e].numpy()), f"{key}A.weight")
            expect(np.array_equal(tensors[key + "B.weight"], f[name + "_b"][e].numpy()), f"{key}B.weight")
    back = make_layer()
    back.load_adapter(out, 3)
    expect(torch.equal(forward(back), forward(layer)), "the saved adapter, loaded again, gives another output")

    # (layer, index), Mixtral's names, bfloat16 arrays, per-expert scales and coverage.
    fb = factors(torch.bfloat16)
    scales = torch.tensor([2.0, 2.0, 0.5, 2.0, 2.0]).repeat(3, 1)
    present = torch.tensor([1, 1, 1, 0, 1], dtype=torch.uint8).repeat(3, 1)
    layer.update_lora_weights(**fb, scales=scales, present=present)
    out = os.path.join(tmp, "mixtral")
    tilemoe.save_peft_adapter(out, [(layer, 0)], experts_module="model.layers.{layer}.block_sparse_moe.experts.{expert}",
                              projection_names=["w1", "w3", "w2"], base_model_name_or_path="tiny-mixtral")
    c = config_of(out)
    expect(c["alpha_pattern"] == {f"layers.0.block_sparse_moe.experts.2.{p}": 1.5 for p in ("w1", "w3", "w2")},
           f"alpha_pattern {c['alpha_pattern']}")
    expect(c["base_model_name_or_path"] == "tiny-mixtral" and c["target_modules"] == ["w1", "w2", "w3"], f"adapter_config.json {c}")
    header = safetensors_io.read_header(os.path.join(out, "adapter_model.safetensors"))
    key = "base_model.model.model.layers.0.block_sparse_moe.experts.1.w3.lora_B.weight"
    expect(header.get(key, {}).get("dtype") == "BF16", f"{key} as the set holds it, BF16: {header.get(key)}")
    expect(not any(".experts.3." in k for k in header), "an uncovered expert was written")
    out32 = os.path.join(tmp, "mixtral32")
    tilemoe.save_peft_adapter(out32, [(layer, 0)], dtype="float32", experts_module="model.layers.{layer}.block_sparse_moe.experts.{expert}",
                              projection_names=("w1", "w3", "w2"))
    t32 = safetensors_io.read_tensors(os.path.join(out32, "adapter_model.safetensors"))
    expect(np.array_equal(t32[key], fb["up_b"][1].float().numpy()), "float32 as asked, the bfloat16 values exactly")

    # Fixture adapters held by checkpoint layers: their own keys and values.
    for case in ("deepseek_tiny", "mixtral_tiny"):
        with open(os.path.join(DATA, case, "case.json")) as fh:
            layers_of_case = json.load(fh)["spec"]["layers"]
        held = [tilemoe.MoELayer.from_checkpoint(os.path.join(DATA, case, "model"), l, adapter=os.path.join(DATA, case, "adapter"),
                                                 max_tokens=T, adapter_storage="float32") for l in layers_of_case]
        out = os.path.join(tmp, case)
        tilemoe.save_peft_adapter(out, held, dtype="float32")
        want = safetensors_io.read_tensors(os.path.join(DATA, case, "adapter", "adapter_model.safetensors"))
        got = safetensors_io.read_tensors(os.path.join(out, "adapter_model.safetensors"))
        routed = {k for k in want if ".experts." in k and ".lora_" in k and "shared" not in k}
        expect(set(got) == routed, f"{case}: keys {sorted(set(got) ^ routed)[:4]} differ")
        for k in routed & set(got):
            expect(np.array_equal(got[k], want[k].astype(np.float32)), f"{case}: {k}")

    # Refused, naming what is wrong; nothing written.
    bad = os.path.join(tmp, "bad")
    for call, mention in ((lambda: tilemoe.save_peft_adapter(bad, [layer, "x"]), "layers[1] is a str"),
                          (lambda: tilemoe.save_peft_adapter(bad, [(layer, 1, 2)]), "layers[0] is a tuple of 3"),
                          (lambda: tilemoe.save_peft_adapter(bad, [make_layer()]), "index in the model is not known"),
                          (lambda: tilemoe.save_peft_adapter(bad, [(layer, 1)], dtype="float16"), "dtype 'float16'"),
                          (lambda: tilemoe.save_peft_adapter(bad, [(layer, 1)], projection_names=["a", "b"]), "projection_names has 2"),
                          (lambda: tilemoe.save_peft_adapter(bad, [(layer, 1), (layer, 1)]), "layer 1 is given twice")):
        try:
            call()
            expect(False, f"no error for '{mention}'")
        except tilemoe.InvalidArgumentError as e:
            expect(mention in str(e), f"'{mention}' not in: {e}")
    expect(not os.path.exists(bad), "a refused save wrote something")

finish("save_peft_adapter writes what the layers use, under the right keys")
