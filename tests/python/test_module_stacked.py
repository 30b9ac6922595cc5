"""tilemoe.torch.MoELoRA on an adapter that PEFT stacked over the experts (target_parameters on
transformers v5's experts.gate_up_proj and experts.down_proj: one A [r*E, in] that gate and up
share, one B [out, r*E] whose column j*E + e is expert e's column j), made from each fixture
case with up's A set to gate's:
- MoELayer.adapter_stacked_keys names the stacked keys and rows; a per-expert adapter has none;
- the module has one Parameter per expert for the shared A (the same object under gate and up),
  its gradient the sum of gate's and up's A gradients of the same LoRA written per expert, every
  other gradient, the output and grad_input equal to the per-expert run's: on a first backward,
  added to over micro-batches, into zeroed and into replaced .grad;
- the same in bfloat16 (within its rounding), saved as BF16;
- after optimizer steps gate and up still read one A; MoEAdamW steps it once, as AdamW does;
- peft_state_dict and save_pretrained give the adapter's own keys, shapes and adapter_config.json, the values
  bit for bit before training and, after it, ones the runtime loads back to the module's arrays;
  from a `tilemoe convert-lora` file too;
- with the caller's arrays in use instead of the adapter's, nothing is stacked or shared.

Usage: test_module_stacked.py <tests/data> <cmake> <build dir>. Exits 77 (SKIPPED) without numpy or torch.
"""
import json
import os
import re
import shutil
import subprocess
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
from tilemoe.optim import MoEAdamW
from tilemoe.torch import MoELoRA
from checks import expect, finish

DATA, BUILD = sys.argv[1], sys.argv[3]
PROJ = ("gate", "up", "down")


def read_model(model_dir):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    out = {}
    for f in files:
        out.update(safetensors_io.read_tensors(os.path.join(model_dir, f)))
    return out


EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)\.(weight|lora_A\.weight|lora_B\.weight)$")
ROLE = {"gate_proj": 0, "w1": 0, "up_proj": 1, "w3": 1, "down_proj": 2, "w2": 2}


def split_experts(tensors):
    """(other tensors, {experts prefix: {(expert, projection index, suffix): array}})."""
    other, experts = {}, {}
    for name, t in tensors.items():
        m = EXPERT.match(name)
        if m:
            experts.setdefault(m.group(1), {})[(int(m.group(2)), ROLE[m.group(3)], m.group(4))] = t
        else:
            other[name] = t
    return other, experts


def write_stacked_model(src, dst):
    """The checkpoint with each layer's experts as transformers v5 stores them, in bf16."""
    other, experts = split_experts(read_model(src))
    out = {k: torch.from_numpy(v).to(torch.bfloat16) if v.dtype == np.float32 else v for k, v in other.items()}
    for prefix, found in experts.items():
        count = 1 + max(k[0] for k in found)
        gate_up = [np.concatenate([found[(e, 0, "weight")], found[(e, 1, "weight")]]) for e in range(count)]
        out[prefix + ".gate_up_proj"] = torch.from_numpy(np.stack(gate_up)).to(torch.bfloat16)
        out[prefix + ".down_proj"] = torch.from_numpy(np.stack([found[(e, 2, "weight")] for e in range(count)])).to(torch.bfloat16)
    os.makedirs(dst)
    safetensors_io.write_tensors(os.path.join(dst, "model.safetensors"), out, {"format": "pt"})
    shutil.copy(os.path.join(src, "config.json"), dst)


