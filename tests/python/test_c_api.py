"""The C ABI from Python through ctypes, as another language's binding would use it.

Usage: test_c_api.py <libtilemoe.so> <tests/data dir>. Needs Debian's python3-numpy; without it
the script exits 77 (SKIPPED in CTest). Every fixture case: a layer from the checkpoint with its
PEFT adapter, forward and backward against PyTorch's results; a layer from numpy arrays whose
LoRA is the arrays' memory (an in-place update is seen by the next call); errors as messages.
"""
import ctypes as C
import json
import struct
import sys

try:
    import numpy as np
except ImportError:
    print("numpy is not installed (apt install python3-numpy): skipped")
    sys.exit(77)

lib = C.CDLL(sys.argv[1])
DATA = sys.argv[2]
BF16, F32 = 0, 1


class LayerConfig(C.Structure):
    _fields_ = [(n, C.c_int) for n in ("num_experts", "top_k", "hidden", "intermediate", "max_tokens", "lora_rank")] + [
        ("lora_alpha", C.c_double), ("use_rslora", C.c_int), ("max_cache_depth", C.c_int), ("weight_type", C.c_int),
        ("numa_nodes", C.c_int), ("group_size", C.c_int), ("backward_weight_copy", C.c_int), ("swiglu_limit", C.c_double),
        ("swiglu_alpha", C.c_double), ("swiglu_up_offset", C.c_double)]


class CheckpointOptions(C.Structure):
    _fields_ = [("max_tokens", C.c_int), ("max_cache_depth", C.c_int), ("lora_rank", C.c_int), ("lora_alpha", C.c_double),
                ("use_rslora", C.c_int), ("adapter", C.c_char_p), ("numa_nodes", C.c_int), ("weight_type", C.c_int),
                ("group_size", C.c_int), ("quantized_dir", C.c_char_p), ("backward_weight_copy", C.c_int)]


class LoraWeights(C.Structure):
    _fields_ = [(n, C.c_void_p) for n in ("gate_a", "gate_b", "up_a", "up_b", "down_a", "down_b")]


LoraGrads = LoraWeights  # same layout: six float pointers

lib.tilemoe_last_error.restype = C.c_char_p
lib.tilemoe_runtime_isa.restype = C.c_char_p
lib.tilemoe_runtime_create.argtypes = [C.c_char_p, C.c_int, C.POINTER(C.c_void_p)]
lib.tilemoe_runtime_destroy.argtypes = [C.c_void_p]
lib.tilemoe_runtime_isa.argtypes = [C.c_void_p]
lib.tilemoe_runtime_sync.argtypes = [C.c_void_p]
lib.tilemoe_layer_create.argtypes = [C.c_void_p, C.POINTER(LayerConfig), C.c_void_p, C.c_void_p, C.c_void_p,
                                     C.POINTER(C.c_void_p)]
lib.tilemoe_layer_from_checkpoint.argtypes = [C.c_void_p, C.c_char_p, C.c_int, C.POINTER(CheckpointOptions),
                                              C.POINTER(C.c_void_p)]
lib.tilemoe_layer_destroy.argtypes = [C.c_void_p]
lib.tilemoe_layer_forward_sft.argtypes = [C.c_void_p, C.c_int, C.c_int, C.c_void_p, C.c_void_p, C.c_void_p, C.c_void_p,
                                          C.c_int, C.c_int]
lib.tilemoe_layer_backward.argtypes = [C.c_void_p, C.c_void_p, C.c_void_p, C.c_int, C.POINTER(LoraGrads), C.c_int]
lib.tilemoe_layer_update_lora_weights.argtypes = [C.c_void_p, C.POINTER(LoraWeights)]
lib.tilemoe_layer_submit_forward_sft.argtypes = [C.c_void_p, C.c_int, C.c_int, C.c_void_p, C.c_void_p, C.c_void_p,
                                                 C.c_void_p, C.c_int, C.c_int, C.POINTER(C.c_uint64)]


