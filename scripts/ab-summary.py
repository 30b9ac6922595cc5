#!/usr/bin/env python3
"""What a device-ab.sh call measured, build against build: each bench row's median ms per process,
in round order, the mean of each build, the change of n (and o) against b, and in how many
neighbouring pairs of rounds the other build was faster.

    python3 scripts/ab-summary.py OUT_DIR "b n n b b n"

Reads OUT_DIR/bench-b.txt, bench-n.txt (and bench-o.txt), which device-ab.sh appends one process's
output to per round. Rows are keyed by the bench's shape, whether it timed the fine-tuning step,
and the row's tokens, rank, nodes, LoRA factor type and group: the same key in every process.
Pairs are rounds 1-2, 3-4, ... whose builds differ: in "b n n b b n" all three, each round compared
with the one beside it, so that a drift over the call favours neither build.
"""
import re
import sys
from collections import OrderedDict

ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s")
HEADER = re.compile(r"^tilemoe bench: shape (\S+)")


def processes(path):
    """The file's processes, each {key: median_ms}, in the order they were appended."""
    out = []
    shape, step = "?", False
    try:
        lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
    except FileNotFoundError:
        return out
    for line in lines:
        m = HEADER.match(line)
        if m:
            shape, step = m.group(1), False
            # One bench process per header: a round's shapes and its step are new processes too.
            out.append(OrderedDict())
            continue
        if line.startswith("fine-tuning step:"):
            step = True
            continue
        m = ROW.match(line)
        if not m or not out:
            continue
        tokens, rank, nodes = m.group(1), m.group(2), m.group(3)
        rest = line[m.end():].split()
        # After the fixed columns (and fwd_ms / bwd_ms for a step) come the LoRA type and the group.
        tail = " ".join(t for t in rest if not re.fullmatch(r"[-+0-9.e]+%?|-", t))
        key = (shape, "step" if step else "forward", int(tokens), int(rank), int(nodes), tail)
        out[-1][key] = float(m.group(5))
    return out


def main():
    if len(sys.argv) < 3:
        print('usage: ab-summary.py OUT_DIR "b n n b b n"', file=sys.stderr)
        return 2
    out_dir, rounds = sys.argv[1], sys.argv[2].split()
    per_build = {r: processes(f"{out_dir}/bench-{r}.txt") for r in sorted(set(rounds))}
    # Round i's processes: the next unread ones of its build (a round may hold several shapes and a step).
    taken = {r: 0 for r in per_build}
    by_round = []
    for r in rounds:
        procs = per_build[r]
        per_round = len(procs) // max(1, rounds.count(r))
        merged = OrderedDict()
        for p in procs[taken[r]:taken[r] + per_round]:
            merged.update(p)
        taken[r] += per_round
        by_round.append((r, merged))
    keys = []
    for _, merged in by_round:
        for k in merged:
            if k not in keys:
                keys.append(k)
    if not keys:
        print(f"no bench rows in {out_dir}/bench-*.txt")
        return 1
    print(f"rounds: {' '.join(rounds)}  (median ms per process, in round order)")
    for k in keys:
        shape, kind, tokens, rank, nodes, tail = k
        label = f"{shape} {kind} {tokens} tokens r={rank}" + (f" nodes={nodes}" if nodes != 1 else "") + (f" {tail}" if tail else "")
        values = {r: [m[k] for rr, m in by_round if rr == r and k in m] for r in per_build}
        means = {r: sum(v) / len(v) for r, v in values.items() if v}
        cells = "; ".join(f"{r} " + " / ".join(f"{x:.3f}" for x in values[r]) for r in sorted(values) if values[r])
        print(f"{label}: {cells}")
        if "b" not in means:
            continue
        for other in sorted(means):
            if other == "b":
                continue
            change = (means[other] / means["b"] - 1) * 100
            wins = pairs = 0
            for i in range(0, len(by_round) - 1, 2):
                (r1, m1), (r2, m2) = by_round[i], by_round[i + 1]
                if {r1, r2} != {"b", other} or k not in m1 or k not in m2:
                    continue
                pairs += 1
                t_other, t_base = (m1[k], m2[k]) if r1 == other else (m2[k], m1[k])
                wins += t_other < t_base
            print(f"    {other} against b: mean {means[other]:.3f} against {means['b']:.3f} ({change:+.1f} %), "
                  f"faster in {wins} of {pairs} neighbouring pairs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
