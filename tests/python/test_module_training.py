"""tilemoe.torch.MoELoRA in training, on tiny shapes:
- gradients against central finite differences of MoELoRA itself (gradcheck-style), along each
  factor's gradient and grad_input's direction: the runtime rounds activations to bf16, so a step
  is 2% of the tensor's norm (smaller ones drown in rounding, larger in curvature; 0.6% seen) and
  the agreement asked is 3% (a wrong scale, transpose or expert is off by far more);
- zero copy: after torch.optim.AdamW steps (for-loop and foreach, amsgrad, maximize, weight decay)
  the parameters still view the arrays the runtime reads, and the next forward equals a fresh
  layer's given copies of the parameters;
- 50 AdamW steps match the same loop on a plain PyTorch per-expert model with PEFT-style LoRA
  (tilemoe.torch_reference) within 1e-2 relative loss at every step, with experts left out of some
  batches, zeroing grads to None and to zero;
- .grad semantics as autograd's: accumulation over micro-batches, a .grad the caller set is added
  to; the saved-forward stack: a dropped graph is popped, backward out of order and twice raise;
- a clamped SwiGLU (DeepSeek-V4), and gpt-oss's form with the experts' biases: output, grad_input and
  every LoRA gradient against autograd through tilemoe.torch_reference with torch.clamp;
- casting or moving the module leaves the LoRA where the runtime reads it;
- save_pretrained of a set with two ranks, per-expert scales and experts without LoRA writes PEFT's
  rank_pattern / alpha_pattern, and the runtime loads it back to the same set.

Usage: test_module_training.py <tests/data>. Exits 77 (SKIPPED) without numpy or torch.
"""
import sys

try:
    import numpy as np  # noqa: F401  (tilemoe needs it)
    import torch
except ImportError:
    print("numpy or torch is not installed (apt install python3-numpy python3-torch): skipped")
    sys.exit(77)

import tilemoe
import tilemoe.optim
from tilemoe.synthetic import random_batch, random_experts, random_lora
from tilemoe.torch import MoELoRA
from tilemoe.torch_reference import ReferenceMoE
from checks import expect, finish

FACTORS = ("gate_a", "gate_b", "up_a", "up_b", "down_a", "down_b")


def make_layer(E, K, H, I, T, R, gen, depth=1):
    gate, up, down = random_experts(E, H, I, generator=gen)
    cfg = tilemoe.MoEConfig(num_experts=E, top_k=K, hidden=H, intermediate=I, max_tokens=T, lora_rank=R, lora_alpha=2.0 * R,
                            max_cache_depth=depth)
    return tilemoe.MoELayer(cfg, gate, up, down), (gate, up, down)


def randomise(m, gen, std=0.3):
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * std)


def finite_differences():
    gen = torch.Generator().manual_seed(3)
    E, K, H, I, T, R = 4, 2, 64, 32, 6, 4
    layer, _ = make_layer(E, K, H, I, T, R, gen)
    m = MoELoRA(layer)
    randomise(m, gen, std=0.1)  # LoRA small next to W, as trained LoRA is: moderate curvature
    x, ids, w = random_batch(T, H, E, K, generator=gen)
    x = x.float()
    probe = torch.randn(T, H, generator=gen, dtype=torch.float64)

    def loss(xx):
        with torch.no_grad():
            return float((m(xx, ids, w).double() * probe).sum())

    xg = x.clone().requires_grad_()
    (m(xg, ids, w).double() * probe).sum().backward()
    params = dict(m.named_parameters())

    def stacked_grad(key):  # [E, ...] like the flat tensor; an expert without tokens has zero gradient
        i, factor = FACTORS.index(key) // 2, key[-1].upper()
        ps = [params[m.naming.key(e, i, factor)] for e in range(E)]
        return torch.stack([p.grad if p.grad is not None else torch.zeros_like(p) for p in ps])
    grads = {k: stacked_grad(k) for k in FACTORS}
    h = 0.02
    for key in FACTORS:
        flat, g = m.flat_lora()[key], grads[key]
        step = g / g.norm() * flat.norm() * h
        with torch.no_grad():
            flat.add_(step)
            plus = loss(x)
            flat.sub_(2 * step)
            minus = loss(x)
            flat.add_(step)
        numeric, analytic = (plus - minus) / 2, float((g * step).sum())
        err = abs(numeric - analytic) / abs(analytic)
        print(f"finite differences, {key}: {numeric:.5e} vs gradient {analytic:.5e} ({err:.1e})")
        expect(err <= 3e-2, f"finite differences of {key}: error {err:.1e}")
    step = xg.grad / xg.grad.norm() * x.norm() * h
    numeric, analytic = (loss(x + step) - loss(x - step)) / 2, float((xg.grad * step).sum())
    err = abs(numeric - analytic) / abs(analytic)
    print(f"finite differences, input: {numeric:.5e} vs grad_input {analytic:.5e} ({err:.1e})")
    expect(err <= 3e-2, f"finite differences of the input: error {err:.1e}")