def write_adapters(src, per_expert_dir, stacked_dir):
    """The fixture's adapter with every expert's up A replaced by its gate A, written per expert
    and stacked (PEFT's nesting: gate_up_proj wrapped first, so its keys carry base_layer)."""
    tensors = safetensors_io.read_tensors(os.path.join(src, "adapter_model.safetensors"))
    config = json.load(open(os.path.join(src, "adapter_config.json")))
    other, experts = split_experts(tensors)
    per_expert, stacked = dict(other), dict(other)
    for prefix, found in experts.items():
        count = 1 + max(k[0] for k in found)
        for (e, i, suffix), t in found.items():
            per_expert_key = [k for k in tensors if EXPERT.match(k) and EXPERT.match(k).group(1) == prefix and
                              int(EXPERT.match(k).group(2)) == e and ROLE[EXPERT.match(k).group(3)] == i and
                              EXPERT.match(k).group(4) == suffix][0]
            per_expert[per_expert_key] = found[(e, 0, suffix)] if (i, suffix) == (1, "lora_A.weight") else t
        r = found[(0, 0, "lora_A.weight")].shape[0]

        def stacked_b(projections):  # B [rows, r*E]: column j*E + e
            rows = np.concatenate([np.stack([found[(e, i, "lora_B.weight")] for e in range(count)], axis=2)
                                   for i in projections])  # [rows, r, E]
            return rows.reshape(rows.shape[0], r * count)
        stacked[prefix + ".base_layer.lora_A.weight"] = np.concatenate([found[(e, 0, "lora_A.weight")] for e in range(count)])
        stacked[prefix + ".base_layer.lora_B.weight"] = stacked_b((0, 1))
        stacked[prefix + ".lora_A.weight"] = np.concatenate([found[(e, 2, "lora_A.weight")] for e in range(count)])
        stacked[prefix + ".lora_B.weight"] = stacked_b((2,))
    for d, t in ((per_expert_dir, per_expert), (stacked_dir, stacked)):
        os.makedirs(d)
        safetensors_io.write_tensors(os.path.join(d, "adapter_model.safetensors"), t, {"format": "pt"})
    with open(os.path.join(per_expert_dir, "adapter_config.json"), "w") as f:
        json.dump(config, f)
    config.update(target_modules=None, target_parameters=["experts.gate_up_proj", "experts.down_proj"])
    with open(os.path.join(stacked_dir, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=1)


def run_case(case, layer_index, ref, tmp):
    where = f"{case} layer {layer_index}"
    p = f"layer_{layer_index}."
    model_v5, per_expert_dir, stacked_dir = (os.path.join(tmp, n) for n in ("model_v5", "per_expert", "stacked"))
    write_stacked_model(f"{DATA}/{case}/model", model_v5)
    write_adapters(f"{DATA}/{case}/adapter", per_expert_dir, stacked_dir)
    stacked_file = safetensors_io.read_tensors(os.path.join(stacked_dir, "adapter_model.safetensors"))
    layer_keys = sorted(k for k in stacked_file if f"layers.{layer_index}." in k)

    ref_layer = tilemoe.MoELayer.from_checkpoint(f"{DATA}/{case}/model", layer_index, adapter=per_expert_dir, max_tokens=64)
    layer = tilemoe.MoELayer.from_checkpoint(model_v5, layer_index, adapter=stacked_dir, max_tokens=64)
    cfg = layer.config
    E, H, I = cfg.num_experts, cfg.hidden, cfg.intermediate
    keys = layer.adapter_stacked_keys()
    expect(ref_layer.adapter_stacked_keys() == {}, f"{where}: a per-expert adapter has no stacked keys")
    expect(set(keys) == {"gate", "up", "down"}, f"{where}: stacked projections {sorted(keys)}")
    gate_a_key = [k for k in layer_keys if k.endswith(".base_layer.lora_A.weight")]
    expect(keys["gate"]["key_a"] == keys["up"]["key_a"] and keys["gate"]["key_b"] == keys["up"]["key_b"] and
           [keys["gate"]["key_a"]] == gate_a_key, f"{where}: gate's and up's keys {keys.get('gate')} {keys.get('up')}")
    expect((keys["gate"]["first_row"], keys["up"]["first_row"], keys["gate"]["b_rows"]) == (0, I, 2 * I) and
           (keys["down"]["first_row"], keys["down"]["b_rows"]) == (0, H), f"{where}: rows {keys}")

    ref_m, m = MoELoRA(ref_layer), MoELoRA(layer)
    params = dict(m.named_parameters())
    expect(len(params) == len(dict(ref_m.named_parameters())) - E, f"{where}: {len(params)} parameters, one A for gate and up")
    for e in range(E):
        gate_a = m.get_submodule(m.naming.module(e, 0) + ".lora_A").weight
        up_a = m.get_submodule(m.naming.module(e, 1) + ".lora_A").weight
        expect(gate_a is up_a, f"{where}: expert {e}: gate and up hold one A Parameter")

    x = torch.from_numpy(ref[p + "input"])
    ids, w = torch.from_numpy(ref[p + "expert_ids"]), torch.from_numpy(ref[p + "weights"])
    go = torch.from_numpy(ref[p + "grad_output"])

    def step_both(what, batch_ids):
        outs = []
        for module in (ref_m, m):
            xi = x.clone().requires_grad_()
            y = module(xi, batch_ids, w)
            (y * go).sum().backward()
            outs.append((y.detach(), xi.grad))
        expect(torch.equal(outs[0][0], outs[1][0]), f"{where} ({what}): output differs from the per-expert LoRA's")
        expect(torch.equal(outs[0][1], outs[1][1]), f"{where} ({what}): grad_input differs from the per-expert LoRA's")
        for e in range(E):
            grad = {(i, f): ref_m.get_submodule(ref_m.naming.module(e, i) + f".lora_{f}").weight.grad for i in range(3) for f in "AB"}
            mine = {(i, f): m.get_submodule(m.naming.module(e, i) + f".lora_{f}").weight.grad for i in range(3) for f in "AB"}
            if grad[(0, "A")] is None:
                expect(all(g is None for g in mine.values()), f"{where} ({what}): expert {e} had no token, yet a gradient")
                continue
            want = grad[(0, "A")] + grad[(1, "A")]
            err = float((mine[(0, "A")] - want).norm() / want.norm().clamp_min(1e-30))
            expect(err <= 1e-6, f"{where} ({what}): expert {e}: the shared A's gradient is not gate's + up's ({err:.2e})")
            for key in ((0, "B"), (1, "B"), (2, "A"), (2, "B")):
                expect(torch.equal(mine[key], grad[key]), f"{where} ({what}): expert {e} {PROJ[key[0]]} {key[1]}: gradient differs")

    step_both("first backward", ids)
    # Added to: a second micro-batch routed elsewhere (some experts' .grad still None), then .grad
    # zeroed in place (the runtime adds into them).
    step_both("accumulated", torch.where(ids >= 0, (ids + 1) % E, ids))
    for module in (ref_m, m):
        for param in module.parameters():
            if param.grad is not None:
                param.grad.zero_()
    step_both("into zeroed grads", ids)
    for module in (ref_m, m):
        for param in module.parameters():
            if param.grad is not None:
                param.grad = param.grad.clone()  # not the runtime's arrays: added to from a copy
    step_both("into replaced grads", ids)

    # Written back before any step: the adapter's keys, shapes, config and values, bit for bit.
    state = m.peft_state_dict()
    expect(sorted(state) == layer_keys and all(np.array_equal(state[k].numpy(), stacked_file[k]) for k in layer_keys),
           f"{where}: peft_state_dict is not the adapter's tensors")
    saved = os.path.join(tmp, "saved")
    m.save_pretrained(saved)
    written = safetensors_io.read_tensors(os.path.join(saved, "adapter_model.safetensors"))
    expect(sorted(written) == layer_keys, f"{where}: saved keys {sorted(written)}, the adapter's {layer_keys}")
    for k in set(written) & set(layer_keys):
        expect(written[k].shape == stacked_file[k].shape and np.array_equal(written[k], stacked_file[k]),
               f"{where}: saved {k} is not the adapter's tensor")
    expect(open(os.path.join(saved, "adapter_config.json")).read() == open(os.path.join(stacked_dir, "adapter_config.json")).read(),
           f"{where}: adapter_config.json is not the adapter's")

    # Steps: gate and up still read one A; what is saved loads back to the module's arrays.
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        (m(x, ids, w) * go).sum().backward()
        opt.step()
    flat = m.flat_lora()
    in_use = layer.lora_weights()
    expect(np.array_equal(in_use["gate"]["a"], in_use["up"]["a"]), f"{where}: after steps gate and up read different A")
    expect(not np.array_equal(in_use["gate"]["a"], ref_layer.lora_weights()["gate"]["a"]), f"{where}: the steps changed no A")
    shutil.rmtree(saved)
    m.save_pretrained(saved)
    back = tilemoe.MoELayer.from_checkpoint(model_v5, layer_index, adapter=saved, max_tokens=64).lora_weights()
    for name in PROJ:
        for f in "ab":
            expect(np.array_equal(back[name][f], flat[f"{name}_{f}"].numpy()), f"{where}: saved {name} {f} loads back changed")

    # bfloat16 parameters: the shared A's gradient is still gate's + up's (each rounded to bf16, then
    # their sum), within bf16's rounding of the float32 module's; saved as BF16 under the same keys.
    m32, m16 = (MoELoRA(tilemoe.MoELayer.from_checkpoint(model_v5, layer_index, adapter=stacked_dir, max_tokens=64), dtype=dt)
                for dt in (torch.float32, torch.bfloat16))
    for module in (m32, m16):
        (module(x, ids, w) * go).sum().backward()
    for e in sorted(set(ids[ids >= 0].tolist())):
        g32 = m32.get_submodule(m32.naming.module(e, 1) + ".lora_A").weight.grad
        g16 = m16.get_submodule(m16.naming.module(e, 1) + ".lora_A").weight.grad
        err = float((g16.float() - g32).norm() / g32.norm())
        expect(g16.dtype == torch.bfloat16 and err <= 1e-2, f"{where}: bf16 module, expert {e}: shared A's gradient off by {err:.2e}")
    saved16 = os.path.join(tmp, "saved16")
    m16.save_pretrained(saved16)
    header = safetensors_io.read_header(os.path.join(saved16, "adapter_model.safetensors"))
    expect(sorted(k for k in header if k != "__metadata__") == layer_keys and
           all(v["dtype"] == "BF16" for k, v in header.items() if k != "__metadata__"), f"{where}: bf16 module saved {header}")

    # MoEAdamW steps the shared A once, as torch.optim.AdamW does.
    fused, plain = (MoELoRA(tilemoe.MoELayer.from_checkpoint(model_v5, layer_index, adapter=stacked_dir, max_tokens=64))
                    for _ in range(2))
    opts = (MoEAdamW(fused, lr=1e-2), torch.optim.AdamW(plain.parameters(), lr=1e-2))
    for _ in range(3):
        for module, opt in zip((fused, plain), opts):
            opt.zero_grad(set_to_none=True)
            (module(x, ids, w) * go).sum().backward()
            opt.step()
    for k, v in plain.flat_lora().items():
        err = float((fused.flat_lora()[k] - v).norm() / v.norm())
        expect(err <= 1e-5, f"{where}: MoEAdamW and AdamW differ on {k} by {err:.2e}")
    expect(fused.flat_lora()["up_a"] is fused.flat_lora()["gate_a"], f"{where}: MoEAdamW: gate and up no longer share A")

    # A convert-lora file keeps the adapter's config: saved from it, the same directory.
    converted = os.path.join(tmp, "converted.safetensors")
    cli = os.path.join(BUILD, "tilemoe")
    run = subprocess.run([cli, "convert-lora", "--adapter", saved, "--model", model_v5, "--output", converted],
                         capture_output=True, text=True)
    expect(run.returncode == 0, f"{where}: convert-lora failed: {run.stderr}")
    if run.returncode == 0:
        from_file = MoELoRA(tilemoe.MoELayer.from_checkpoint(model_v5, layer_index, adapter=converted, max_tokens=64))
        again = os.path.join(tmp, "again")
        from_file.save_pretrained(again)
        a = safetensors_io.read_tensors(os.path.join(again, "adapter_model.safetensors"))
        b = safetensors_io.read_tensors(os.path.join(saved, "adapter_model.safetensors"))
        expect(sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in b),
               f"{where}: saved from the convert-lora file, the tensors differ")
        expect(json.load(open(os.path.join(again, "adapter_config.json"))) ==
               json.load(open(os.path.join(saved, "adapter_config.json"))), f"{where}: saved from the convert-lora file, the config differs")

    # The caller's arrays in use instead of the adapter: they are not the adapter's, so not stacked and
    # not shared (two different A here).
    other = {k: v.numpy().copy() for k, v in flat.items()}
    other["up_a"] = other["up_a"] + 1.0
    fresh = tilemoe.MoELayer.from_checkpoint(model_v5, layer_index, adapter=stacked_dir, max_tokens=64)
    fresh.update_lora_weights(**other)
    expect(fresh.adapter_stacked_keys() == {}, f"{where}: stacked keys while the caller's arrays are in use")
    own = MoELoRA(fresh)
    expect(len(dict(own.named_parameters())) == 6 * E, f"{where}: the caller's arrays: gate and up have their own A")
    expect(np.array_equal(own.flat_lora()["up_a"].numpy(), other["up_a"]), f"{where}: the caller's up A taken as it is")
    per_expert_saved = os.path.join(tmp, "per_expert_saved")
    own.save_pretrained(per_expert_saved)
    names = safetensors_io.read_tensors(os.path.join(per_expert_saved, "adapter_model.safetensors"))
    expect(len(names) == 6 * E and not any(k in names for k in layer_keys), f"{where}: the caller's arrays saved per expert")
    print(f"{where}: stacked adapter through MoELoRA: same outputs and gradients, saved back stacked")


for case in ("deepseek_tiny", "mixtral_tiny", "original_moe_tiny"):
    spec = json.load(open(f"{DATA}/{case}/case.json"))["spec"]
    ref = safetensors_io.read_tensors(f"{DATA}/{case}/reference.safetensors")
    with tempfile.TemporaryDirectory() as tmp:
        run_case(case, spec["layers"][0], ref, tmp)

finish("stacked adapters pass through MoELoRA")
