"""int8 / int4 / mxfp4 base weights and the NUMA split through the Python module: layers quantized at
load from every fixture checkpoint, against PyTorch's bf16 outputs (int8 within 2.5e-2, int4 and
mxfp4 within 0.15, the quantization's own error) and trained through (QLoRA: grad_input within 5e-2
for int8); MoEConfig(weight_type=...) from tensors (mxfp4 of weights that are MXFP4 values: the bf16
layer's output); and a layer split over 2 virtual NUMA nodes equal to the unsplit one within rounding.

Usage: test_module_quantized.py <tests/data>. Exits 77 (SKIPPED) without numpy.
"""
import json
import sys

try:
    import numpy as np
except ImportError:
    print("numpy is not installed (apt install python3-numpy): skipped")
    sys.exit(77)

import tilemoe
from tilemoe import safetensors_io
from checks import expect, rel, finish

DATA = sys.argv[1]


for case in ("deepseek_tiny", "mixtral_tiny"):
    spec = json.load(open(f"{DATA}/{case}/case.json"))["spec"]
    ref = safetensors_io.read_tensors(f"{DATA}/{case}/reference.safetensors")
    layer_index = spec["layers"][0]
    p = f"layer_{layer_index}."
    x = tilemoe.float32_to_bf16(ref[p + "input"])
    ids = np.ascontiguousarray(ref[p + "expert_ids"], dtype=np.int64)
    w = np.ascontiguousarray(ref[p + "weights"], dtype=np.float32)
    go = np.ascontiguousarray(ref[p + "grad_output"], dtype=np.float32)
    outs = {}
    for weights, group, bar, dx_bar in (("int8", 128, 2.5e-2, 5e-2), ("int4", 32, 0.15, 0.15), ("mxfp4", 32, 0.15, 0.15)):
        for nodes in (1, 2):
            layer = tilemoe.MoELayer.from_checkpoint(f"{DATA}/{case}/model", layer_index, adapter=f"{DATA}/{case}/adapter",
                                                     numa_nodes=nodes, max_tokens=64, weights=weights, group_size=group)
            expect(layer.config.weight_type == weights, f"{case}: config.weight_type {layer.config.weight_type}")
            out = np.zeros((x.shape[0], x.shape[1]), np.float32)
            layer.forward_sft(x, ids, w, out)
            dx = layer.backward(go)
            where = f"{case} layer {layer_index} {weights} {nodes} node(s)"
            e_out, e_dx = rel(out, ref[p + "output"]), rel(dx, ref[p + "grad_input"])
            print(f"{where}: output {e_out:.2e}, grad_input {e_dx:.2e}")
            expect(e_out <= bar, f"{where}: output error {e_out:.2e}")
            expect(e_dx <= dx_bar, f"{where}: grad_input error {e_dx:.2e}")
            outs[(weights, nodes)] = out
        # Each node quantizes its own slice of h per row: the split differs by that rounding only.
        e = rel(outs[(weights, 2)], outs[(weights, 1)])
        expect(e <= 3e-2, f"{case} {weights}: 2 nodes against 1: {e:.2e}")

# From tensors: MoEConfig(weight_type=...), and a bad group size named.
E, K, H, I = 4, 2, 64, 96
rng = np.random.default_rng(3)
gate, up, down = (tilemoe.float32_to_bf16(rng.standard_normal(shape).astype(np.float32) * 0.05)
                  for shape in ((E, I, H), (E, I, H), (E, H, I)))
x = tilemoe.float32_to_bf16(rng.standard_normal((5, H)).astype(np.float32))
ids = rng.integers(0, E, (5, K)).astype(np.int64)
wts = np.full((5, K), 0.5, np.float32)
bf = tilemoe.MoELayer(tilemoe.MoEConfig(num_experts=E, top_k=K, hidden=H, intermediate=I), gate, up, down)
want = bf.forward(x, ids, wts, np.zeros((5, H), np.float32))
for weights, group, bar in (("int8", 128, 3e-2), ("int4", 64, 0.2)):
    cfg = tilemoe.MoEConfig(num_experts=E, top_k=K, hidden=H, intermediate=I, weight_type=weights, group_size=group)
    q = tilemoe.MoELayer(cfg, gate, up, down)
    got = q.forward(x, ids, wts, np.zeros((5, H), np.float32))
    err = rel(got, want)
    print(f"from tensors, {weights}: {err:.2e} from bf16")
    expect(err <= bar, f"from tensors, {weights}: {err:.2e} from bf16")
# Weights that are MXFP4 values (E2M1 times a power of two per 32 inputs): an mxfp4 layer computes
# with exactly them, so it gives the bf16 layer's output up to f32 rounding where an expert has 5
# rows or more. With fewer (decode) the AVX-512 rows kernel rounds each 32 activations to 2^-14 of
# their largest (amx/gemm_mxfp4.hpp), which can move h's bf16 rounding a step: within 2e-3 there.
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def mxfp4_values(shape):
    codes = rng.integers(0, 16, shape)
    scales = np.exp2(rng.integers(-9, -3, shape[:-1] + (shape[-1] // 32,))).astype(np.float32)
    return tilemoe.float32_to_bf16(E2M1[codes] * np.repeat(scales, 32, axis=-1))


mg, mu, md = mxfp4_values((E, I, H)), mxfp4_values((E, I, H)), mxfp4_values((E, H, I))
want = tilemoe.MoELayer(tilemoe.MoEConfig(num_experts=E, top_k=K, hidden=H, intermediate=I), mg, mu, md).forward(
    x, ids, wts, np.zeros((5, H), np.float32))
mx = tilemoe.MoELayer(tilemoe.MoEConfig(num_experts=E, top_k=K, hidden=H, intermediate=I, weight_type="mxfp4"), mg, mu, md)
expect(mx.config.weight_type == "mxfp4", f"mxfp4 config.weight_type {mx.config.weight_type}")
err = rel(mx.forward(x, ids, wts, np.zeros((5, H), np.float32)), want)
print(f"from MXFP4 values, mxfp4, 5 tokens: {err:.2e} from bf16")
expect(err <= 2e-3, f"from MXFP4 values, mxfp4, 5 tokens: {err:.2e} from bf16")
# 40 tokens on 4 experts: 20 rows an expert, none through the rows kernel.
x40 = tilemoe.float32_to_bf16(rng.standard_normal((40, H)).astype(np.float32))
ids40 = np.stack([np.arange(40) % E, (np.arange(40) + 1) % E], axis=1).astype(np.int64)
wts40 = np.full((40, K), 0.5, np.float32)
want40 = tilemoe.MoELayer(tilemoe.MoEConfig(num_experts=E, top_k=K, hidden=H, intermediate=I), mg, mu, md).forward(
    x40, ids40, wts40, np.zeros((40, H), np.float32))
err = rel(mx.forward(x40, ids40, wts40, np.zeros((40, H), np.float32)), want40)
print(f"from MXFP4 values, mxfp4, 40 tokens: {err:.2e} from bf16")
expect(err <= 1e-5, f"from MXFP4 values, mxfp4, 40 tokens: {err:.2e} from bf16")
try:
    tilemoe.MoELayer(tilemoe.MoEConfig(num_experts=E, top_k=K, hidden=H, intermediate=I, weight_type="int4", group_size=48), gate, up,
                     down)
    expect(False, "group_size 48 accepted")
except ValueError as e:
    expect("group_size 48" in str(e), f"group_size 48: {e}")

finish("int8 / int4 / mxfp4 layers and the NUMA split pass through the module")
