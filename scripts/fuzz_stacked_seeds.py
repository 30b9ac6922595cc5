#!/usr/bin/env python3
"""Fuzz seeds in the stacked forms (scripts/fuzz.sh): a fixture's checkpoint with each MoE layer's
experts stacked as transformers v5 writes them (experts.gate_up_proj [E, 2I, H], experts.down_proj
[E, H, I]) and its adapter as PEFT's target_parameters LoRA (experts[.base_layer].lora_A [r*E, in],
lora_B [out, r*E]; gate's A stands for the shared one). Valid files, for the fuzzer to mutate.
    fuzz_stacked_seeds.py FIXTURE_DIR OUT_DIR"""
import json
import re
import struct
import sys


def read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items()}


def write(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, (dtype, shape, blob) in sorted(tensors.items()):
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def stacked_model(tensors):
    out, experts = {}, {}
    for name, t in tensors.items():
        m = re.match(r"^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)\.weight$", name)
        if m:
            experts.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3))] = t
        else:
            out[name] = t
    for prefix, found in experts.items():
        count = 1 + max(e for e, _ in found)
        names = ("gate_proj", "up_proj", "down_proj") if (0, "gate_proj") in found else ("w1", "w3", "w2")
        dtype, (rows, cols), _ = found[(0, names[0])]
        out[prefix + ".gate_up_proj"] = (dtype, [count, 2 * rows, cols],
                                         b"".join(found[(e, n)][2] for e in range(count) for n in names[:2]))
        dtype, shape, _ = found[(0, names[2])]
        out[prefix + ".down_proj"] = (dtype, [count] + shape, b"".join(found[(e, names[2])][2] for e in range(count)))
    return out


def stacked_adapter(tensors):
    out, experts = {}, {}
    for name, t in tensors.items():
        m = re.match(r"^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)\.lora_([AB])\.weight$", name)
        if m:
            experts.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3), m.group(4))] = t
        else:
            out[name] = t
    for prefix, found in experts.items():
        count = 1 + max(k[0] for k in found)
        gate, up, down = ("gate_proj", "up_proj", "down_proj") if (0, "gate_proj", "A") in found else ("w1", "w3", "w2")
        if not all((e, p, f) in found for e in range(count) for p in (gate, up, down) for f in "AB"):
            continue
        for wrapper, a_proj, b_projs in ((".base_layer", gate, (gate, up)), ("", down, (down,))):
            dtype, (r, cols), _ = found[(0, a_proj, "A")]
            size = 4 if dtype == "F32" else 2
            out[prefix + wrapper + ".lora_A.weight"] = (dtype, [r * count, cols], b"".join(found[(e, a_proj, "A")][2] for e in range(count)))
            rows = []
            for p in b_projs:  # B [out, r*E]: column j*E + e
                _, (o, _), _ = found[(0, p, "B")]
                for row in range(o):
                    rows.append(b"".join(found[(e, p, "B")][2][(row * r + j) * size:(row * r + j + 1) * size]
                                         for j in range(r) for e in range(count)))
            out[prefix + wrapper + ".lora_B.weight"] = (dtype, [len(rows), r * count], b"".join(rows))
    return out


if __name__ == "__main__":
    fixture, out_dir = sys.argv[1], sys.argv[2]
    write(out_dir + "/stacked_model.safetensors", stacked_model(read(fixture + "/model/model.safetensors")))
    write(out_dir + "/stacked_adapter.safetensors", stacked_adapter(read(fixture + "/adapter/adapter_model.safetensors")))
