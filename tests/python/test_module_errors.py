"""Bad arguments to the Python module raise TypeError or ValueError (or tilemoe's error kinds) with a
message naming the argument, never crash, and leave the layer as it was: after every refused call
a valid one still gives the first result.

Usage: test_module_errors.py <tests/data>. Exits 77 (SKIPPED) without numpy or torch.
"""
import sys

try:
    import numpy as np
    import torch
except ImportError:
    print("numpy or torch is not installed (apt install python3-numpy python3-torch): skipped")
    sys.exit(77)

import tilemoe
from tilemoe.synthetic import random_batch, random_experts, random_lora
from tilemoe.torch import MoELoRA
from checks import expect, finish

DATA = sys.argv[1]
E, K, H, I, T, R = 4, 2, 64, 32, 8, 4


def raises(kind, words, fn, *args, **kwargs):
    """fn(*args) must raise `kind` with every word of `words` in its message."""
    what = f"{getattr(fn, '__name__', type(fn).__name__)}({', '.join(map(_short, args))}{', ' if args and kwargs else ''}" \
           f"{', '.join(f'{k}={_short(v)}' for k, v in kwargs.items())})"
    try:
        fn(*args, **kwargs)
    except kind as e:
        missing = [w for w in words if w not in str(e)]
        expect(not missing, f"{what}: message {str(e)!r} does not name {missing}")
        return
    except Exception as e:  # the wrong kind
        expect(False, f"{what}: raised {type(e).__name__} ({e}), expected {kind.__name__}")
        return
    expect(False, f"{what}: did not raise {kind.__name__}")


def _short(v):
    if isinstance(v, torch.Tensor):
        return f"tensor{list(v.shape)}:{str(v.dtype)[6:]}"
    if isinstance(v, np.ndarray):
        return f"array{list(v.shape)}:{v.dtype}"
    return repr(v)[:40]


gen = torch.Generator().manual_seed(0)
gate, up, down = random_experts(E, H, I, generator=gen)
cfg = tilemoe.MoEConfig(num_experts=E, top_k=K, hidden=H, intermediate=I, max_tokens=T, lora_rank=R, max_cache_depth=1)
layer = tilemoe.MoELayer(cfg, gate, up, down)
lora = random_lora(E, H, I, R, generator=gen)
layer.update_lora_weights(**lora)
x, ids, w = random_batch(T, H, E, K, generator=gen)
first = layer.forward(x, ids, w, torch.empty(T, H))

# gate and up stacked in one [E, 2I, H] tensor (w13, gate_up_proj), up=None: the same layer, read in place.
stacked = tilemoe.MoELayer(cfg, torch.cat([gate, up], dim=1).contiguous(), None, down)
stacked.update_lora_weights(**lora)
expect(torch.equal(stacked.forward(x, ids, w, torch.empty(T, H)), first), "a layer from stacked gate_up gives the same output")
raises(ValueError, ["gate"], tilemoe.MoELayer, cfg, gate, None, down)  # [E, I, H] is not [E, 2I, H]
del stacked


def still_works(after):
    expect(torch.equal(layer.forward(x, ids, w, torch.empty(T, H)), first), f"the layer is unchanged after {after}")


# The config.
Config = tilemoe.MoEConfig
raises(TypeError, ["MoEConfig.top_k"], Config, num_experts=E, top_k="2", hidden=H, intermediate=I)
raises(TypeError, ["MoEConfig.hidden"], Config, num_experts=E, top_k=K, hidden=64.0, intermediate=I)
raises(TypeError, ["MoEConfig.use_rslora"], Config, num_experts=E, top_k=K, hidden=H, intermediate=I, use_rslora=1)
raises(ValueError, ["MoEConfig.weight_type"], Config, num_experts=E, top_k=K, hidden=H, intermediate=I, weight_type="fp8")
raises(tilemoe.InvalidArgumentError, ["top_k"], tilemoe.MoELayer,
       Config(num_experts=E, top_k=E + 1, hidden=H, intermediate=I), gate, up, down)
raises(tilemoe.InvalidArgumentError, ["max_tokens"], tilemoe.MoELayer,
       Config(num_experts=E, top_k=K, hidden=H, intermediate=I, max_tokens=0), gate, up, down)
raises(TypeError, ["config"], tilemoe.MoELayer, {"num_experts": E}, gate, up, down)