def zero_copy_through_adamw():
    gen = torch.Generator().manual_seed(4)
    E, K, H, I, T, R = 4, 2, 64, 32, 8, 4
    variants = [dict(foreach=False), dict(foreach=True), dict(foreach=True, amsgrad=True),
                dict(foreach=False, maximize=True), dict(foreach=True, weight_decay=0.1)]
    for kw in variants:
        layer, weights = make_layer(E, K, H, I, T, R, gen)
        m = MoELoRA(layer)
        x, ids, w = random_batch(T, H, E, K, generator=gen)
        x = x.float()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2, **kw)
        before = m(x, ids, w).detach()
        for _ in range(3):
            opt.zero_grad()
            (m(x, ids, w) ** 2).mean().backward()
            opt.step()
        flat = m.flat_lora()
        aliased = all(p.data_ptr() == flat[key][e].data_ptr() for p, _, key, e in m._params)
        expect(aliased, f"AdamW {kw}: the parameters still view the runtime's arrays")
        fresh = tilemoe.MoELayer(layer.config, *weights)
        fresh.update_lora_weights(**{k: v.clone() for k, v in flat.items()})
        after = m(x, ids, w).detach()
        want = fresh.forward(x.to(torch.bfloat16), ids, w, torch.empty(T, H))
        expect(torch.equal(after, want), f"AdamW {kw}: the next forward reads the updated parameters")
        expect(not torch.equal(after, before), f"AdamW {kw}: the step changed the output")
        print(f"AdamW {kw}: zero copy holds")


def loss_curve(set_to_none):
    gen = torch.Generator().manual_seed(5)
    E, K, H, I, T, R, steps = 8, 2, 128, 64, 32, 8, 50
    layer, (gate, up, down) = make_layer(E, K, H, I, T, R, gen)
    m = MoELoRA(layer, generator=gen)
    ref = ReferenceMoE(gate, up, down, {k: v.clone() for k, v in m.flat_lora().items()}, layer.lora_scale, naming=m.naming)
    expect(set(dict(ref.named_parameters())) >= set(dict(m.named_parameters())),
           "the PyTorch model's LoRA parameters have MoELoRA's names")
    teacher = ReferenceMoE(gate, up, down, random_lora(E, H, I, R, std=0.2, generator=gen), layer.lora_scale)
    batches = []
    for b in range(3):
        x, ids, w = random_batch(T, H, E, K, generator=gen)
        if b == 0:
            ids = ids % (E - 2)  # experts 6 and 7 get no tokens: their parameters get no gradient
            ids[:, 1] = torch.where(ids[:, 1] == ids[:, 0], (ids[:, 0] + 1) % (E - 2), ids[:, 1])
        x = x.float()
        with torch.no_grad():
            batches.append((x, ids, w, teacher(x, ids, w)))
    opt_m = torch.optim.AdamW(m.parameters(), lr=5e-3)
    opt_r = torch.optim.AdamW(ref.lora_parameters(), lr=5e-3)
    worst, first, last = 0.0, None, None
    for step in range(steps):
        x, ids, w, target = batches[step % len(batches)]
        losses = []
        for model, opt in ((m, opt_m), (ref, opt_r)):
            opt.zero_grad(set_to_none=set_to_none)
            loss = torch.nn.functional.mse_loss(model(x, ids, w), target)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        rel = abs(losses[0] - losses[1]) / abs(losses[1])
        worst = max(worst, rel)
        first = losses[1] if first is None else first
        last = losses[1]
        expect(rel <= 1e-2, f"loss curve (set_to_none={set_to_none}) step {step}: {losses[0]:.6e} vs {losses[1]:.6e}")
    print(f"loss curve, zero_grad(set_to_none={set_to_none}): {first:.4e} -> {last:.4e} in {steps} AdamW steps, "
          f"largest relative difference to PyTorch {worst:.2e}")
    expect(last < 0.7 * first, "the loss falls over the 50 steps")


