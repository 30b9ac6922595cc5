"""python3 -m tilemoe.train_demo: fine-tunes the LoRA of a synthetic layer with torch.optim.AdamW on
the runtime's gradients and prints the loss falling. A teacher LoRA sets the targets; the student
(tilemoe.torch.MoELoRA) starts as PEFT initialises it. Exit status 1 if the loss does not fall to
a quarter of where it started."""
import argparse
import sys
import time

import torch

import tilemoe
from tilemoe.progress import ProgressBar
from tilemoe.synthetic import SHAPES, random_batch, random_experts, random_lora
from tilemoe.torch import MoELoRA


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m tilemoe.train_demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="mini", choices=sorted(SHAPES))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--tokens", type=int, default=64, help="tokens per batch (4 batches)")
    ap.add_argument("--lora-rank", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--isa", default="auto")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    hidden, inter, experts, top_k = SHAPES[args.shape]
    g = torch.Generator().manual_seed(args.seed)
    gate, up, down = random_experts(experts, hidden, inter, generator=g)
    cfg = tilemoe.MoEConfig(num_experts=experts, top_k=top_k, hidden=hidden, intermediate=inter, max_tokens=args.tokens,
                            lora_rank=args.lora_rank, lora_alpha=2.0 * args.lora_rank, max_cache_depth=1,
                            threads=args.threads)
    teacher = tilemoe.MoELayer(cfg, gate, up, down, isa=args.isa)
    teacher.update_lora_weights(**random_lora(experts, hidden, inter, args.lora_rank, std=0.2, generator=g))
    batches = []
    for _ in range(4):
        x, ids, w = random_batch(args.tokens, hidden, experts, top_k, generator=g)
        target = teacher.forward(x, ids, w, torch.empty(args.tokens, hidden))
        batches.append((x.float(), ids, w, target))
    del teacher

    student = MoELoRA(tilemoe.MoELayer(cfg, gate, up, down, isa=args.isa), generator=g)
    opt = torch.optim.AdamW(student.parameters(), lr=args.lr, weight_decay=0.0)
    print(f"train-demo: shape {args.shape} (hidden {hidden}, intermediate {inter}, {experts} experts, top-{top_k}), "
          f"LoRA r={args.lora_rank}, {args.tokens} tokens x 4 batches, AdamW lr {args.lr}, isa {student.layer.isa}")

    bar = ProgressBar(args.steps, "training")
    first = last = None
    start = time.monotonic()
    report_every = max(1, args.steps // 10)
    for step in range(1, args.steps + 1):
        x, ids, w, target = batches[(step - 1) % len(batches)]
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(student(x, ids, w), target)
        loss.backward()
        opt.step()
        value = loss.item()
        first = value if first is None else first
        last = value
        bar.update(step, f"loss {value:.4e}")
        if step == 1 or step % report_every == 0 or step == args.steps:
            if bar.enabled:
                bar.stream.write("\n")
            print(f"step {step:5d}  loss {value:.4e}", flush=True)
    bar.close()
    ms = 1000 * (time.monotonic() - start) / args.steps
    print(f"loss {first:.4e} -> {last:.4e} ({last / first:.3f} of the start) in {args.steps} steps, {ms:.2f} ms per step")
    if not last < 0.25 * first:
        print("train-demo: the loss did not fall to a quarter of its start", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