# Expert weights.
raises(TypeError, ["gate", "bfloat16"], tilemoe.MoELayer, cfg, gate.float(), up, down)
raises(ValueError, ["down", "shape", "[4, 64, 32]"], tilemoe.MoELayer, cfg, gate, up, down.transpose(1, 2).contiguous())
raises(ValueError, ["up", "contiguous"], tilemoe.MoELayer, cfg, gate, up.transpose(1, 2).contiguous().transpose(1, 2), down)
raises(TypeError, ["gate", "list"], tilemoe.MoELayer, cfg, gate.tolist(), up, down)
raises(TypeError, ["gate", "int32"], tilemoe.MoELayer, cfg, np.zeros((E, I, H), np.int32), up, down)
raises(TypeError, ["isa"], tilemoe.MoELayer, cfg, gate, up, down, isa=3)
# The experts' biases (gpt-oss): shape, dtype and values named.
raises(ValueError, ["gate_bias", "shape"], tilemoe.MoELayer, cfg, gate, up, down, gate_bias=torch.zeros(E, H, dtype=torch.bfloat16))
raises(TypeError, ["down_bias", "bfloat16"], tilemoe.MoELayer, cfg, gate, up, down, down_bias=torch.zeros(E, H))
raises(tilemoe.BadFileError, ["expert 1 up bias"], tilemoe.MoELayer, cfg, gate, up, down,
       up_bias=torch.zeros(E, I, dtype=torch.bfloat16).index_fill_(0, torch.tensor([1]), float("nan")))
raises(tilemoe.InvalidArgumentError, ["swiglu_alpha"], tilemoe.MoELayer,
       Config(num_experts=E, top_k=K, hidden=H, intermediate=I, max_tokens=T, swiglu_alpha=0.0), gate, up, down)
raises(tilemoe.InvalidArgumentError, ["ISA", "bogus"], tilemoe.Runtime, "bogus")
if tilemoe.Runtime().isa != "amx":
    raises(tilemoe.UnsupportedError, ["AMX"], tilemoe.Runtime, "amx")

# forward's arguments.
raises(TypeError, ["x", "bfloat16"], layer.forward, x.float(), ids, w)
raises(ValueError, ["x", "shape"], layer.forward, x[:, :32].contiguous(), ids, w)
raises(ValueError, ["x", "contiguous"], layer.forward, torch.cat([x, x], 1)[:, ::2], ids, w)
raises(ValueError, ["x", "sparse"], layer.forward, x.to_sparse(), ids, w)
raises(ValueError, ["out", "meta"], layer.forward, x, ids, w, torch.empty(T, H, device="meta"))
raises(TypeError, ["expert_ids", "int64"], layer.forward, x, ids.int(), w)
raises(ValueError, ["expert_ids[2][1]", "out of range"], layer.forward, x, torch.where(
    torch.arange(T * K).reshape(T, K) == 2 * K + 1, torch.tensor(E), ids), w)
raises(ValueError, ["expert_ids", "top_k"], layer.forward, x, ids.repeat(1, 3), w.repeat(1, 3))
raises(ValueError, ["weights", "shape"], layer.forward, x, ids, w[:, :1].contiguous())
raises(TypeError, ["weights", "float32"], layer.forward, x, ids, w.double())
raises(ValueError, ["out", "requires grad"], layer.forward, x, ids, w, torch.empty(T, H, requires_grad=True))
readonly = np.empty((T, H), np.float32)
readonly.flags.writeable = False
raises(ValueError, ["out", "read-only"], layer.forward, x, ids, w, readonly)
raises(TypeError, ["out", "int64"], layer.forward, x, ids, w, torch.empty(T, H, dtype=torch.int64))
raises(ValueError, ["x", "max_tokens"], layer.forward, x.repeat(2, 1), ids.repeat(2, 1), w.repeat(2, 1))
raises(TypeError, ["save_for_backward"], layer.forward_sft, x, ids, w, None, "yes")
raises(ValueError, ["x", "big-endian"], layer.forward, tilemoe.float32_to_bf16(x.float().numpy()).astype(">u2"),
       ids.numpy(), w.numpy())
still_works("refused forwards")