class TilemoeError(RuntimeError):
    pass


def check(status):
    if status != 0:
        raise TilemoeError(lib.tilemoe_last_error().decode())


def ptr(a):
    assert a.flags["C_CONTIGUOUS"]
    return a.ctypes.data_as(C.c_void_p)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for key, t in header.items():
        if key == "__metadata__":
            continue
        a, b = t["data_offsets"]
        raw = np.frombuffer(data[a:b], dtype={"BF16": np.uint16, "F32": np.float32, "I64": np.int64}[t["dtype"]])
        if t["dtype"] == "BF16":
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        out[key] = raw.reshape(t["shape"])
    return out


def to_bf16(x):
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def rel_error(got, want):
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)
        print("FAILED:", what)


rt = C.c_void_p()
check(lib.tilemoe_runtime_create(b"auto", 0, C.byref(rt)))
print("isa", lib.tilemoe_runtime_isa(rt).decode())

for case in ("deepseek_tiny", "mixtral_tiny", "original_moe_tiny"):
    spec = json.load(open(f"{DATA}/{case}/case.json"))["spec"]
    ref = read_safetensors(f"{DATA}/{case}/reference.safetensors")
    for layer_index in spec["layers"]:
        p = f"layer_{layer_index}."
        x = to_bf16(ref[p + "input"])
        ids = np.ascontiguousarray(ref[p + "expert_ids"], dtype=np.int64)
        w = np.ascontiguousarray(ref[p + "weights"], dtype=np.float32)
        go = np.ascontiguousarray(ref[p + "grad_output"], dtype=np.float32)
        tokens, k = ids.shape
        opt = CheckpointOptions(tokens, 1, 0, 0.0, 0, f"{DATA}/{case}/adapter".encode())
        layer = C.c_void_p()
        check(lib.tilemoe_layer_from_checkpoint(rt, f"{DATA}/{case}/model".encode(), layer_index, C.byref(opt), C.byref(layer)))
        out = np.zeros((tokens, x.shape[1]), np.float32)
        dx = np.zeros_like(out)
        # Asynchronous forward, synchronous backward: the backward waits its turn behind it.
        ticket = C.c_uint64()
        check(lib.tilemoe_layer_submit_forward_sft(layer, tokens, k, ptr(x), ptr(ids), ptr(w), ptr(out), F32, 1,
                                                   C.byref(ticket)))
        check(lib.tilemoe_layer_backward(layer, ptr(go), ptr(dx), F32, None, 0))
        check(lib.tilemoe_runtime_sync(rt))
        e_out, e_dx = rel_error(out, ref[p + "output"]), rel_error(dx, ref[p + "grad_input"])
        print(f"{case} layer {layer_index}: output error {e_out:.2e}, grad_input error {e_dx:.2e}")
        expect(e_out <= 1e-2, f"{case} layer {layer_index} output")
        expect(e_dx <= 1e-2, f"{case} layer {layer_index} grad_input")
        lib.tilemoe_layer_destroy(layer)

