#!/usr/bin/env python3
"""Writes a DeepSeek-V2-Lite-sized synthetic Hugging Face checkpoint of the routed experts, for timing
`tilemoe quantize` (docs/perf.md): 26 MoE layers x 64 experts x 3 bf16 matrices of 2048 x 1408 plus
each layer's router, one safetensors shard per layer, 28.8 GB.

    python3 scripts/make_synthetic_checkpoint.py DIR

Standard library only. Values are finite bf16 in +-[2^-7, 2^-5); six distinct matrices are cycled
through the experts, which keeps writing fast and does not change the work of quantizing.
"""
import json, os, struct, sys
if len(sys.argv) != 2:
    sys.exit(__doc__)
out = sys.argv[1]
H, I, E, L = 2048, 1408, 64, 27
os.makedirs(out, exist_ok=True)
json.dump({"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": H, "moe_intermediate_size": I,
           "n_routed_experts": E, "num_experts_per_tok": 6, "num_hidden_layers": L, "first_k_dense_replace": 1, "moe_layer_freq": 1,
           "n_shared_experts": 0, "hidden_act": "silu", "norm_topk_prob": False, "scoring_func": "softmax", "topk_method": "greedy",
           "torch_dtype": "bfloat16"}, open(os.path.join(out, "config.json"), "w"))
hi_table = bytes([(0x3c, 0x3d, 0xbc, 0xbd)[b & 3] for b in range(256)])
def mat(n):
    b = bytearray(2 * n)
    b[0::2] = os.urandom(n)
    b[1::2] = os.urandom(n).translate(hi_table)
    return bytes(b)
pool = [mat(H * I) for _ in range(6)]
router = mat(E * H)
weight_map = {}
layers = list(range(1, L))
for li, layer in enumerate(layers):
    name = "model-%05d-of-%05d.safetensors" % (li + 1, len(layers))
    tensors = []
    for e in range(E):
        for p, shape in (("gate_proj", [I, H]), ("up_proj", [I, H]), ("down_proj", [H, I])):
            tensors.append(("model.layers.%d.mlp.experts.%d.%s.weight" % (layer, e, p), shape, pool[(e * 3 + len(tensors)) % len(pool)]))
    tensors.append(("model.layers.%d.mlp.gate.weight" % layer, [E, H], router))
    header, off = {}, 0
    for k, shape, data in tensors:
        header[k] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
        weight_map[k] = name
    hj = json.dumps(header).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)
    with open(os.path.join(out, name), "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for _, _, data in tensors:
            f.write(data)
json.dump({"metadata": {}, "weight_map": weight_map}, open(os.path.join(out, "model.safetensors.index.json"), "w"))
print("wrote", len(layers), "layers")