def clamped_swiglu(gpt_oss=False):
    """A swiglu_limit (DeepSeek-V4; with gpt_oss, gpt-oss's form: alpha 1.702, up + 1, and the experts'
    biases): forward, grad_input and every LoRA gradient against PyTorch's autograd through
    torch.clamp. The gradient jumps at the clamp's bounds, and the runtime's gate and up are within
    about 1e-4 of PyTorch's, not equal: the limit is put where no gate or up of this batch lies
    within 2e-3 of a bound, in the tail (a few per cent of the values beyond it)."""
    gen = torch.Generator().manual_seed(10 if gpt_oss else 9)
    E, K, H, I, T, R = 4, 2, 64, 40, 24, 4
    gate, up, down = random_experts(E, H, I, generator=gen)
    lora = random_lora(E, H, I, R, std=0.2, generator=gen)
    x, ids, w = random_batch(T, H, E, K, generator=gen)
    x = x.float()
    scale = 2.0  # lora_alpha / lora_rank below
    form = dict(swiglu_alpha=1.702, swiglu_up_offset=1.0) if gpt_oss else {}
    biases = {n: (torch.randn(E, d, generator=gen) * 0.3).to(torch.bfloat16) for n, d in (("gate", I), ("up", I), ("down", H))} \
        if gpt_oss else {}
    what = "gpt-oss's SwiGLU" if gpt_oss else "clamped SwiGLU"
    zero = torch.zeros(E, I)
    g = torch.cat([x @ gate[e].float().T + biases.get("gate", zero)[e].float() + scale * (x @ lora["gate_a"][e].T) @ lora["gate_b"][e].T
                   for e in range(E)]).flatten()
    u = torch.cat([x @ up[e].float().T + biases.get("up", zero)[e].float() + scale * (x @ lora["up_a"][e].T) @ lora["up_b"][e].T
                   for e in range(E)]).flatten()
    values = torch.cat([g, u, -u])
    spread = torch.cat([g, u]).std().item()
    candidates = torch.linspace(1.5 * spread, 2.5 * spread, 400)
    margin = (values[None, :] - candidates[:, None]).abs().min(dim=1).values
    limit = candidates[margin.argmax()].item()
    clamped = ((g > limit).sum() + (u.abs() > limit).sum()).item() / (g.numel() + u.numel())
    expect(margin.max().item() >= 2e-3 and clamped >= 0.01,
           f"{what}: no limit in the tail clear of this batch's values ({margin.max().item():.1e}, {clamped:.3f} clamped)")
    cfg = tilemoe.MoEConfig(num_experts=E, top_k=K, hidden=H, intermediate=I, max_tokens=T, lora_rank=R, lora_alpha=scale * R,
                            swiglu_limit=limit, **form)
    layer = tilemoe.MoELayer(cfg, gate, up, down, **{n + "_bias": b for n, b in biases.items()})
    expect(abs(layer.config.swiglu_limit - limit) <= 1e-6 * limit,
           f"MoELayer.config.swiglu_limit is {layer.config.swiglu_limit}, not {limit}")
    m = MoELoRA(layer)
    with torch.no_grad():
        for name, p in m.flat_lora().items():
            p.copy_(lora[name])
    ref = ReferenceMoE(gate, up, down, {k: v.clone() for k, v in lora.items()}, layer.lora_scale, naming=m.naming, swiglu_limit=limit,
                       biases=biases, **form)
    plain = ReferenceMoE(gate, up, down, {k: v.clone() for k, v in lora.items()}, layer.lora_scale, naming=m.naming, biases=biases,
                         **form)
    go = torch.randn(T, H, generator=gen)
    xm, xr, xp = x.clone().requires_grad_(), x.clone().requires_grad_(), x.clone().requires_grad_()
    out_m, out_r, out_p = m(xm, ids, w), ref(xr, ids, w), plain(xp, ids, w)
    (out_m * go).sum().backward()
    (out_r * go).sum().backward()
    (out_p * go).sum().backward()
    moved = rel_err(xp.grad, xr.grad)
    expect(moved > 0.05, f"{what}: the limit {limit} changes grad_input by only {moved:.2e}")
    e_out, e_dx = rel_err(out_m.detach(), out_r.detach()), rel_err(xm.grad, xr.grad)
    expect(e_out <= 1e-2 and e_dx <= 1e-2, f"{what}: output {e_out:.2e}, grad_input {e_dx:.2e} against PyTorch")
    ref_params = dict(ref.named_parameters())
    worst = 0.0
    for n, p in m.named_parameters():
        err = rel_err(p.grad, ref_params[n].grad)
        worst = max(worst, err)
        expect(err <= 2e-2, f"{what}: the gradient of {n} differs from PyTorch's by {err:.2e}")
    print(f"{what} (limit {limit:.4g}, {100 * clamped:.1f} % of gates and ups beyond it, none within "
          f"{margin.max().item():.1e}; grad_input moved {moved:.2f} by it): output {e_out:.2e}, grad_input {e_dx:.2e}, "
          f"LoRA gradients within {worst:.2e} of PyTorch's")


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30)).item()