# backward's.
raises(tilemoe.StateError, ["backward", "no saved forward"], layer.backward, torch.zeros(T, H))
layer.forward_sft(x, ids, w, torch.empty(T, H))
raises(tilemoe.StateError, ["forward_sft", "full"], layer.forward_sft, x, ids, w, torch.empty(T, H))
raises(ValueError, ["grad_output", "shape"], layer.backward, torch.zeros(T - 1, H))
raises(TypeError, ["grad_input", "dtype"], layer.backward, torch.zeros(T, H), torch.zeros(T, H, dtype=torch.bfloat16))
raises(ValueError, ["grads", "unknown key", "gate_c"], layer.backward, torch.zeros(T, H), None, {"gate_c": lora["gate_a"]})
raises(ValueError, ["gate_a", "shape"], layer.backward, torch.zeros(T, H), None, {"gate_a": torch.zeros(E, R + 1, H)})
raises(ValueError, ["grads", "6"], layer.backward, torch.zeros(T, H), None, [None] * 5)
raises(TypeError, ["grads"], layer.backward, torch.zeros(T, H), None, 3)
raises(TypeError, ["accumulate"], layer.backward, torch.zeros(T, H), None, None, "no")
raises(TypeError, ["up_b", "gate_a", "share a dtype"], layer.backward, torch.zeros(T, H), None,
       {"gate_a": torch.zeros(E, R, H), "up_b": torch.zeros(E, I, R, dtype=torch.bfloat16)})
raises(tilemoe.StateError, ["load_adapter", "saved forward"], layer.load_adapter, f"{DATA}/deepseek_tiny/adapter", 1)
layer.backward(torch.zeros(T, H))
expect(layer.saved_forwards == 0, "the saved forward was popped by the one valid backward")

# update_lora_weights'.
raises(ValueError, ["gate_b", "missing"], layer.update_lora_weights, gate_a=lora["gate_a"])
raises(ValueError, ["gate_a", "rank"], layer.update_lora_weights, gate_a=torch.zeros(E, R + 1, H), gate_b=torch.zeros(E, I, R + 1))
raises(ValueError, ["up_b", "shape"], layer.update_lora_weights, up_a=lora["up_a"], up_b=lora["up_b"][:, :, :2].contiguous())
raises(TypeError, ["down_a", "float32"], layer.update_lora_weights, down_a=lora["down_a"].double(), down_b=lora["down_b"])
raises(ValueError, ["scales", "shape"], layer.update_lora_weights, **lora, scales=torch.ones(E))
raises(ValueError, ["scales", "non-finite"], layer.update_lora_weights, **lora, scales=float("nan"))
raises(TypeError, ["present", "uint8"], layer.update_lora_weights, **lora, present=torch.ones(3, E))
raises(TypeError, ["scales"], layer.update_lora_weights, **lora, scales="2")
raises(TypeError, ["up_a", "up_b", "share a dtype"], layer.update_lora_weights, **{**lora, "up_a": lora["up_a"].bfloat16()})
still_works("refused LoRA sets")

# bf16 factors are read in place as f32 ones are: a set stored as bf16 (torch bfloat16, or numpy
# uint16 bits) gives the bits of an f32 set holding the same values.
lora16 = {k: v.bfloat16() for k, v in lora.items()}
layer.update_lora_weights(**{k: v.float() for k, v in lora16.items()})
want16 = layer.forward(x, ids, w, torch.empty(T, H))
layer.update_lora_weights(**lora16)
expect(torch.equal(layer.forward(x, ids, w, torch.empty(T, H)), want16), "a bfloat16 LoRA set gives the float32 set's bits")
current = layer.lora_weights()
expect(all(torch.equal(torch.from_numpy(current[n][f]), lora16[f"{n}_{f}"].float()) for n in ("gate", "up", "down") for f in ("a", "b")),
       "lora_weights() of a bfloat16 set: its values as float32")
layer.update_lora_weights(**{k: v.view(torch.int16).numpy().view(np.uint16) for k, v in lora16.items()})
expect(torch.equal(layer.forward(x, ids, w, torch.empty(T, H)), want16), "a LoRA set of numpy uint16 bf16 bits gives the same bits")
# bf16 gradients are the float32 ones rounded once each.
go = torch.randn(T, H, generator=gen)
grads32 = {k: torch.full(v.shape, 7.0) for k, v in lora16.items()}
grads16 = {k: torch.full(v.shape, 7.0, dtype=torch.bfloat16) for k, v in lora16.items()}
layer.forward_sft(x, ids, w, torch.empty(T, H))
dx32 = layer.backward(go, None, grads32)
layer.forward_sft(x, ids, w, torch.empty(T, H))
dx16 = layer.backward(go, None, grads16)
expect(torch.equal(dx32, dx16), "grad_input does not depend on the gradients' dtype")
expect(all(torch.equal(grads16[k], grads32[k].bfloat16()) for k in grads32), "bfloat16 gradients are the float32 ones rounded")
expect(all(grads32[k].abs().sum() > 0 for k in ("gate_a", "down_b")), "the gradients were written")
layer.update_lora_weights(**lora)
still_works("a bf16 LoRA set swapped back")