# A layer from numpy arrays, LoRA on down only, read in place.
E, K, H, I, T, R = 4, 2, 40, 24, 6, 2
rng = np.random.default_rng(0)
gate, up = (to_bf16(rng.normal(0, 0.2, (E, I, H))) for _ in range(2))
down = to_bf16(rng.normal(0, 0.2, (E, H, I)))
cfg = LayerConfig(E, K, H, I, T, R, 4.0, 0, 1, 0, 1)
layer = C.c_void_p()
check(lib.tilemoe_layer_create(rt, C.byref(cfg), ptr(gate), ptr(up), ptr(down), C.byref(layer)))
da = np.ascontiguousarray(rng.normal(0, 0.1, (E, R, I)), dtype=np.float32)
db = np.ascontiguousarray(rng.normal(0, 0.1, (E, H, R)), dtype=np.float32)
check(lib.tilemoe_layer_update_lora_weights(layer, C.byref(LoraWeights(None, None, None, None, ptr(da), ptr(db)))))
x = to_bf16(rng.normal(0, 1, (T, H)))
ids = np.array([[t % E, (t + 1) % E] for t in range(T)], np.int64)
w = np.full((T, K), 0.5, np.float32)
out1, out2, out3 = (np.zeros((T, H), np.float32) for _ in range(3))
check(lib.tilemoe_layer_forward_sft(layer, T, K, ptr(x), ptr(ids), ptr(w), ptr(out1), F32, 0))
db *= 2.0  # an optimizer step in place
check(lib.tilemoe_layer_forward_sft(layer, T, K, ptr(x), ptr(ids), ptr(w), ptr(out2), F32, 0))
db /= 2.0
check(lib.tilemoe_layer_forward_sft(layer, T, K, ptr(x), ptr(ids), ptr(w), ptr(out3), F32, 0))
expect(rel_error(out2, out1) > 1e-3, "an in-place LoRA update is seen by the next forward")
expect(np.array_equal(out3, out1), "undoing it gives the first result again")

ids[2, 1] = E  # out of range
try:
    check(lib.tilemoe_layer_forward_sft(layer, T, K, ptr(x), ptr(ids), ptr(w), ptr(out1), F32, 1))
    expect(False, "an out-of-range expert id must fail")
except TilemoeError as e:
    print("error as expected:", e)
    expect("expert_ids[2][1]" in str(e), "the message names the slot")
lib.tilemoe_layer_destroy(layer)

# A clamped SwiGLU (DeepSeek-V4's swiglu_limit), reported back by get_config.
clamped_cfg = LayerConfig(E, K, H, I, T, R, 4.0, 0, 1, 0, 1, 0, 0, 0.125)
clamped = C.c_void_p()
check(lib.tilemoe_layer_create(rt, C.byref(clamped_cfg), ptr(gate), ptr(up), ptr(down), C.byref(clamped)))
got_cfg = LayerConfig()
check(lib.tilemoe_layer_get_config(clamped, C.byref(got_cfg)))
expect(got_cfg.swiglu_limit == 0.125 and got_cfg.num_experts == E, f"get_config gives swiglu_limit {got_cfg.swiglu_limit}")
lib.tilemoe_layer_destroy(clamped)


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for key, a in tensors.items():
        raw = np.ascontiguousarray(a, dtype=np.float32).tobytes()
        header[key] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


# A PEFT adapter stacked over deepseek_tiny's layer-1 experts (target_parameters): where the layer
# says it keeps them, its factors copied out, and written back under the same keys.
import os  # noqa: E402
import tempfile  # noqa: E402

lib.tilemoe_layer_load_adapter.argtypes = [C.c_void_p, C.c_char_p, C.c_int]
lib.tilemoe_layer_adapter_stacked_keys.argtypes = [C.c_void_p, C.c_int, C.c_char_p, C.c_size_t, C.c_char_p, C.c_size_t,
                                                   C.POINTER(C.c_int), C.POINTER(C.c_int)]
lib.tilemoe_layer_adapter_stacked_row_step.argtypes = [C.c_void_p, C.c_int, C.POINTER(C.c_int)]
lib.tilemoe_layer_copy_lora.argtypes = [C.c_void_p, C.c_int, C.c_int, C.c_void_p, C.c_void_p, C.c_void_p, C.c_void_p]


class PeftLayer(C.Structure):
    _fields_ = [("layer", C.c_void_p), ("index", C.c_int)]