def grad_semantics():
    gen = torch.Generator().manual_seed(6)
    E, K, H, I, T, R = 4, 2, 64, 32, 8, 4
    layer, _ = make_layer(E, K, H, I, T, R, gen)
    m = MoELoRA(layer)
    randomise(m, gen)
    b1, b2 = random_batch(T, H, E, K, generator=gen), random_batch(T, H, E, K, generator=gen)
    b2 = (b2[0], b2[1] % 2, b2[2])  # experts 2, 3 only in the first micro-batch
    b2[1][:, 1] = 1 - b2[1][:, 0]
    params = list(m.parameters())

    def grads_of(*batches):
        for p in params:
            p.grad = None
        for x, ids, w in batches:
            (m(x.float(), ids, w) ** 2).sum().backward()
        return [None if p.grad is None else p.grad.clone() for p in params]

    g1, g2, both = grads_of(b1), grads_of(b2), grads_of(b1, b2)
    ok = all((a is None and b is None and c is None) or
             torch.allclose(c, (a if a is not None else 0) + (b if b is not None else 0), rtol=1e-5, atol=1e-6)
             for a, b, c in zip(g1, g2, both))
    expect(ok, "gradients of two micro-batches accumulate into .grad")
    expect(any(g is None for g in g2), "experts without tokens keep .grad None")
    for p in params:
        p.grad = torch.full_like(p, 1.0)  # the caller's own tensors
    grads_of_before = [p.grad for p in params]
    (m(b1[0].float(), b1[1], b1[2]) ** 2).sum().backward()
    ok = all(p.grad is g and torch.allclose(g, 1.0 + a, rtol=1e-5, atol=1e-6)
             for p, g, a in zip(params, grads_of_before, g1))
    expect(ok, "a .grad the caller set is added to in place")
    print("micro-batch accumulation and caller-set .grad: as autograd does")

    # The saved-forward stack.
    layer2, _ = make_layer(E, K, H, I, T, R, gen, depth=2)
    m2 = MoELoRA(layer2)
    x, ids, w = b1
    for _ in range(5):
        m2(x.float(), ids, w)  # graphs dropped at once: each saved forward is popped at the next call
    expect(layer2.saved_forwards <= 1, f"dropped graphs are popped ({layer2.saved_forwards} saved)")
    y1, y2 = m2(x.float(), ids, w), m2(x.float(), ids, w)
    try:
        y1.sum().backward()
        expect(False, "backward of the older of two forwards raises")
    except RuntimeError as e:
        expect("reverse order" in str(e), f"the message says why: {e}")
    y2.sum().backward(retain_graph=True)
    try:
        y2.sum().backward()
        expect(False, "a second backward through one forward raises")
    except RuntimeError as e:
        expect("twice" in str(e), f"the message says why: {e}")
    y1.sum().backward()
    del y1, y2
    expect(layer2.saved_forwards == 0, "every saved forward popped")
    with torch.no_grad():
        m2(x.float(), ids, w)
    expect(layer2.saved_forwards == 0, "no_grad forwards save nothing")
    print("saved-forward stack: dropped graphs popped, out-of-order and repeated backward refused")

    before = [(p.data_ptr(), p.dtype) for p in m.parameters()]
    m.to(torch.float64)
    m.bfloat16()
    m.cpu()
    expect(before == [(p.data_ptr(), p.dtype) for p in m.parameters()], "casts and moves leave the LoRA in place")


