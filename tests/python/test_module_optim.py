"""tilemoe.optim.MoEAdamW against torch.optim.AdamW on the same MoELoRA parameters, both given the
same gradients at every step (MoELoRA's backward, copied to the other module), so that only the
optimizers' own roundings differ (PyTorch versions round differently: 1.13 updates exp_avg with
mul_ + add_, 2.x with lerp_, which MoEAdamW follows):
- 8 steps with routings that leave experts out (their .grad None, so AdamW skips them and their
  step counts fall behind), weight decay on, a learning rate changed by a scheduler between steps:
  every parameter within 1e-6 of AdamW's (relative to it plus lr), exp_avg and exp_avg_sq within
  1e-5 of each tensor's largest, and the step counts equal;
- a .grad the caller replaced (not the module's gradient array) is used;
- state_dict: MoEAdamW's own round trip, and an AdamW state_dict loaded into MoEAdamW continues as
  AdamW does;
- bad arguments: ValueError/TypeError naming the argument; a second parameter group is refused.

Usage: test_module_optim.py <tests/data>. Exits 77 (SKIPPED) without numpy or torch.
"""
import copy
import sys

try:
    import numpy as np  # noqa: F401  (tilemoe needs it)
    import torch
except ImportError:
    print("numpy or torch is not installed (apt install python3-numpy python3-torch): skipped")
    sys.exit(77)

import tilemoe
from tilemoe.optim import MoEAdamW
from tilemoe.synthetic import random_batch, random_experts
from tilemoe.torch import MoELoRA
from checks import expect, finish



E, K, H, I, T, R = 6, 2, 72, 40, 10, 4


def make_module(seed):
    gen = torch.Generator().manual_seed(seed)
    gate, up, down = random_experts(E, H, I, generator=gen)
    cfg = tilemoe.MoEConfig(num_experts=E, top_k=K, hidden=H, intermediate=I, max_tokens=T, lora_rank=R, lora_alpha=2.0 * R,
                            max_cache_depth=1)
    m = MoELoRA(tilemoe.MoELayer(cfg, gate, up, down), generator=gen)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return m


def batch(step, gen):
    x, ids, w = random_batch(T, H, E, K, generator=gen)
    if step % 3 == 1:  # only experts 0-2: experts 3-5 get no token and no .grad this step
        ids = ids % 3
    return x, ids, w, torch.randn(T, H, generator=gen)


def train(pairs, steps, gen, replace_grad=False):
    """pairs: (module, optimizer, scheduler or None); the first module's backward gives every
    module its gradients."""
    lead = pairs[0][0]
    for s in range(steps):
        x, ids, w, go = batch(s, gen)
        for _, opt, _ in pairs:
            opt.zero_grad(set_to_none=True)
        (lead(x, ids, w) * go).sum().backward()
        grads = [None if p.grad is None else p.grad.clone() for p in lead.parameters()]
        if replace_grad and s == 2 and grads[0] is not None:
            grads[0] = grads[0] * 2.0
            next(iter(lead.parameters())).grad = grads[0].clone()  # a tensor of the caller's, not the module's array
        for m, _, _ in pairs[1:]:
            for p, g in zip(m.parameters(), grads):
                p.grad = None if g is None else g.clone()
        for _, opt, sched in pairs:
            opt.step()
            if sched is not None:
                sched.step()


def compare(ours, theirs, opt_ours, opt_theirs, what, lr):
    worst_p = worst_m = 0.0
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
        worst_p = max(worst_p, float(((p - q).abs() / (q.abs() + lr)).max()))
        so, st = opt_ours.state.get(p, {}), opt_theirs.state.get(q, {})
        expect(bool(so) == bool(st), f"{what}: {name} has state in one optimizer only")
        if so and st:
            expect(float(so["step"]) == float(st["step"]), f"{what}: {name} step {float(so['step'])} vs {float(st['step'])}")
            for k in ("exp_avg", "exp_avg_sq"):
                worst_m = max(worst_m, float((so[k] - st[k]).abs().max() / st[k].abs().max().clamp_min(1e-30)))
    print(f"{what}: largest parameter difference {worst_p:.2e} (relative to |p| + lr), moments {worst_m:.2e}")
    expect(worst_p <= 1e-6, f"{what}: parameters differ by {worst_p:.2e} from torch.optim.AdamW's")
    expect(worst_m <= 1e-5, f"{what}: moments differ by {worst_m:.2e} from torch.optim.AdamW's")


