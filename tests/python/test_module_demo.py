"""The package's commands and its installation: `python3 -m tilemoe.train_demo` lowers the loss,
`python3 -m tilemoe.bench` measures both targets (on a tiny shape), and `cmake --install
--component python` gives a package that imports and runs from the install tree alone.

Usage: test_module_demo.py <tests/data> <cmake> <build dir> <install dir relative to the prefix>.
Exits 77 (SKIPPED) without numpy or torch.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

try:
    import numpy  # noqa: F401
    import torch  # noqa: F401
except ImportError:
    print("numpy or torch is not installed (apt install python3-numpy python3-torch): skipped")
    sys.exit(77)

from checks import expect, finish

_, DATA, CMAKE, BUILD, INSTALL_DIR = sys.argv


def run(args, **kw):
    p = subprocess.run([sys.executable] + args, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        print(p.stdout, p.stderr)
    return p


demo = run(["-m", "tilemoe.train_demo", "--steps", "60", "--tokens", "32"])
expect(demo.returncode == 0, f"train_demo exits 0 (got {demo.returncode})")
losses = [float(line.split()[-1]) for line in demo.stdout.splitlines() if line.startswith("step")]
print(demo.stdout.splitlines()[-1] if demo.stdout else "train_demo printed nothing")
expect(len(losses) >= 5 and losses[-1] < losses[0], f"train_demo prints the loss falling: {losses}")

bench = run(["-m", "tilemoe.bench", "--shape", "tiny", "--tokens", "64", "--iterations", "200", "--rounds", "2",
             "--steps", "2", "--moe-adamw", "--json"])
expect(bench.returncode == 0, f"bench exits 0 (got {bench.returncode})")
if bench.returncode == 0:
    print("\n".join(bench.stdout.splitlines()[:-1]))
    figures = json.loads(bench.stdout.splitlines()[-1])
    timings = list(figures["forward_1_token_ms"].values()) + list(figures["train_step_ms"].values())
    expect(all(t > 0 for t in timings), f"bench measures every figure: {figures}")
    expect(figures.get("moe_adamw") is True, f"bench --moe-adamw times MoELoRA with MoEAdamW: {figures}")
    expect(all(isinstance(figures[k], float) and math.isfinite(figures[k]) for k in ("python_overhead_us", "python_overhead_numpy_us")),
           f"bench measures the Python call on an empty batch: {figures}")

with tempfile.TemporaryDirectory() as prefix:
    inst = subprocess.run([CMAKE, "--install", BUILD, "--component", "python", "--prefix", prefix], capture_output=True, text=True)
    expect(inst.returncode == 0, f"cmake --install --component python: {inst.stderr.strip()}")
    site = os.path.join(prefix, INSTALL_DIR)
    probe = ("import tilemoe, tilemoe.torch, tilemoe.optim, torch\n"
             "from tilemoe.synthetic import random_batch, random_experts\n"
             "cfg = tilemoe.MoEConfig(num_experts=4, top_k=2, hidden=64, intermediate=32, lora_rank=4)\n"
             "m = tilemoe.torch.MoELoRA(tilemoe.MoELayer(cfg, *random_experts(4, 64, 32)))\n"
             "x, ids, w = random_batch(3, 64, 4, 2)\n"
             "m(x.float(), ids, w).sum().backward()\n"
             "print(tilemoe.__file__)\n")
    env = dict(os.environ, PYTHONPATH=site)
    installed = run(["-c", probe], env=env, cwd=prefix)
    expect(installed.returncode == 0, "the installed package imports and runs")
    expect(installed.stdout.strip().startswith(os.path.realpath(site)) or installed.stdout.strip().startswith(site),
           f"imported from the install tree: {installed.stdout.strip()}")
    print("installed package:", installed.stdout.strip())

finish("train_demo, bench and the installed package work")
