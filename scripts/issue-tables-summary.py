#!/usr/bin/env python3
"""Issues 4 and 7's lines, process by process, from what scripts/issue-tables.sh wrote.

    python3 scripts/issue-tables-summary.py OUT_DIR REPEAT

Reads OUT_DIR/tilemoe-{bf16,int8,int4}-P.txt (tilemoe bench), kt-{bf16,int8,int4}-P.txt (kt-kernel's
harness) and sgl-P.txt (SGLang's) for P = 1..REPEAT. Prints each line with its figures and "met" or
"missed" in each process, then how many processes met it. A figure a process lacks (a peer not run,
a token count left out) leaves its line out of that process ("-").
"""
import re
import sys

TILEMOE_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s")
LORA_COST = re.compile(r"LoRA over r=0, median of the call-by-call ratios: ([+-]?[0-9.]+) %")
PROBE = re.compile(r"measured read bandwidth ([0-9.]+) GB/s")
PEER_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([0-9.]+)\s")


def read(path):
    try:
        return open(path, encoding="utf-8", errors="replace").read().splitlines()
    except FileNotFoundError:
        return []


def tilemoe(path):
    """{(tokens, rank): (median_ms, time_over_floor, GB/s streamed)}, {tokens: paired LoRA cost in %} and
    the bench's bandwidth probe in GB/s (the floor's bandwidth; None if not printed)."""
    rows, lora = {}, {}
    probe = None
    last_tokens = None
    for line in read(path):
        m = PROBE.search(line)
        if m:
            probe = float(m.group(1))
            continue
        m = TILEMOE_ROW.match(line)
        if m:
            last_tokens = int(m.group(1))
            rows[(last_tokens, int(m.group(2)))] = (float(m.group(5)), float(m.group(10)), float(m.group(7)))
            continue
        m = LORA_COST.search(line)
        if m and last_tokens is not None:
            lora[last_tokens] = float(m.group(1))
    return rows, lora, probe


def peer(path):
    """{tokens: median_ms} of kt-kernel's or SGLang's forward table (the first table only)."""
    out = {}
    for line in read(path):
        m = PEER_ROW.match(line)
        if m and int(m.group(1)) not in out:
            out[int(m.group(1))] = float(m.group(3))
    return out


def best(*values):
    present = [v for v in values if v is not None]
    return min(present) if present else None


def near(value, limit, digits=2, sign=""):
    """value to `digits` decimals (sign "+": always signed), one more where that rounding would print the
    limit itself (0.755 against 0.75 read "0.75 missed")."""
    text = f"{value:{sign}.{digits}f}"
    return f"{value:{sign}.{digits + 1}f}" if text == f"{limit:{sign}.{digits}f}" else text


def lines_of(out_dir, p):
    """[(line, figure text, True/False/None)] for process p."""
    got = []
    bf, bf_lora, bf_probe = tilemoe(f"{out_dir}/tilemoe-bf16-{p}.txt")
    i8, _, _ = tilemoe(f"{out_dir}/tilemoe-int8-{p}.txt")
    i4, _, _ = tilemoe(f"{out_dir}/tilemoe-int4-{p}.txt")
    kt_bf, kt_i8, kt_i4 = (peer(f"{out_dir}/kt-{w}-{p}.txt") for w in ("bf16", "int8", "int4"))
    sgl = peer(f"{out_dir}/sgl-{p}.txt")

    def ours(rows, tokens):
        return rows.get((tokens, 16), (None, None, None))[:2]

    # Issue 4: bf16, r=16 held, against the faster peer without LoRA.
    ratio_lines = {1: 1.0, 16: 1.0, 128: 0.9, 512: 0.8, 4096: 0.75}
    for tokens, limit in ratio_lines.items():
        ms, tf = ours(bf, tokens)
        peer_ms = best(kt_bf.get(tokens), sgl.get(tokens))
        name = f"4: bf16 {tokens} token{'s' if tokens > 1 else ''} <= {'' if limit == 1.0 else f'{limit:g} x '}best peer"
        if ms is None or peer_ms is None:
            got.append((name, "-", None))
        else:
            got.append((name, f"{ms:.3f} / {peer_ms:.3f} = {near(ms / peer_ms, limit)}", ms <= limit * peer_ms))
        if tokens == 1:
            # The stream's GB/s against the probe's: time/floor is one reading of the memory against another.
            gbps = bf.get((1, 16), (None, None, None))[2]
            text = "-" if tf is None else near(tf, 1.1) + ("" if gbps is None or bf_probe is None else f" ({gbps:.1f} / {bf_probe:.1f} GB/s)")
            got.append(("4: bf16 decode time/floor <= 1.1", text, None if tf is None else tf <= 1.1))
    for tokens, limit in ((512, 14.0), (4096, 45.0)):
        ms, _ = ours(bf, tokens)
        got.append((f"4: bf16 {tokens} tokens <= {limit:g} ms", "-" if ms is None else f"{ms:.3f}", None if ms is None else ms <= limit))
    for tokens in (1, 512):
        cost = bf_lora.get(tokens)
        got.append((f"4: LoRA r=16 <= 5 % at {tokens} token{'s' if tokens > 1 else ''}", "-" if cost is None else near(cost, 5.0, 1, "+") + " %",
                    None if cost is None else cost <= 5.0))
    # Issue 7: int8 and int4, r=16 held, against kt-kernel's same weights.
    for name, rows, kt, ms_limit in (("int8", i8, kt_i8, 0.7), ("int4", i4, kt_i4, 0.45)):
        ms, _ = ours(rows, 1)
        k = kt.get(1)
        text = "-" if ms is None else f"{ms:.3f}" + ("" if k is None else f" / {k:.3f} = {near(ms / k, 0.8)}")
        ok = None if ms is None or k is None else (ms <= ms_limit and ms <= 0.8 * k)
        got.append((f"7: {name} 1 token <= {ms_limit:g} ms and <= 0.8 x kt-kernel", text, ok))
    ms, _ = ours(i8, 512)
    k = kt_i8.get(512)
    got.append(("7: int8 512 tokens <= 0.6 x kt-kernel", "-" if ms is None or k is None else f"{ms:.3f} / {k:.3f} = {near(ms / k, 0.6)}",
                None if ms is None or k is None else ms <= 0.6 * k))
    for name, rows, limit in (("int8", i8, 25.0), ("int4", i4, 30.0)):
        ms, _ = ours(rows, 4096)
        got.append((f"7: {name} 4096 tokens <= {limit:g} ms", "-" if ms is None else f"{ms:.3f}", None if ms is None else ms <= limit))
    return got


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    out_dir, repeat = sys.argv[1], int(sys.argv[2])
    per_process = [lines_of(out_dir, p) for p in range(1, repeat + 1)]
    names = [name for name, _, _ in per_process[0]]
    width = max(len(n) for n in names)
    for i, name in enumerate(names):
        cells, met, judged = [], 0, 0
        for got in per_process:
            _, text, ok = got[i]
            cells.append(text if ok is None else f"{text} {'met' if ok else 'missed'}")
            if ok is not None:
                judged += 1
                met += ok
        tally = f"met in {met} of {judged}" if judged else "not measured"
        print(f"{name:<{width}}  {tally:<14}  " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
