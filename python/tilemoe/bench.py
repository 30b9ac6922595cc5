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
from tilemoe.torch import MoELoRA
from tilemoe.torch_reference import ReferenceMoE


def call_overhead(layer, hidden, experts, top_k, iterations, rounds):
    """Seconds per 1-token forward: C++ loop, Python with torch tensors, Python with numpy arrays."""
    x, ids, w = random_batch(1, hidden, experts, top_k, generator=torch.Generator().manual_seed(1))
    out = torch.empty(1, hidden, dtype=torch.bfloat16)
    xn, idn, wn, outn = x.view(torch.int16).numpy().view(np.uint16), ids.numpy(), w.numpy(), np.empty((1, hidden), np.uint16)
    for _ in range(max(1, iterations // 10)):  # warm up
        layer.forward(x, ids, w, out)
    cpp, py_torch, py_numpy = [], [], []
    for _ in range(rounds):  # interleaved, so drift hits all three alike
        cpp.append(layer._time_forward(x, ids, w, out, iterations))
        t0 = time.perf_counter()
        for _ in range(iterations):
            layer.forward(x, ids, w, out)
        py_torch.append((time.perf_counter() - t0) / iterations)
        t0 = time.perf_counter()
        for _ in range(iterations):
            layer.forward(xn, idn, wn, outn)
        py_numpy.append((time.perf_counter() - t0) / iterations)
    return statistics.median(cpp), statistics.median(py_torch), statistics.median(py_numpy)


def train_steps(model, params, batch, steps, warmup):
    """Median seconds of forward + backward + AdamW step."""
    x, ids, w, grad_out = batch
    opt = torch.optim.AdamW(params, lr=1e-4)
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
    ap.add_argument("--iterations", type=int, default=2000, help="1-token calls per timing round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5, help="timed training steps (after 2 warm-up steps)")
    ap.add_argument("--baseline-dtype", default="bf16", choices=["bf16", "f32"],
                    help="base weights of the PyTorch model (its LoRA is float32, as PEFT keeps it)")
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
                            max_cache_depth=1, threads=args.threads)
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

    cpp, py_torch, py_numpy = call_overhead(layer, hidden, experts, top_k, args.iterations, args.rounds)
    print(f"forward, 1 token: C++ loop {cpp * 1e3:.4f} ms, Python call {py_torch * 1e3:.4f} ms with torch tensors "
          f"(+{(py_torch - cpp) * 1e6:.1f} us), {py_numpy * 1e3:.4f} ms with numpy arrays (+{(py_numpy - cpp) * 1e6:.1f} us)"
          f"; target: at most +20 us")

    x, ids, w = random_batch(args.tokens, hidden, experts, top_k, generator=g)
    batch = (x.float(), ids, w, torch.randn(args.tokens, hidden, generator=g))
    ours = train_steps(moe, list(moe.parameters()), batch, args.steps, 2)
    dtype = torch.bfloat16 if args.baseline_dtype == "bf16" else torch.float32
    ref = ReferenceMoE(gate, up, down, {k: v.clone() for k, v in moe.flat_lora().items()}, layer.lora_scale, dtype=dtype)
    theirs = train_steps(ref, ref.lora_parameters(), (x.to(dtype),) + batch[1:], args.steps, 2)
    print(f"training step (forward, backward, AdamW), {args.tokens} tokens: MoELoRA {ours * 1e3:.2f} ms, PyTorch "
          f"per-expert PEFT-style LoRA ({args.baseline_dtype} base) {theirs * 1e3:.2f} ms: {theirs / ours:.2f}x; "
          f"target: at least 8x")
    if args.json:
        print(json.dumps({"shape": args.shape, "isa": layer.isa, "threads": layer.runtime.threads,
                          "forward_1_token_ms": {"cpp": cpp * 1e3, "python_torch": py_torch * 1e3, "python_numpy": py_numpy * 1e3},
                          "python_overhead_us": (py_torch - cpp) * 1e6, "tokens": args.tokens,
                          "train_step_ms": {"moelora": ours * 1e3, "pytorch_peft": theirs * 1e3},
                          "speedup": theirs / ours, "baseline_dtype": args.baseline_dtype}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