lib.tilemoe_save_peft_adapter.argtypes = [C.c_char_p, C.POINTER(PeftLayer), C.c_int, C.c_void_p]
E, H, I, R = 8, 320, 176, 4
prefix = "base_model.model.model.layers.1.mlp.experts."
stacked = {prefix + "base_layer.lora_A.weight": rng.normal(0, 0.1, (R * E, H)),
           prefix + "base_layer.lora_B.weight": rng.normal(0, 0.1, (2 * I, R * E)),
           prefix + "lora_A.weight": rng.normal(0, 0.1, (R * E, I)), prefix + "lora_B.weight": rng.normal(0, 0.1, (H, R * E))}
with tempfile.TemporaryDirectory() as tmp:
    adapter, saved = os.path.join(tmp, "stacked"), os.path.join(tmp, "saved")
    os.makedirs(adapter)
    write_safetensors(os.path.join(adapter, "adapter_model.safetensors"), stacked)
    with open(os.path.join(adapter, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": R, "lora_alpha": 2 * R, "target_modules": [],
                   "target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]}, f)
    opt = CheckpointOptions(8, 0, 0, 0.0, 0, adapter.encode(), 1, 0, 0, None, 0)
    layer = C.c_void_p()
    check(lib.tilemoe_layer_from_checkpoint(rt, f"{DATA}/deepseek_tiny/model".encode(), 1, C.byref(opt), C.byref(layer)))
    keys = []
    for p in range(3):
        ka, kb, first, rows = C.create_string_buffer(256), C.create_string_buffer(256), C.c_int(-1), C.c_int(-1)
        check(lib.tilemoe_layer_adapter_stacked_keys(layer, p, ka, 256, kb, 256, C.byref(first), C.byref(rows)))
        keys.append((ka.value.decode(), kb.value.decode(), first.value, rows.value))
    expect(keys[0] == (prefix + "base_layer.lora_A.weight", prefix + "base_layer.lora_B.weight", 0, 2 * I) and
           keys[1] == (prefix + "base_layer.lora_A.weight", prefix + "base_layer.lora_B.weight", I, 2 * I) and
           keys[2] == (prefix + "lora_A.weight", prefix + "lora_B.weight", 0, H), f"stacked keys {keys}")
    steps = []
    for p in range(3):
        step = C.c_int(-1)
        check(lib.tilemoe_layer_adapter_stacked_row_step(layer, p, C.byref(step)))
        steps.append(step.value)
    expect(steps == [1, 1, 1], f"row steps {steps} (gate's rows first: 1; gpt-oss's interleaved: 2)")
    try:
        check(lib.tilemoe_layer_adapter_stacked_keys(layer, 0, C.create_string_buffer(8), 8, None, 0, None, None))
        expect(False, "a key buffer too small must fail")
    except TilemoeError as e:
        expect("key_a_size 8 is too small" in str(e), f"the message names the buffer: {e}")
    # Expert 3's down A as PEFT stacks it: rows 3*R .. 4*R of the one A.
    down_a = np.zeros((E, R, I), np.float32)
    scale = np.zeros(E, np.float32)
    check(lib.tilemoe_layer_copy_lora(layer, 2, F32, ptr(down_a), None, ptr(scale), None))
    expect(np.array_equal(down_a[3], stacked[prefix + "lora_A.weight"][3 * R:4 * R].astype(np.float32)), "copied down A")
    expect(np.allclose(scale, 2.0), f"scales {scale}")
    check(lib.tilemoe_save_peft_adapter(saved.encode(), (PeftLayer * 1)(PeftLayer(layer, -1)), 1, None))
    got = read_safetensors(os.path.join(saved, "adapter_model.safetensors"))
    expect(set(got) == set(stacked), f"saved keys {sorted(got)}")
    for k, v in stacked.items():
        expect(k in got and np.array_equal(got[k], v.astype(np.float32)), f"saved {k}")
    lib.tilemoe_layer_destroy(layer)
lib.tilemoe_runtime_destroy(rt)

if failures:
    print(len(failures), "failure(s)")
    sys.exit(1)
print("all Python ctypes checks passed")
