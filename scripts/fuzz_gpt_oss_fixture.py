#!/usr/bin/env python3
"""A tiny gpt-oss fixture for the loaders' fuzzer (scripts/fuzz.sh gpt_oss): model/ with config.json
and model.safetensors (layer 0's experts as transformers writes them, x W stacks with gate and up
interleaved and biases; layer 1's in the hub's MXFP4 *_blocks / *_scales; routers with their bias)
and adapter/ with a PEFT target_parameters LoRA on both layers' stacks. Valid files, for the fuzzer
to mutate; the values are random, nothing checks them.
    fuzz_gpt_oss_fixture.py OUT_DIR"""
import json
import os
import random
import struct
import sys

from fuzz_stacked_seeds import write

E, K, H, I, R = 4, 2, 64, 32, 2
rng = random.Random(5)


def bf16(count, scale=0.1):
    return ("BF16", struct.pack(f"<{count}H", *(struct.unpack("<I", struct.pack("<f", rng.gauss(0, scale)))[0] >> 16
                                                 for _ in range(count))))


def f32(count, scale=0.1):
    return ("F32", struct.pack(f"<{count}f", *(rng.gauss(0, scale) for _ in range(count))))


def u8(count, lo=0, hi=255):
    return ("U8", bytes(rng.randint(lo, hi) for _ in range(count)))


out = sys.argv[1]
os.makedirs(out + "/model", exist_ok=True)
os.makedirs(out + "/adapter", exist_ok=True)
with open(out + "/model/config.json", "w") as f:
    json.dump({"model_type": "gpt_oss", "hidden_size": H, "intermediate_size": I, "num_local_experts": E, "num_experts_per_tok": K,
               "num_hidden_layers": 2, "swiglu_limit": 7.0, "hidden_act": "silu"}, f)
model = {}
for layer in range(2):
    p = f"model.layers.{layer}.mlp."
    model[p + "router.weight"] = ("BF16", [E, H], bf16(E * H)[1])
    model[p + "router.bias"] = ("BF16", [E], bf16(E)[1])
    model[p + "experts.gate_up_proj_bias"] = ("BF16", [E, 2 * I], bf16(E * 2 * I)[1])
    model[p + "experts.down_proj_bias"] = ("BF16", [E, H], bf16(E * H)[1])
    if layer == 0:
        model[p + "experts.gate_up_proj"] = ("BF16", [E, H, 2 * I], bf16(E * H * 2 * I)[1])
        model[p + "experts.down_proj"] = ("BF16", [E, I, H], bf16(E * I * H)[1])
    else:
        model[p + "experts.gate_up_proj_blocks"] = ("U8", [E, 2 * I, H // 32, 16], u8(E * 2 * I * H // 2)[1])
        model[p + "experts.gate_up_proj_scales"] = ("U8", [E, 2 * I, H // 32], u8(E * 2 * I * H // 32, 120, 130)[1])
        model[p + "experts.down_proj_blocks"] = ("U8", [E, H, I // 32, 16], u8(E * H * I // 2)[1])
        model[p + "experts.down_proj_scales"] = ("U8", [E, H, I // 32], u8(E * H * I // 32, 120, 130)[1])
write(out + "/model/model.safetensors", model)
with open(out + "/adapter/adapter_config.json", "w") as f:
    json.dump({"peft_type": "LORA", "r": R, "lora_alpha": 2 * R, "target_modules": [],
               "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]}, f)
adapter = {}
for layer in range(2):
    p = f"base_model.model.model.layers.{layer}.mlp.experts."
    adapter[p + "base_layer.lora_A.weight"] = ("F32", [R * E, H], f32(R * E * H)[1])
    adapter[p + "base_layer.lora_B.weight"] = ("F32", [2 * I, R * E], f32(2 * I * R * E)[1])
    adapter[p + "lora_A.weight"] = ("F32", [R * E, I], f32(R * E * I)[1])
    adapter[p + "lora_B.weight"] = ("F32", [H, R * E], f32(H * R * E)[1])
write(out + "/adapter/adapter_model.safetensors", adapter)
