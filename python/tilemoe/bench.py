"""python3 -m tilemoe.bench: the Python module's two targets, in ms.

1. The cost of the Python call: MoELayer.forward at 1 token called from Python (torch tensors and
   numpy arrays) against the same call in a C++ loop (MoeLayer::forward, no Python in between).
2. A training step (forward, backward, AdamW step) of tilemoe.torch.MoELoRA against the same step
   on a plain PyTorch per-expert model with PEFT-style LoRA (tilemoe.torch_reference), at --tokens.

Defaults are the targets' case: DeepSeek-V2-Lite's shape, LoRA r=16, 512 tokens."""
import argparse
import json
import statistics
import sys
import time

import numpy as np
import torch

import tilemoe
from tilemoe.synthetic import SHAPES, random_batch, random_experts
from tilemoe.optim import MoEAdamW
from tilemoe.torch import MoELoRA
from tilemoe.torch_reference import ReferenceMoE


BLOCK = 20  # 1-token calls per block of the overhead measurement


def call_overhead(layer, hidden, experts, top_k, iterations, rounds):
    """The 1-token forward called from Python against the same call in a C++ loop, in seconds.

    A 1-token call varies by tens of microseconds over time (the weights' path through memory),
    more than the Python layer costs, so two figures are taken: the 1-token call per path in blocks
    of BLOCK calls that alternate between the paths (each path first in turn), with the median of
    the blocks' paired differences; and the same calls on an empty batch (0 tokens), where the
    runtime returns at once and what remains is the Python call itself (argument checks, releasing
    and taking back the GIL)."""
    x, ids, w = random_batch(1, hidden, experts, top_k, generator=torch.Generator().manual_seed(1))
    out = torch.empty(1, hidden, dtype=torch.bfloat16)
    xn, idn, wn, outn = x.view(torch.int16).numpy().view(np.uint16), ids.numpy(), w.numpy(), np.empty((1, hidden), np.uint16)
    empty_t = (x[:0], ids[:0], w[:0], out[:0])
    empty_n = (xn[:0], idn[:0], wn[:0], outn[:0])

    def python_loop(args, n):
        t0 = time.perf_counter()
        for _ in range(n):
            layer.forward(*args)
        return (time.perf_counter() - t0) / n

    for _ in range(max(1, iterations // 10)):  # warm up
        layer.forward(x, ids, w, out)
    one = {"cpp": [], "torch": [], "numpy": []}
    empty = {"cpp": [], "torch": [], "numpy": []}
    paths = ("cpp", "torch", "numpy")
    args = {"torch": (x, ids, w, out), "numpy": (xn, idn, wn, outn)}
    for _ in range(rounds):  # interleaved, so drift hits every path alike
        for b in range(max(1, iterations // BLOCK)):
            for path in paths[b % 3:] + paths[:b % 3]:
                one[path].append(layer._time_forward(x, ids, w, out, BLOCK) if path == "cpp" else python_loop(args[path], BLOCK))
        empty["cpp"].append(layer._time_forward(*empty_t, iterations * 10))
        empty["torch"].append(python_loop(empty_t, iterations * 10))
        empty["numpy"].append(python_loop(empty_n, iterations * 10))
    med = statistics.median
    return {
        "one_token": {k: med(v) for k, v in one.items()},
        "one_token_added": {k: med([p - c for p, c in zip(one[k], one["cpp"])]) for k in ("torch", "numpy")},
        "empty_added": {k: med([p - c for p, c in zip(empty[k], empty["cpp"])]) for k in ("torch", "numpy")},
    }


def _fused_adamw(params):
    try:  # CPU tensors need PyTorch 2.4 or later
        opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
        probe = torch.zeros(1, requires_grad=True)
        probe.grad = torch.zeros(1)
        torch.optim.AdamW([probe], lr=1e-4, fused=True).step()
        return opt
    except (RuntimeError, TypeError) as e:
        raise SystemExit(f"--fused-adamw: this PyTorch ({torch.__version__}) has no fused AdamW for CPU tensors: {e}")


def train_steps(model, params, batch, steps, warmup, fused=False, optimizer=None):
    """Median seconds of forward + backward + AdamW step (`optimizer`, or AdamW over params)."""
    x, ids, w, grad_out = batch
    opt = optimizer if optimizer is not None else _fused_adamw(params) if fused else torch.optim.AdamW(params, lr=1e-4)
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = (model(x, ids, w).float() * grad_out).sum()
        loss.backward()
        opt.step()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m tilemoe.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="v2-lite", choices=sorted(SHAPES))
    ap.add_argument("--tokens", type=int, default=512, help="tokens of the training step")
    ap.add_argument("--lora-rank", type=int, default=16)
    ap.add_argument("--iterations", type=int, default=500, help="1-token calls per timing round (ten times as many empty ones)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=5, help="timed training steps (after 2 warm-up steps)")
    ap.add_argument("--baseline-dtype", default="bf16", choices=["bf16", "f32"],
                    help="base weights of the PyTorch model (its LoRA is float32, as PEFT keeps it)")
    ap.add_argument("--fused-adamw", action="store_true",
                    help="AdamW(fused=True) in both steps instead of PyTorch's default AdamW (a loop over parameters on CPU)")
    ap.add_argument("--moe-adamw", action="store_true",
                    help="MoELoRA's step takes tilemoe.optim.MoEAdamW (the same update, one fused pass over the LoRA arrays); "
                         "the PyTorch model keeps PyTorch's AdamW")
    ap.add_argument("--backward-weight-copy", action="store_true",
                    help="MoEConfig(backward_weight_copy=True): backward reads a transposed copy of the weights")
    ap.add_argument("--isa", default="auto")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--torch-threads", type=int, default=None,
                    help="PyTorch's threads for both steps (default: PyTorch's own choice, what its users get)")
    ap.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    args = ap.parse_args(argv)

    hidden, inter, experts, top_k = SHAPES[args.shape]
    g = torch.Generator().manual_seed(0)
    gate, up, down = random_experts(experts, hidden, inter, generator=g)
    cfg = tilemoe.MoEConfig(num_experts=experts, top_k=top_k, hidden=hidden, intermediate=inter,
                            max_tokens=max(args.tokens, 1), lora_rank=args.lora_rank, lora_alpha=2.0 * args.lora_rank,
                            max_cache_depth=1, threads=args.threads, backward_weight_copy=args.backward_weight_copy)
    layer = tilemoe.MoELayer(cfg, gate, up, down, isa=args.isa)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    moe = MoELoRA(layer, generator=g)
    with torch.no_grad():  # B nonzero, so the LoRA path does real work in both models
        for p in moe.parameters():
            p.normal_(0, 0.01, generator=g)
    print(f"tilemoe.bench: shape {args.shape} (hidden {hidden}, intermediate {inter}, {experts} experts, top-{top_k}), "
          f"LoRA r={args.lora_rank}, isa {layer.isa}, {layer.runtime.threads} threads, torch {torch.__version__} with "
          f"{torch.get_num_threads()} threads")

    ov = call_overhead(layer, hidden, experts, top_k, args.iterations, args.rounds)
    one, added, empty = ov["one_token"], ov["one_token_added"], ov["empty_added"]
    print(f"forward, 1 token (medians of {args.rounds * max(1, args.iterations // BLOCK)} blocks of {BLOCK} calls): C++ loop {one['cpp'] * 1e3:.4f} ms, Python call "
          f"{one['torch'] * 1e3:.4f} ms with torch tensors, {one['numpy'] * 1e3:.4f} ms with numpy arrays; added per "
          f"call, median of the blocks' paired differences: torch {added['torch'] * 1e6:+.1f} us, numpy {added['numpy'] * 1e6:+.1f} us")
    print(f"the Python call itself (an empty batch, against the C++ call on it): torch {empty['torch'] * 1e6:+.1f} us, "
          f"numpy {empty['numpy'] * 1e6:+.1f} us; target: at most +20 us")
    x, ids, w = random_batch(args.tokens, hidden, experts, top_k, generator=g)
    batch = (x.float(), ids, w, torch.randn(args.tokens, hidden, generator=g))
    ours_opt = MoEAdamW(moe, lr=1e-4) if args.moe_adamw else None
    ours = train_steps(moe, list(moe.parameters()), batch, args.steps, 2, args.fused_adamw, ours_opt)
    dtype = torch.bfloat16 if args.baseline_dtype == "bf16" else torch.float32
    ref = ReferenceMoE(gate, up, down, {k: v.clone() for k, v in moe.flat_lora().items()}, layer.lora_scale, dtype=dtype)
    theirs = train_steps(ref, ref.lora_parameters(), (x.to(dtype),) + batch[1:], args.steps, 2, args.fused_adamw)
    adamw = "AdamW fused" if args.fused_adamw else "AdamW"
    if args.moe_adamw:
        adamw = f"tilemoe.optim.MoEAdamW for MoELoRA, PyTorch's {adamw} for the PyTorch model"
    print(f"training step (forward, backward, {adamw}), {args.tokens} tokens: MoELoRA {ours * 1e3:.2f} ms, PyTorch "
          f"per-expert PEFT-style LoRA ({args.baseline_dtype} base) {theirs * 1e3:.2f} ms: {theirs / ours:.2f}x; "
          f"target: at least 8x")
    if args.json:
        print(json.dumps({"shape": args.shape, "isa": layer.isa, "threads": layer.runtime.threads,
                          "forward_1_token_ms": {"cpp": one["cpp"] * 1e3, "python_torch": one["torch"] * 1e3,
                                                 "python_numpy": one["numpy"] * 1e3},
                          "forward_1_token_added_us": {k: v * 1e6 for k, v in added.items()},
                          "python_overhead_us": empty["torch"] * 1e6, "python_overhead_numpy_us": empty["numpy"] * 1e6,
                          "tokens": args.tokens, "fused_adamw": args.fused_adamw, "moe_adamw": args.moe_adamw, "backward_weight_copy": args.backward_weight_copy,
                          "train_step_ms": {"moelora": ours * 1e3, "pytorch_peft": theirs * 1e3},
                          "speedup": theirs / ours, "baseline_dtype": args.baseline_dtype}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