def backward_weight_copy():
    """MoEConfig(backward_weight_copy=True): the same gradients, bit for bit, as the repacking
    backward; the config reports it; int8 weights refuse it naming the field."""
    gen = torch.Generator().manual_seed(11)
    E, K, H, I, T, R = 6, 2, 72, 40, 24, 4
    gate, up, down = random_experts(E, H, I, generator=gen)
    results = []
    for copy in (False, True):
        cfg = tilemoe.MoEConfig(num_experts=E, top_k=K, hidden=H, intermediate=I, max_tokens=T, lora_rank=R, lora_alpha=2.0 * R,
                                max_cache_depth=1, backward_weight_copy=copy)
        layer = tilemoe.MoELayer(cfg, gate, up, down)
        expect(layer.config.backward_weight_copy == copy, f"config reports backward_weight_copy={copy}")
        m = MoELoRA(layer)
        randomise(m, torch.Generator().manual_seed(12), std=0.1)
        x, ids, w = random_batch(T, H, E, K, generator=torch.Generator().manual_seed(13))
        x = x.float().requires_grad_(True)
        (m(x, ids, w) * torch.randn(T, H, generator=torch.Generator().manual_seed(14))).sum().backward()
        results.append([x.grad] + [p.grad for p in m.parameters()])
    same = all((a is None and b is None) or (a is not None and b is not None and torch.equal(a, b)) for a, b in zip(*results))
    expect(same, "backward with the weight copy gives the repacking backward's gradients bit for bit")
    try:
        tilemoe.MoELayer(tilemoe.MoEConfig(num_experts=E, top_k=K, hidden=H, intermediate=I, weight_type="int8",
                                           backward_weight_copy=True), gate, up, down)
        expect(False, "int8 weights with backward_weight_copy raise")
    except ValueError as e:
        expect("backward_weight_copy" in str(e), f"the error names backward_weight_copy: {e}")