# Checkpoints and adapters.
model = f"{DATA}/deepseek_tiny/model"
raises(tilemoe.BadFileError, ["/nonexistent"], tilemoe.MoELayer.from_checkpoint, "/nonexistent", 1)
raises(OSError, ["/nonexistent"], tilemoe.MoELayer.from_checkpoint, "/nonexistent", 1)
raises(TypeError, ["layer"], tilemoe.MoELayer.from_checkpoint, model, "1")
raises(TypeError, ["model_dir"], tilemoe.MoELayer.from_checkpoint, 3, 1)
raises(tilemoe.InvalidArgumentError, ["layer 0"], tilemoe.MoELayer.from_checkpoint, model, 0)
raises(tilemoe.BadFileError, ["/nonexistent"], tilemoe.MoELayer.from_checkpoint, model, 1, adapter="/nonexistent")
raises(ValueError, ["numa_nodes -1"], tilemoe.MoELayer.from_checkpoint, model, 1, numa_nodes=-1)
raises(TypeError, ["threads"], tilemoe.MoELayer.from_checkpoint, model, 1, threads="all")
raises(ValueError, ["max_tokens"], tilemoe.MoELayer.from_checkpoint, model, 1, max_tokens=-1)
raises(tilemoe.BadFileError, ["/nonexistent"], layer.load_adapter, "/nonexistent", 1)
raises(ValueError, ["storage", "float16"], layer.load_adapter, f"{DATA}/deepseek_tiny/adapter", 1, "float16")
raises(TypeError, ["storage"], layer.load_adapter, f"{DATA}/deepseek_tiny/adapter", 1, 16)
raises(ValueError, ["adapter_storage", "f32"], tilemoe.MoELayer.from_checkpoint, model, 1,
       adapter=f"{DATA}/deepseek_tiny/adapter", adapter_storage="f32")
still_works("refused checkpoints and adapters")

# The fixture's BF16 adapter held as stored (bf16), in float32 or in bfloat16: the same output, bit for bit.
outs = []
for storage in (None, "float32", "bfloat16", "as_stored"):
    held = tilemoe.MoELayer.from_checkpoint(model, 1, adapter=f"{DATA}/deepseek_tiny/adapter", adapter_storage=storage,
                                            max_tokens=8)
    xs = (torch.arange(3 * held.config.hidden, dtype=torch.float32).reshape(3, -1) % 17 / 17 - 0.5).to(torch.bfloat16)
    outs.append(held.forward(xs, torch.tensor([[0, 5], [7, 2], [3, -1]]), torch.tensor([[0.25, 0.75], [0.5, 0.5], [1.0, 0.0]])))
    held.load_adapter(f"{DATA}/deepseek_tiny/adapter", 1, storage)
    outs.append(held.forward(xs, torch.tensor([[0, 5], [7, 2], [3, -1]]), torch.tensor([[0.25, 0.75], [0.5, 0.5], [1.0, 0.0]])))
expect(all(torch.equal(outs[0], o) for o in outs[1:]), "an adapter's storage changed the output")

# The torch module.
raises(ValueError, ["lora_rank"], MoELoRA, tilemoe.MoELayer(Config(num_experts=E, top_k=K, hidden=H, intermediate=I),
                                                           gate, up, down))
module = MoELoRA(layer)
raises(ValueError, ["hidden"], module, x.float()[:, :32], ids, w)
raises(TypeError, ["expert_ids", "integer"], module, x.float(), ids.float(), w)
raises(ValueError, ["expert_ids[2][1]"], module, x.float(), torch.where(torch.arange(T * K).reshape(T, K) == 2 * K + 1,
                                                                      torch.tensor(E), ids), w)
expect(layer.saved_forwards == 0, "a refused MoELoRA forward saves nothing")

finish("all bad arguments refused with messages naming them")
