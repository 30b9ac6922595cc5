"""No leak through the binding over 10,000 forward/backward calls on a tiny shape: MoELayer calls
(synchronous and submitted, torch and numpy, with LoRA gradients) and MoELoRA's autograd steps.
The resident set and the count of Python objects stay flat once warm, and the caller's arrays
carry no reference the binding forgot to drop.

Usage: test_module_leaks.py <tests/data>. Exits 77 (SKIPPED) without numpy or torch.
"""
import gc
import os
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

E, K, H, I, T, R = 4, 2, 32, 32, 4, 2
CALLS = 10_000


def resident_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def flat(name, body, calls, watched):
    """Runs body() calls times after a warm-up; checks memory, objects and the refcounts of `watched`.

    A leak grows the resident set in every window of calls; the allocators (glibc's arenas, torch's
    caches) may also grow it once, later than the warm-up, when other processes load the machine.
    So a window that grows by 1 MiB or more is followed by a second one, and only growth in both
    is a failure.
    """
    for _ in range(calls // 10):
        body()
    gc.collect()
    refs = [sys.getrefcount(o) for o in watched]
    objects = len(gc.get_objects())
    for window in range(2):
        rss = resident_bytes()
        for _ in range(calls):
            body()
        gc.collect()
        grew = resident_bytes() - rss
        print(f"{name}: {calls} calls, resident set {grew / 1024:+.0f} KiB" + (" (second window)" if window else ""))
        if grew < 1 << 20:
            break
    expect(grew < 1 << 20, f"{name}: the resident set grew by {grew / 1024:.0f} KiB in two windows of {calls} calls")
    more = len(gc.get_objects()) - objects
    print(f"{name}: Python objects {more:+d}")
    expect(more < 100, f"{name}: {more} more Python objects")
    expect(refs == [sys.getrefcount(o) for o in watched], f"{name}: the arguments' reference counts changed")


gen = torch.Generator().manual_seed(0)
cfg = tilemoe.MoEConfig(num_experts=E, top_k=K, hidden=H, intermediate=I, max_tokens=T, lora_rank=R, max_cache_depth=1)
layer = tilemoe.MoELayer(cfg, *random_experts(E, H, I, generator=gen))
lora = random_lora(E, H, I, R, generator=gen)
layer.update_lora_weights(**lora)
x, ids, w = random_batch(T, H, E, K, generator=gen)
out, go, gi = torch.empty(T, H), torch.randn(T, H, generator=gen), torch.empty(T, H)
grads = {k: torch.empty_like(v) for k, v in lora.items()}


def torch_sync():
    layer.forward_sft(x, ids, w, out)
    layer.backward(go, gi, grads)


def torch_tasks():
    layer.submit_forward_sft(x, ids, w, out)
    layer.submit_backward(go, None, grads, accumulate=True).wait()


xn, idn, wn, outn = tilemoe.float32_to_bf16(x.float().numpy()), ids.numpy(), w.numpy(), np.empty((T, H), np.uint16)
gon = go.numpy()


def numpy_allocating():
    layer.forward_sft(xn, idn, wn)  # out and grad_input allocated by the binding
    layer.backward(gon)


flat("MoELayer, torch, synchronous", torch_sync, CALLS * 2 // 5, [x, ids, w, out, go, gi] + list(grads.values()))
flat("MoELayer, torch, tasks", torch_tasks, CALLS // 5, [x, ids, w, out, go] + list(grads.values()))
flat("MoELayer, numpy, allocating", numpy_allocating, CALLS // 5, [xn, idn, wn, gon])

module = MoELoRA(layer)
opt = torch.optim.SGD(module.parameters(), lr=1e-3)
xf = x.float().requires_grad_()


def autograd_step():
    opt.zero_grad(set_to_none=True)
    module(xf, ids, w).square().sum().backward()
    opt.step()


flat("MoELoRA, autograd and SGD", autograd_step, CALLS // 5, [xf, ids, w])
expect(layer.saved_forwards == 0, "nothing left on the saved-forward stack")

finish(f"no leak over {CALLS} forward/backward calls (and {CALLS // 10} to warm up)")
