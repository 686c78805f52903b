"""Ring attention on P = 1, 2, 4 processes of one machine, in one run: time, memory, traffic, error.

Each row is one launch of the demo, ``torchrun --standalone --nproc_per_node=P -m
selfattn.distributed.demo --json``, on the same inputs (batch 1, 8 heads, head dim 64,
float32, seed 0, zigzag shards): the ring forward, then forward + backward, timed from a
barrier to the slowest rank; the largest per-rank peak memory of the forward + backward
above its shards (Linux peak resident memory); the bytes each rank sends around the ring;
the largest |diff| of output, dQ, dK, dV against torch's scaled_dot_product_attention on
the full inputs in one process.

The P ranks share this machine's cores: each gets cores // P threads (at least one). On
a 2-core machine P = 2 runs two single-threaded ranks where P = 1 ran one rank with two
threads, and P = 4 puts four ranks on two cores. So the time column shows what splitting
the work costs and saves on the same cores, not what P machines would give; the memory
and traffic columns are what each rank would need anywhere.

    .venv/bin/python bench/ring.py                                  # P = 1,2,4, N = 16k, both masks: minutes
    .venv/bin/python bench/ring.py --markdown docs/ring-bench.md      # the same, and write the table
    .venv/bin/python bench/ring.py --seq-len 2048                   # smoke check, ~45 s on 2 cores
    options: --procs 1,2,4  --seq-len N  --heads H  --head-dim D  --dtype float32|float64
             --masks none,causal (or --causal)  --no-check (skip the single-process reference)
             --threads T (per rank; default CPUs // P)  --timeout S (per launch)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import machine_line  # noqa: E402


def launcher() -> list[str]:
    """torchrun next to this Python, or the same launcher through ``python -m``."""
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    return [torchrun] if os.access(torchrun, os.X_OK) else [sys.executable, "-m", "torch.distributed.run"]


def run_demo(procs: int, causal: bool, args) -> dict:
    """One demo launch on ``procs`` ranks; its JSON summary."""
    command = launcher() + [
        "--standalone", f"--nproc_per_node={procs}", "-m", "selfattn.distributed.demo", "--json",
        "--seq-len", str(args.seq_len), "--heads", str(args.heads), "--head-dim", str(args.head_dim),
        "--dtype", args.dtype, "--timeout", str(args.timeout),
    ] + (["--causal"] if causal else []) + (["--no-check"] if args.no_check else [])
    command += ["--threads", str(args.threads)] if args.threads else []
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout + 60)
    if done.returncode != 0:
        sys.exit(f"P={procs} {'causal' if causal else 'no mask'} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(rows: list[dict]) -> list[str]:
    lines = ["| mask | P | threads/rank | positions/rank | forward s | fwd+bwd s | max peak MB/rank "
             "| K/V sent MB/rank | max abs diff |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lengths = sorted(set(r["lengths"]))
        positions = str(lengths[0]) if len(lengths) == 1 else f"{lengths[0]}-{lengths[-1]}"
        peak = "n/a" if r["max_peak_bytes"] is None else f"{r['max_peak_bytes'] / 2**20:.0f}"
        sent = max(rank["sent_bytes"]["fwd_bwd"] for rank in r["ranks"]) / 2**20
        diff = "not checked" if r["max_diff"] is None else f"{max(r['max_diff'].values()):.1e}"
        lines.append(f"| {'causal' if r['causal'] else 'none'} | {r['world_size']} | {r['threads_per_rank']} "
                     f"| {positions} | {r['forward_s']:.2f} | {r['fwd_bwd_s']:.2f} | {peak} | {sent:.0f} | {diff} |")
    return lines


def loadavg() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4])
    parser.add_argument("--seq-len", type=int, default=16384)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--masks", type=lambda s: s.split(","), default=["none", "causal"], help="none,causal")
    parser.add_argument("--causal", action="store_true", help="= --masks causal")
    parser.add_argument("--no-check", action="store_true", help="skip the single-process reference")
    parser.add_argument("--threads", type=int, default=None, help="threads per rank (default: CPUs // P, at least 1)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per launch")
    parser.add_argument("--markdown", metavar="PATH")
    args = parser.parse_args()
    masks = ["causal"] if args.causal else args.masks
    if not set(masks) <= {"none", "causal"}:
        parser.error("--masks takes none and/or causal")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be at least 1")
    if any(p < 1 for p in args.procs) or args.seq_len < max(args.procs):
        parser.error("--procs must be positive and --seq-len at least the largest of them")
    if args.markdown and not os.path.isdir(os.path.dirname(os.path.abspath(args.markdown))):
        parser.error(f"no folder for {args.markdown}")
    started, load_before = time.time(), loadavg()
    rows = []
    for mask in masks:
        for procs in args.procs:
            rows.append(run_demo(procs, mask == "causal", args))
            print(f"  {time.time() - started:5.0f} s: P={procs} {mask}", file=sys.stderr, flush=True)
    settings = (f"N = {args.seq_len}, batch 1, {args.heads} heads, head dim {args.head_dim}, {args.dtype}, "
                f"zigzag shards, {rows[0]['backend']} on {rows[0]['device']}")
    notes = [
        machine_line(),
        settings,
        f"{os.cpu_count()} CPUs shared by the P ranks (threads/rank: " + (f"{args.threads}, --threads" if args.threads
        else "CPUs // P, at least 1") + "): time is the same cores split P ways, not P machines",
        f"load average {load_before} at start, {loadavg()} at end; run took {(time.time() - started) / 60:.1f} min",
        "peak MB: largest per-rank peak memory of forward + backward above its shards; K/V sent: forward + backward, "
        "including dK/dV; max abs diff: output, dQ, dK, dV against torch SDPA in one process",
    ]
    lines = table(rows)
    print("\n".join(notes + [""] + lines))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("# Ring attention on one machine\n\nWritten by `bench/ring.py`; rerun with\n\n"
                    f"    .venv/bin/python bench/ring.py {' '.join(sys.argv[1:])}\n\n"
                    + "  \n".join(notes) + "\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