# 1. Same steps, same results, with skipped experts, weight decay and a scheduler.
for replace in (False, True):
    ours, theirs = make_module(1), make_module(1)
    o = MoEAdamW(ours, lr=3e-3, betas=(0.9, 0.99), eps=1e-7, weight_decay=0.05)
    t = torch.optim.AdamW(theirs.parameters(), lr=3e-3, betas=(0.9, 0.99), eps=1e-7, weight_decay=0.05, foreach=False)
    so, st = torch.optim.lr_scheduler.StepLR(o, 3, 0.5), torch.optim.lr_scheduler.StepLR(t, 3, 0.5)
    train([(ours, o, so), (theirs, t, st)], 8, torch.Generator().manual_seed(2), replace)
    compare(ours, theirs, o, t, f"8 steps (caller's .grad: {replace})", 3e-3)
    steps = sorted({float(s["step"]) for s in o.state.values()})
    expect(len(steps) > 1, f"some experts skipped steps: step counts {steps}")
    # The fused arrays are what the layer reads: the next forward sees the update.
    x, ids, w, _ = batch(0, torch.Generator().manual_seed(9))
    with torch.no_grad():
        y, want = ours(x, ids, w), theirs(x, ids, w)
        err = float((y - want).norm() / want.norm())
        expect(err <= 1e-4, f"forward after the steps equals the AdamW-trained module's: relative error {err:.2e}")
        expect(not torch.equal(y, make_module(1)(x, ids, w)), "the steps changed the forward")

# 2. state_dict round trip, and AdamW's state_dict into MoEAdamW.
a, b, c = make_module(4), make_module(4), make_module(4)
oa = MoEAdamW(a, lr=1e-2)
tb = torch.optim.AdamW(b.parameters(), lr=1e-2, foreach=False)
tc = torch.optim.AdamW(c.parameters(), lr=1e-2, foreach=False)
train([(a, oa, None), (b, tb, None), (c, tc, None)], 3, torch.Generator().manual_seed(5))
saved = copy.deepcopy(oa.state_dict())
a2 = make_module(4)
with torch.no_grad():
    for p, q in zip(a2.parameters(), a.parameters()):
        p.copy_(q)
oa2 = MoEAdamW(a2, lr=1.0)
oa2.load_state_dict(saved)
expect(oa2.param_groups[0]["lr"] == 1e-2, "load_state_dict restores the learning rate")
ob = MoEAdamW(b, lr=1.0)
ob.load_state_dict(tb.state_dict())  # AdamW's state into MoEAdamW
train([(a, oa, None), (a2, oa2, None), (b, ob, None), (c, tc, None)], 3, torch.Generator().manual_seed(6))
compare(a2, a, oa2, oa, "MoEAdamW state_dict round trip", 1e-2)
compare(b, c, ob, tc, "AdamW state_dict loaded into MoEAdamW", 1e-2)

# 3. Bad arguments.
m = make_module(7)
for kwargs, name in (({"lr": -1.0}, "lr"), ({"betas": (1.0, 0.9)}, "betas"), ({"eps": -1e-8}, "eps"),
                     ({"weight_decay": float("nan")}, "weight_decay")):
    try:
        MoEAdamW(m, **kwargs)
        expect(False, f"MoEAdamW({kwargs}) raises")
    except ValueError as e:
        expect(name in str(e), f"the error names {name}: {e}")
try:
    MoEAdamW(torch.nn.Linear(2, 2))
    expect(False, "MoEAdamW of a plain module raises")
except TypeError as e:
    expect("MoELoRA" in str(e), f"the error says what is expected: {e}")
try:
    MoEAdamW(m).add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})
    expect(False, "a second parameter group is refused")
except NotImplementedError:
    pass

finish("all MoEAdamW checks passed")