def bfloat16_lora():
    """MoELoRA(dtype=torch.bfloat16): bf16 Parameters and .grad, read and written in place; the
    output and grad_input bit for bit those of a float32 module holding the same values, and the
    gradients those of the float32 module rounded; torch.optim.AdamW steps land where the runtime
    reads; MoEAdamW (float32 state) refuses it; save_pretrained writes BF16 an adapter loader reads."""
    gen = torch.Generator().manual_seed(21)
    E, K, H, I, T, R = 6, 2, 72, 40, 24, 4
    gate, up, down = random_experts(E, H, I, generator=gen)
    cfg = tilemoe.MoEConfig(num_experts=E, top_k=K, hidden=H, intermediate=I, max_tokens=T, lora_rank=R, lora_alpha=2.0 * R,
                            max_cache_depth=1)
    m16 = MoELoRA(tilemoe.MoELayer(cfg, gate, up, down), dtype=torch.bfloat16)
    m32 = MoELoRA(tilemoe.MoELayer(cfg, gate, up, down))
    randomise(m16, torch.Generator().manual_seed(22), std=0.1)
    with torch.no_grad():
        for p16, p32 in zip(m16.parameters(), m32.parameters()):
            p32.copy_(p16.float())
    expect(all(p.dtype == torch.bfloat16 for p in m16.parameters()), "bf16 module: bfloat16 Parameters")
    x, ids, w = random_batch(T, H, E, K, generator=torch.Generator().manual_seed(23))
    go = torch.randn(T, H, generator=torch.Generator().manual_seed(24))
    outs, xgrads = [], []
    for m in (m32, m16):
        xx = x.float().requires_grad_(True)
        out = m(xx, ids, w)
        (out * go).sum().backward()
        outs.append(out.detach())
        xgrads.append(xx.grad)
    expect(torch.equal(outs[0], outs[1]), "bf16 module: the float32 module's output bit for bit")
    expect(torch.equal(xgrads[0], xgrads[1]), "bf16 module: the float32 module's grad_input bit for bit")
    rounded = all((p32.grad is None and p16.grad is None) or
                  (p16.grad is not None and p16.grad.dtype == torch.bfloat16 and torch.equal(p16.grad, p32.grad.bfloat16()))
                  for p16, p32 in zip(m16.parameters(), m32.parameters()))
    expect(rounded, "bf16 module: bfloat16 gradients, the float32 module's rounded")
    expect(any(p.grad is not None for p in m16.parameters()), "bf16 module: gradients were written")

    opt = torch.optim.AdamW(m16.parameters(), lr=1e-2)
    losses = []
    for step in range(8):
        opt.zero_grad(set_to_none=True)
        loss = ((m16(x.float(), ids, w) - go) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    expect(losses[-1] < losses[0], f"bf16 module: AdamW lowers the loss ({losses[0]:.4f} -> {losses[-1]:.4f})")
    flat = m16.flat_lora()
    views = all(any(p.data_ptr() == flat[k][e].data_ptr() for k in flat for e in range(E)) for p in m16.parameters())
    expect(views, "bf16 module: after AdamW the Parameters still view the arrays the runtime reads")
    fresh = tilemoe.MoELayer(cfg, gate, up, down)
    fresh.update_lora_weights(**{k: v.clone() for k, v in flat.items()})
    with torch.no_grad():
        expect(torch.equal(m16(x.float(), ids, w), fresh.forward(x, ids, w, torch.empty(T, H))),
               "bf16 module: the next forward reads the stepped parameters")
    try:
        tilemoe.optim.MoEAdamW(m16)
        expect(False, "MoEAdamW refuses a bfloat16 module")
    except TypeError as e:
        expect("bfloat16" in str(e), f"MoEAdamW's refusal names the dtype: {e}")
    try:
        MoELoRA(tilemoe.MoELayer(cfg, gate, up, down), dtype=torch.float16)
        expect(False, "MoELoRA refuses float16")
    except TypeError as e:
        expect("float16" in str(e), f"the refusal names the dtype: {e}")

    import tempfile
    with tempfile.TemporaryDirectory() as d:
        m16.save_pretrained(d)
        from tilemoe import safetensors_io
        import os
        header = safetensors_io.read_header(os.path.join(d, "adapter_model.safetensors"))
        expect(all(v["dtype"] == "BF16" for k, v in header.items() if k != "__metadata__"), "save_pretrained writes BF16 tensors")
        held = tilemoe.MoELayer(cfg, gate, up, down)
        held.load_adapter(d, 0)  # a layer built from memory is named as layer 0
        with torch.no_grad():
            expect(torch.equal(held.forward(x, ids, w, torch.empty(T, H)), fresh.forward(x, ids, w, torch.empty(T, H))),
                   "the saved bf16 adapter, loaded, gives the module's forward")


def save_pretrained_patterns():
    """A set of two ranks and several scales, some experts without LoRA: save_pretrained writes r and
    lora_alpha of most modules and rank_pattern / alpha_pattern for the rest, and the runtime loads
    the directory back to the same set."""
    import json
    import os
    import tempfile
    gen = torch.Generator().manual_seed(11)
    E, K, H, I, T = 5, 2, 48, 40, 9
    gate, up, down = random_experts(E, H, I, generator=gen)
    cfg = tilemoe.MoEConfig(num_experts=E, top_k=K, hidden=H, intermediate=I, max_tokens=T, lora_rank=8, lora_alpha=16.0)
    layer = tilemoe.MoELayer(cfg, gate, up, down, layer_index=3)
    lora = random_lora(E, H, I, 8, generator=gen)
    lora["down_a"], lora["down_b"] = lora["down_a"][:, :4].contiguous(), lora["down_b"][:, :, :4].contiguous()
    scales = torch.full((3, E), 2.0)
    scales[1, 1] = 0.5   # up of expert 1: alpha 4
    scales[2, :] = 1.5   # down, rank 4: alpha 6
    present = torch.ones(3, E, dtype=torch.uint8)
    present[2, 4] = 0    # expert 4 has no LoRA on down
    layer.update_lora_weights(**lora, scales=scales, present=present)
    m = MoELoRA(layer)
    x, ids, w = random_batch(T, H, E, K, generator=gen)
    with tempfile.TemporaryDirectory() as d:
        m.save_pretrained(d)
        config = json.load(open(os.path.join(d, "adapter_config.json")))
        down_keys = {f"layers.3.mlp.experts.{e}.down_proj" for e in range(4)}
        expect((config["r"], config["lora_alpha"]) == (8, 16.0), f"r and lora_alpha of most modules: {config['r']}, {config['lora_alpha']}")
        expect(config["rank_pattern"] == {k: 4 for k in down_keys}, f"rank_pattern: {config['rank_pattern']}")
        expect(config["alpha_pattern"] == {**{k: 6.0 for k in down_keys}, "layers.3.mlp.experts.1.up_proj": 4.0},
               f"alpha_pattern: {config['alpha_pattern']}")
        try:
            tilemoe.MoELayer(cfg, gate, up, down).load_adapter(d)
            expect(False, "load_adapter without an index on a layer that has none")
        except tilemoe.InvalidArgumentError as e:
            expect("pass the layer's index" in str(e), f"the error asks for the index: {e}")
        back = tilemoe.MoELayer(cfg, gate, up, down, layer_index=3)
        back.load_adapter(d)  # its layer_index
        got = back.lora_weights()
        for i, name in enumerate(("gate", "up", "down")):
            on = present[i].bool().numpy()
            expect(np.array_equal(got[name]["present"], on), f"{name}: experts with LoRA after the round trip")
            expect(np.array_equal(got[name]["scale"][on], scales[i][on].numpy()), f"{name}: scales after the round trip")
            for f in "ab":
                expect(np.array_equal(got[name][f][on], lora[f"{name}_{f}"].numpy()[on]), f"{name} {f} after the round trip")
        with torch.no_grad():
            want = m(x.float(), ids, w)
        out = back.forward(x, ids, w, torch.empty(T, H))
        err = float((out - want).norm() / want.norm())
        expect(err <= 1e-6, f"the saved adapter, loaded, gives the module's forward (difference {err:.2e})")


finite_differences()
save_pretrained_patterns()
bfloat16_lora()
backward_weight_copy()
zero_copy_through_adamw()
loss_curve(set_to_none=True)
loss_curve(set_to_none=False)
grad_semantics()
clamped_swiglu()
clamped_swiglu(gpt_oss=True)

finish("all MoELoRA training checks passed")
